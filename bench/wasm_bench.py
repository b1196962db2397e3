"""The Wasmtime executors through the daemon, beside the peer: wasm-python and wasm-js.

Each series alternates with the peer (`bench/peer.py`): a block of Conduit's
executions, one run of the peer's, and again. The machine's speed drifts by 1.5x
within seconds (measured: the peer's JavaScript run took 660 ms and 886 ms a few
seconds apart), so a ratio of two series taken minutes apart measured the moments as
much as the two tools. Paired this way, each tool's median comes from the same moments.

When wasm-js is not available, or its first execution fails, its figure is skipped
with the reason instead of failing the run (the peer's runs still happen).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio

from bench import peer
from bench.client import Client, RpcError
from bench.conduit_daemon import executors, unavailable_reason
from bench.latency import check_result, execute_samples
from bench.programs import PYTHON_REQUEST, WASM_JS_REQUEST
from bench.stats import Figures, percentiles

# Untimed executions first: a fresh daemon's first ~100 Wasmtime executions run ~20%
# slower (measured: p50 3.3 ms, then 2.6 ms), and a daemon in service is past them.
WARMUP = 100
# Untimed executions at the start of each later block: the peer has just run on both
# cores, and the first executions after it meet caches it evicted. Measured on wasm-js
# (10 peer runs, each followed by 600 executions): p50 1.38 ms over the first 10, 1.09
# to 1.17 ms up to the 40th, then 1.03 to 1.06 ms to the 600th. Ten untimed ones, as
# before, left a quarter of each timed block inside that shadow.
BLOCK_WARMUP = 40
LANGUAGES = ("python", "javascript")


class PeerRuns:
    """The peer's side of the pairing: its runs, taken one at a time, or why there are
    none (it could not be installed, started, or a run failed)."""

    def __init__(self, session: peer.PeerSession | None, skipped: str | None) -> None:
        self._session = session
        self.skipped = skipped
        self.samples: dict[str, list[float]] = {language: [] for language in LANGUAGES}
        # The p50 (ms) of each block of Conduit's executions, in order: block k ran just
        # before the peer's run k, so the two lists pair up.
        self.blocks_p50_ms: dict[str, list[float]] = {language: [] for language in LANGUAGES}

    async def run(self, language: str, *, timed: bool = True) -> None:
        if self._session is None:
            return
        try:
            seconds = await trio.to_thread.run_sync(self._session.run, language)
        except peer.PeerUnavailable as exc:
            self._session, self.skipped = None, str(exc)
            return
        if timed:
            self.samples[language].append(seconds)

    def figures(self) -> dict[str, Any]:
        """{"name", "version", "python": figures, "javascript": figures}, or
        {"name", "version", "skipped": why}."""
        described = {"name": peer.NAME, "version": peer.VERSION}
        if self.skipped is not None:
            return {**described, "skipped": self.skipped}
        return {**described, **{lang: self._language_figures(lang) for lang in LANGUAGES}}

    def _language_figures(self, language: str) -> dict[str, Any]:
        """The peer's percentiles, its runs (ms) in order, and Conduit's block before
        each (p50, ms; absent when Conduit's side was skipped)."""
        runs = self.samples[language]
        paired: dict[str, Any] = {"runs_ms": [round(s * 1000, 2) for s in runs]}
        if len(self.blocks_p50_ms[language]) == len(runs):
            paired["conduit_blocks_p50_ms"] = self.blocks_p50_ms[language]
        return {**percentiles(runs), **paired}


@contextlib.asynccontextmanager
async def peer_runs(workdir: Path) -> AsyncIterator[PeerRuns]:
    """The peer's worker for the block (made and installed first if need be)."""
    with contextlib.ExitStack() as stack:
        try:
            session = await trio.to_thread.run_sync(stack.enter_context, peer.session(workdir))
        except peer.PeerUnavailable as exc:
            yield PeerRuns(None, str(exc))
        else:
            yield PeerRuns(session, None)


async def python_latency(path: str, runs: int, beside: PeerRuns, blocks: int) -> Figures:
    reason = unavailable_reason(await executors(path), "wasm-python")
    if reason is not None:
        raise RuntimeError(f"wasm-python is unavailable, nothing to measure: {reason}")
    return percentiles(await _paired(path, PYTHON_REQUEST, runs, beside, "python", blocks))


async def wasm_js_latency(path: str, runs: int, beside: PeerRuns, blocks: int) -> dict[str, Any]:
    """{"figures": ...} or {"skipped": why}."""
    reason = unavailable_reason(await executors(path), "wasm-js")
    if reason is None:
        reason = await _probe(path, WASM_JS_REQUEST)
    if reason is not None:
        await _paired(path, None, runs, beside, "javascript", blocks)
        return {"skipped": reason}
    samples = await _paired(path, WASM_JS_REQUEST, runs, beside, "javascript", blocks)
    return {"figures": percentiles(samples)}


async def _paired(
    path: str,
    params: dict[str, Any] | None,
    runs: int,
    beside: PeerRuns,
    language: str,
    blocks: int,
) -> list[float]:
    """The samples of `runs` timed executions of `params` in `blocks` blocks, with one
    peer run of `language` after each (and an untimed one first). No `params`: the
    peer's runs only."""
    await beside.run(language, timed=False)  # its first run pays for cold disk caches
    samples: list[float] = []
    for block in range(blocks):
        if params is not None:
            count = runs // blocks + (block < runs % blocks)
            warmup = WARMUP if block == 0 else BLOCK_WARMUP
            timed = await execute_samples(path, params, count, warmup=warmup)
            if timed:  # none when the series' time budget ran out
                beside.blocks_p50_ms[language].append(round(percentiles(timed)["p50_ms"], 3))
            samples += timed
        await beside.run(language)
    return samples


async def _probe(path: str, params: dict[str, Any]) -> str | None:
    """Why one execution of `params` does not give the expected result, or None."""
    client = await Client.open(path)
    try:
        check_result(await client.call("execute", params))
    except (RpcError, AssertionError) as exc:
        return f"available, but the trivial program failed: {exc}"
    finally:
        await client.aclose()
    return None
