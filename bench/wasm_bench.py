"""The Wasmtime executors through the daemon: wasm-python, and wasm-js when it exists.

wasm-js is being written: when `executors/list` does not offer it, or its first
execution fails, its figure is skipped with the reason instead of failing the run.
"""

from __future__ import annotations

from typing import Any

from bench.client import Client, RpcError
from bench.conduit_daemon import executors, unavailable_reason
from bench.latency import check_result, execute_latency
from bench.programs import PYTHON_REQUEST, WASM_JS_REQUEST
from bench.stats import Figures

# Untimed executions first: a fresh daemon's first ~100 Wasmtime executions run ~20%
# slower (measured: p50 3.3 ms, then 2.6 ms), and a daemon in service is past them.
WARMUP = 100


async def python_latency(path: str, runs: int) -> Figures:
    reason = unavailable_reason(await executors(path), "wasm-python")
    if reason is not None:
        raise RuntimeError(f"wasm-python is unavailable, nothing to measure: {reason}")
    return await execute_latency(path, PYTHON_REQUEST, runs, warmup=WARMUP)


async def wasm_js_latency(path: str, runs: int) -> dict[str, Any]:
    """{"figures": ...} or {"skipped": why}."""
    reason = unavailable_reason(await executors(path), "wasm-js")
    if reason is None:
        reason = await _probe(path, WASM_JS_REQUEST)
    if reason is not None:
        return {"skipped": reason}
    return {"figures": await execute_latency(path, WASM_JS_REQUEST, runs, warmup=WARMUP)}


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
