"""Programs waiting on a tool, a sleep or a timer hold no CPU slot (issue 23, 8 and 9).

Sixteen programs that each wait a second all finish within their own timeout, on every
executor where a program can wait; held to a bound that only overlapping waits can
meet (sixteen one-second waits two at a time take eight seconds). Programs that only
compute still queue for the slots, and their wait shows as `queue_ms`.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from conduit.executors.wasm import CONCURRENT_EXECUTIONS
from tests.e2e.test_tools import tooled  # noqa: F401 (a fixture)

PROGRAMS = 16
WAIT_S = 1
# The program's own time: its one-second wait and a little work (the figure).
TIMEOUT_MS = 2000
# Sixteen one-second waits, at most two at a time, as before: 8 s.
OVERLAPPED_WITHIN_S = PROGRAMS * WAIT_S / 2

WAITING = [
    pytest.param("wasm-python", "python", 'tools.echo.slow(seconds=1)\n"done"', 1, id="py-tool"),
    pytest.param("wasm-python", "python", 'import time\ntime.sleep(1)\n"done"', 0, id="py-sleep"),
    pytest.param(
        "wasm-js", "javascript", 'await tools.echo.slow({ seconds: 1 });\n"done"', 1, id="js-tool"
    ),
    pytest.param(
        "wasm-js",
        "javascript",
        'await new Promise((resolve) => setTimeout(resolve, 1000));\n"done"',
        0,
        id="js-timer",
    ),
    pytest.param(
        "deno", "typescript", 'await tools.echo.slow({ seconds: 1 });\n"done"', 1, id="deno-tool"
    ),
]


async def run_at_once(
    connect: Any, info: Any, count: int, request: dict[str, Any]
) -> list[dict[str, Any]]:
    """`count` executions of `request` at once, each on a connection of its own."""
    results: list[dict[str, Any]] = []

    async def one() -> None:
        client = await connect(info)
        results.append(await client.call("execute", request))

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)
    return results


@pytest.mark.parametrize(("executor", "language", "code", "tool_calls"), WAITING)
async def test_sixteen_waiting_programs_all_finish_within_their_timeout(
    tooled: Any,  # noqa: F811
    connect: Any,
    executor: str,
    language: str,
    code: str,
    tool_calls: int,
) -> None:
    _, info, client = await tooled(limits={"max_concurrent_executions": PROGRAMS})
    request = {
        "language": language,
        "executor": executor,
        "code": code,
        "limits": {"timeout_ms": TIMEOUT_MS},
    }
    warm = await client.call("execute", request)  # the upstream, and the executor, warm
    assert warm["status"] == "ok", warm
    began = trio.current_time()
    results = await run_at_once(connect, info, PROGRAMS, request)
    took_s = trio.current_time() - began
    assert [r["status"] for r in results] == ["ok"] * PROGRAMS, [
        (r["status"], r["error"], r["queue_ms"]) for r in results if r["status"] != "ok"
    ]
    assert {(r["result"], r["tool_calls"], r["executor"]) for r in results} == {
        ("done", tool_calls, executor)
    }
    # Each one's own time held its whole wait, and stayed within its timeout.
    assert all(WAIT_S * 1000 <= r["duration_ms"] <= TIMEOUT_MS for r in results), [
        r["duration_ms"] for r in results
    ]
    assert took_s < OVERLAPPED_WITHIN_S


@pytest.mark.parametrize("executor", ["wasm-python", "wasm-js"])
async def test_programs_that_compute_still_queue_for_the_cpu_slots(
    tooled: Any,  # noqa: F811
    connect: Any,
    executor: str,
) -> None:
    _, info, _ = await tooled(limits={"max_concurrent_executions": PROGRAMS})
    # Half a second of computing by the program's own clock (which stands still while
    # it queues), whatever else the machine is doing.
    code = {
        "wasm-python": "import time\nend = time.monotonic() + 0.5\n"
        "while time.monotonic() < end: pass\n'spun'",
        "wasm-js": "const end = performance.now() + 500;\n"
        "while (performance.now() < end) {}\n'spun'",
    }[executor]
    language = "python" if executor == "wasm-python" else "javascript"
    request = {"language": language, "executor": executor, "code": code}
    results = await run_at_once(connect, info, CONCURRENT_EXECUTIONS + 1, request)
    assert {(r["status"], r["result"]) for r in results} == {("ok", "spun")}, results
    # One more than there are slots: somebody waited for one.
    assert max(r["queue_ms"] for r in results) > 0


async def test_a_tool_call_past_the_timeout_is_stopped_and_leaves_nothing_behind(
    tooled: Any,  # noqa: F811
) -> None:
    server, _, client = await tooled()
    code = "print('asked')\ntools.echo.slow(seconds=30)\n'never'"
    request = {"language": "python", "executor": "wasm-python", "code": code}
    result = await client.call("execute", {**request, "limits": {"timeout_ms": 500}})
    assert result["status"] == "timeout", result
    assert result["stdout"] == "asked\n"
    assert result["duration_ms"] < 30_000
    # The call in flight was cancelled: the guest came back at once, and its runner
    # with it, rather than lingering until the tool answered.
    pool = next(i for i in server.registry.infos() if i.name == "wasm-python").pool
    assert pool["lingering_threads"] == 0
    done = await client.call("execute", {**request, "code": "6 * 7"})
    assert (done["status"], done["result"]) == ("ok", 42)
