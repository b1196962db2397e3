"""What agents do, in a daemon of its own with every executor on: a request after the
daemon sat idle (`bench/idle.py`), sixteen programs waiting on a tool at once
(`bench/tool_waits.py`), the realistic program (`bench/realistic.py`), bulk output and a
large result (`bench/bulk.py`), and sessions
(`bench/sessions.py`).

The daemon has a Deno pool of 2, a pyodide pool of 2 and
`limits.max_concurrent_executions` 16. Idle latency comes first, while nothing else
has run in it; each later run starts once nothing runs and the pools are full. An
executor that is not available is skipped with the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from bench import bulk, idle, realistic, sessions, tool_waits
from bench.client import Client
from bench.conduit_daemon import (
    daemon,
    executors,
    unavailable_reason,
    wait_executors,
    wait_upstream,
)
from bench.latency import wait_pool_full
from bench.pyodide_bench import wait_pyodide

EXECUTORS = ("deno", "wasm-python", "wasm-js", "pyodide")
POOLS = {"deno": 2, "pyodide": 2}
MAX_CONCURRENT = 16
# How long the daemon may take to finish what a cancelled run left in flight.
SETTLE_TIMEOUT_S = 60


async def figures(workdir: Path, n: dict[str, int]) -> dict[str, Any]:
    async with daemon(
        workdir,
        "agent",
        pool_size=POOLS["deno"],
        pyodide_pool=POOLS["pyodide"],
        max_concurrent=MAX_CONCURRENT,
    ) as path:
        await wait_upstream(path)
        await wait_executors(path)
        await wait_pyodide(path, POOLS["pyodide"])
        infos = await executors(path)
        reasons = {name: unavailable_reason(infos, name) for name in EXECUTORS}
        pools = {name: POOLS.get(name, 0) for name, why in reasons.items() if why is None}
        results: dict[str, Any] = {
            "skipped": {name: why for name, why in reasons.items() if why is not None},
            "max_concurrent_executions": MAX_CONCURRENT,
        }
        await settle(path, pools)
        results["idle"] = await idle.figures(path, idle.targets(pools), n["idle_rounds"], workdir)
        results["tool_waits"] = {}
        for name in pools:
            await settle(path, pools)
            results["tool_waits"][name] = await tool_waits.figures(path, name)
        results["realistic"] = {}
        for name, pool in pools.items():
            await settle(path, pools)
            results["realistic"][name] = await realistic.figures(
                path, name, pool, n["realistic"], n["throughput_s"]
            )
        results["bulk"] = {}
        for name, pool in pools.items():
            await settle(path, pools)
            results["bulk"][name] = await bulk.figures(path, name, pool, n["bulk"])
        await settle(path, pools)
        results["sessions"] = await sessions.figures(
            path, pools, n["session_steps"], n["file_runs"], workdir
        )
    return results


async def settle(path: str, pools: dict[str, int]) -> None:
    """Until no execution runs and every pool is full (at most SETTLE_TIMEOUT_S)."""
    client = await Client.open(path)
    try:
        with trio.move_on_after(SETTLE_TIMEOUT_S):
            while (await client.call("daemon/status"))["executions"]["running"]:
                await trio.sleep(0.05)
            for name, size in pools.items():
                if size:
                    await wait_pool_full(client, size, name, within_s=SETTLE_TIMEOUT_S)
    finally:
        await client.aclose()
