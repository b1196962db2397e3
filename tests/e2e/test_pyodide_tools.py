"""Python on Pyodide through a real daemon: the same source as on wasm-python calling
real MCP upstreams, and how its time is counted.

Slow: the daemon's Pyodide workers load Pyodide (seconds each), so the tests share one
daemon, served in a thread of its own; each talks to it on connections of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.daemon.server import ServingInfo
from tests.conftest import WAIT_S, link_wasm_cache
from tests.e2e.helpers import daemon_in_a_thread
from tests.e2e.test_tools import ECHO, PYTHON_TOOLS_PROGRAM, TIME
from tests.served import Served

pytestmark = pytest.mark.slow


def share_install(state_dir: Path, install: Path) -> None:
    """Give the daemon the session's Pyodide install instead of installing again."""
    target = state_dir / "pyodide"
    target.mkdir(parents=True, exist_ok=True)
    for installed in install.glob("pyodide-npm-*"):
        (target / installed.name).symlink_to(installed, target_is_directory=True)
    for snapshot in install.glob("snapshot-*.bin"):
        (target / snapshot.name).symlink_to(snapshot)


@pytest.fixture(scope="module")
def shared(
    tmp_path_factory: pytest.TempPathFactory, wasm_cache: Path, pyodide_install: Path
) -> Iterator[Served[ServingInfo]]:
    """A daemon with the echo and time upstreams and one Pyodide worker process, as the
    `start_daemon` fixture makes them; what it serves is where it listens."""
    state = tmp_path_factory.mktemp("pyodide-tools") / "state"
    link_wasm_cache(state, wasm_cache)
    share_install(state, pyodide_install)
    settings = {
        "executors.deno.pool_size": 1,
        "executors.pyodide": {"enabled": True, "pool_size": 1},
        "upstreams": [ECHO, TIME],
    }
    with daemon_in_a_thread(state, settings, upstreams=("echo", "time")) as served:
        yield served


async def test_the_same_python_source_runs_unchanged_on_pyodide(
    shared: Served[ServingInfo], connect: Any
) -> None:
    client = await connect(shared.value)
    on_wasm = await client.call("execute", {"language": "python", "code": PYTHON_TOOLS_PROGRAM})
    on_pyodide = await client.call(
        "execute", {"language": "python", "executor": "pyodide", "code": PYTHON_TOOLS_PROGRAM}
    )
    assert on_wasm["status"] == "ok", on_wasm
    assert on_pyodide["status"] == "ok", on_pyodide["error"]
    assert on_pyodide["executor"] == "pyodide"
    assert on_pyodide["result"] == on_wasm["result"]
    assert on_pyodide["tool_calls"] == on_wasm["tool_calls"] == 3
    # Top-level await beside synchronous tool calls, and the allowlist binds here too.
    code = (
        "import asyncio\nawait asyncio.sleep(0)\n"
        "try:\n    tools.time.get_current_time(timezone='UTC')\n"
        "except ToolError as e:\n    return e.code"
    )
    limited = await client.call(
        "execute",
        {"language": "python", "executor": "pyodide", "code": code, "allowed_tools": ["echo.*"]},
    )
    assert limited["result"] == -32003, limited


async def test_a_call_longer_than_the_daemon_reads_fails_at_once(
    shared: Served[ServingInfo], connect: Any
) -> None:
    """Over `server.max_message_bytes` (8 MiB) a call is refused by the worker itself,
    not left waiting for a reply that would name no call."""
    client = await connect(shared.value)
    code = (
        "try:\n    tools.echo.echo(text='x' * (9 * 1024 * 1024))\n"
        "except ToolError as e:\n    return [e.code, 'server.max_message_bytes' in str(e)]"
    )
    request = {"language": "python", "executor": "pyodide", "code": code}
    outcome = await client.call("execute", {**request, "limits": {"timeout_ms": 20_000}})
    assert (outcome["status"], outcome["result"]) == ("ok", [-32600, True]), outcome


async def test_numbers_reach_the_tool_and_come_back_as_python_wrote_them(
    shared: Served[ServingInfo], connect: Any
) -> None:
    """The worker relays Python's JSON through JavaScript, whose numbers would round
    them (9007199254740993 became ...992) or rewrite them (1.0 became 1, 2.0**60
    1152921504606847000), as CPython on wasm-python does not."""
    client = await connect(shared.value)
    code = (
        "[tools.echo.add(a=2**53, b=1), tools.echo.echo(text=-(10**20) - 1)]"
        " + [repr(tools.echo.echo(text=v)) for v in (1.0, -0.0, 1e20, 2.0**60)]"
    )
    expected = [{"sum": 2**53 + 1}, -(10**20) - 1, "1.0", "-0.0", "1e+20", "1.152921504606847e+18"]
    for executor in ("pyodide", "wasm-python"):
        request = {"language": "python", "executor": executor, "code": code}
        outcome = await client.call("execute", request)
        assert (outcome["status"], outcome["result"]) == ("ok", expected), (executor, outcome)


async def pyodide_in_use(client: Any) -> int:
    """How many of the daemon's Pyodide processes run a program now."""
    listed = await client.call("executors/list")
    return next(e for e in listed["executors"] if e["name"] == "pyodide")["pool"]["in_use"]


async def test_timeout_counts_the_programs_own_run(
    shared: Served[ServingInfo], connect: Any
) -> None:
    """Waiting for an interpreter is `queue_ms`; `timeout_ms` bounds the program's own
    run, and no result is ok past it."""
    client, other = await connect(shared.value), await connect(shared.value)
    sleeper = {"language": "python", "executor": "pyodide", "limits": {"timeout_ms": 30_000}}
    quick = {"language": "python", "executor": "pyodide", "limits": {"timeout_ms": 1000}}
    results: dict[str, Any] = {}

    async def execute(name: str, on: Any, params: dict[str, Any]) -> None:
        results[name] = await on.call("execute", params)

    await execute("warm", client, {**quick, "code": "1"})  # the first interpreter is ready
    async with trio.open_nursery() as nursery:
        code = "import time\ntime.sleep(1.5)"
        nursery.start_soon(execute, "sleeper", client, {**sleeper, "code": code})
        with trio.fail_after(WAIT_S):
            while not await pyodide_in_use(other):
                await trio.sleep(0.01)  # until the sleeper holds the one interpreter
        nursery.start_soon(execute, "quick", other, {**quick, "code": "'quick'"})
    late = await client.call("execute", {**quick, "code": "import time\ntime.sleep(3)"})
    assert (results["quick"]["status"], results["quick"]["result"]) == ("ok", "quick")
    assert results["quick"]["queue_ms"] > 50, results["quick"]
    assert late["status"] == "timeout", late
    for result in (*results.values(), late):
        if result["status"] == "ok":
            assert result["duration_ms"] <= 1000 or result is results["sleeper"], result
