"""Latency percentiles, in the shape every figure in the report and the JSON uses."""

from __future__ import annotations

import statistics

Figures = dict[str, float]


def percentiles(samples_s: list[float]) -> Figures:
    """n, p50, p99 and mean in milliseconds, from samples in seconds (nearest rank)."""
    ordered = sorted(samples_s)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return {
        "n": len(ordered),
        "p50_ms": pick(0.50),
        "p99_ms": pick(0.99),
        "mean_ms": statistics.fmean(ordered) * 1000,
    }
