"""The realistic program (`bench/programs.py`) on every executor: sequential latency,
each execution starting once its executor's pool is full (as an agent's requests,
seconds apart, find it), and executions/s with 8 clients.

Every result is checked against the same work done here: the count of entries and
errors, and the five busiest paths the program echoed through the upstream.
"""

from __future__ import annotations

import functools
from typing import Any

from bench.latency import execute_latency
from bench.programs import realistic_expected, realistic_inputs, realistic_request
from bench.throughput import execute_throughput

CLIENTS = 8
# Untimed executions first: each executor's first run of the program imports what a
# trivial one does not.
WARMUP = 3


def check(expected: dict[str, Any], result: dict[str, Any]) -> None:
    value = result.get("result") or {}
    seen = {
        "entries": value.get("entries"),
        "errors": value.get("errors"),
        "top": value.get("top_paths"),
    }
    if result.get("status") != "ok" or seen != expected:
        raise AssertionError(f"unexpected result of the realistic program: {result}")


async def figures(
    path: str, executor: str, pool: int, runs: int, throughput_s: float
) -> dict[str, Any]:
    """Latency (paced by `pool`, the executor's warm pool size, 0 for none) and
    executions/s with CLIENTS clients, of the realistic program on `executor`."""
    request = realistic_request(executor)
    checked = functools.partial(check, realistic_expected(realistic_inputs()))
    latency = await execute_latency(
        path, request, runs, warm_pool=pool, pool_of=executor, warmup=WARMUP, check=checked
    )
    per_s = await execute_throughput(path, request, CLIENTS, throughput_s)
    return {"latency": latency, "per_s": per_s}
