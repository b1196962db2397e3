"""Python on Pyodide through a real daemon: the same source as on wasm-python calling
real MCP upstreams, and how its time is counted.

Slow: the daemon's Pyodide workers load Pyodide (seconds each).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from tests.e2e.helpers import wait_upstreams
from tests.e2e.test_tools import ECHO, PYTHON_TOOLS_PROGRAM, TIME

pytestmark = pytest.mark.slow


def share_install(state_dir: Path, install: Path) -> None:
    """Give the daemon the session's Pyodide install instead of installing again."""
    target = state_dir / "pyodide"
    target.mkdir(parents=True, exist_ok=True)
    for installed in install.glob("pyodide-npm-*"):
        (target / installed.name).symlink_to(installed, target_is_directory=True)
    for snapshot in install.glob("snapshot-*.bin"):
        (target / snapshot.name).symlink_to(snapshot)


async def test_the_same_python_source_runs_unchanged_on_pyodide(
    start_daemon: Any, connect: Any, tmp_path: Path, pyodide_install: Path
) -> None:
    share_install(tmp_path / "state", pyodide_install)
    server, info = await start_daemon(
        upstreams=[ECHO, TIME], executors={"pyodide": {"enabled": True, "pool_size": 1}}
    )
    await wait_upstreams(server, "echo", "time")
    client = await connect(info)
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


async def test_timeout_counts_the_programs_own_run(
    start_daemon: Any, connect: Any, tmp_path: Path, pyodide_install: Path
) -> None:
    """Waiting for an interpreter is `queue_ms`; `timeout_ms` bounds the program's own
    run, and no result is ok past it."""
    share_install(tmp_path / "state", pyodide_install)
    _, info = await start_daemon(executors={"pyodide": {"enabled": True, "pool_size": 1}})
    client, other = await connect(info), await connect(info)
    sleeper = {"language": "python", "executor": "pyodide", "limits": {"timeout_ms": 30_000}}
    quick = {"language": "python", "executor": "pyodide", "limits": {"timeout_ms": 1000}}
    results: dict[str, Any] = {}

    async def execute(name: str, on: Any, params: dict[str, Any]) -> None:
        results[name] = await on.call("execute", params)

    await execute("warm", client, {**quick, "code": "1"})  # the first interpreter is ready
    async with trio.open_nursery() as nursery:
        code = "import time\ntime.sleep(1.5)"
        nursery.start_soon(execute, "sleeper", client, {**sleeper, "code": code})
        await trio.sleep(0.3)  # the sleeper holds the one interpreter
        nursery.start_soon(execute, "quick", other, {**quick, "code": "'quick'"})
    late = await client.call("execute", {**quick, "code": "import time\ntime.sleep(3)"})
    assert (results["quick"]["status"], results["quick"]["result"]) == ("ok", "quick")
    assert results["quick"]["queue_ms"] > 50, results["quick"]
    assert late["status"] == "timeout", late
    for result in (*results.values(), late):
        if result["status"] == "ok":
            assert result["duration_ms"] <= 1000 or result is results["sleeper"], result
