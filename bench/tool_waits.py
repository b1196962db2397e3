"""Sixteen programs at once, each waiting a second on a tool: do they overlap?

Each executor gets PROGRAMS concurrent executions, each on a connection of its own,
of a program making one call to the echo upstream's `slow` tool (1 s) under
`timeout_ms: 2000`, with the daemon's `limits.max_concurrent_executions` at least
PROGRAMS. Waiting programs hold no CPU slot, so all should come back `ok` in about a
second and a half; programs that held one would take PROGRAMS seconds over the slots.
"""

from __future__ import annotations

import time
from typing import Any

import trio

from bench.client import Client, RpcError

PROGRAMS = 16
WAIT_S = 1
TIMEOUT_MS = 2000
# Past this, the run is reported as it stands (it would take 16 s one at a time).
RUN_BUDGET_S = 60
CODE = {
    "python": f"tools.echo.slow(seconds={WAIT_S})\n'done'",
    "javascript": f"await tools.echo.slow({{ seconds: {WAIT_S} }});\n'done'",
    "typescript": f"await tools.echo.slow({{ seconds: {WAIT_S} }});\n'done'",
}
LANGUAGE = {"deno": "typescript", "wasm-js": "javascript", "wasm-python": "python"}


def request(executor: str) -> dict[str, Any]:
    language = LANGUAGE.get(executor, "python")
    return {
        "language": language,
        "executor": executor,
        "code": CODE[language],
        "limits": {"timeout_ms": TIMEOUT_MS},
    }


async def figures(path: str, executor: str) -> dict[str, Any]:
    """Wall time of the whole run, how many came back `ok`, and the others' statuses."""
    params = request(executor)
    client = await Client.open(path)
    try:
        await client.call("execute", params)  # the upstream and the executor warm
    finally:
        await client.aclose()
    results: list[str] = []

    async def one() -> None:
        connection = await Client.open(path)
        try:
            result = await connection.call("execute", params)
            results.append(result["status"])
        except RpcError as exc:
            results.append(f"error {exc.code}")
        finally:
            await connection.aclose()

    started = time.perf_counter()
    with trio.move_on_after(RUN_BUDGET_S):
        async with trio.open_nursery() as nursery:
            for _ in range(PROGRAMS):
                nursery.start_soon(one)
    wall_s = time.perf_counter() - started
    others = sorted(status for status in results if status != "ok")
    return {
        "programs": PROGRAMS,
        "ok": results.count("ok"),
        "not_ok": others,
        "unfinished": PROGRAMS - len(results),
        "wall_s": round(wall_s, 3),
    }
