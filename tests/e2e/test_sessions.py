"""Sessions through a real daemon on every executor (issue 25, 1 to 4 and 11): state kept
from one step to the next, resets, isolation, ownership, MCP's named sessions, idle
expiry a program cannot hold off, and a principal asking for a thousand.

One daemon with every executor on (one Pyodide worker) serves the module, in a thread
of its own; each test talks to it on connections of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.core.errors import InvalidParams, NotFound, Overloaded
from conduit.daemon.auth import hash_token, new_token
from conduit.daemon.server import ServingInfo
from tests.conftest import WAIT_S, RawClient, link_wasm_cache
from tests.e2e.helpers import daemon_in_a_thread
from tests.e2e.test_pyodide_tools import share_install
from tests.served import Served

PER_PRINCIPAL = 4
BOB_TOKEN = new_token()
BOB = {"name": "bob", "sha256": hash_token(BOB_TOKEN), "scopes": ["execute", "executions"]}

PYTHON_STEPS = (
    "import math\nx = 1\ndef bump(n):\n    return x + n\n",
    "x += 1\nbump(math.floor(1.5))",
)
# What each executor runs: (language, first step, second step); the second step's result
# is 3 only if the first step's variable, function and import are all still there.
STEPS = {
    "wasm-python": ("python", *PYTHON_STEPS),
    "pyodide": ("python", *PYTHON_STEPS),
    "wasm-js": (
        "javascript",
        "let x = 1;\nfunction bump(n) { return x + n; }\n",
        "x += 1;\nbump(Math.floor(1.5))",
    ),
    "deno": (
        "typescript",
        'import * as path from "node:path";\nlet x: number = 1;\n'
        "const bump = (n: number): number => x + n;\n",
        'x += 1;\nbump(path.basename("/a/b").length)',
    ),
}
EXECUTORS = list(STEPS)
# Whether `x` is defined, as each language asks without failing.
DEFINED = {"python": "'x' in globals()", "javascript": "typeof x !== 'undefined'"}
DEFINED["typescript"] = DEFINED["javascript"]
SPIN = {"python": "while True:\n    pass", "javascript": "while (true) {}"}
SPIN["typescript"] = SPIN["javascript"]


@pytest.fixture(scope="module")
def shared(
    tmp_path_factory: pytest.TempPathFactory, wasm_cache: Path, pyodide_install: Path
) -> Iterator[Served[ServingInfo]]:
    state = tmp_path_factory.mktemp("sessions") / "state"
    link_wasm_cache(state, wasm_cache)
    share_install(state, pyodide_install)
    settings = {
        "auth.clients": [BOB],
        "executors.deno.pool_size": 1,
        "executors.pyodide": {"enabled": True, "pool_size": 1},
        "sessions.max_per_principal": PER_PRINCIPAL,
    }
    with daemon_in_a_thread(state, settings) as served:
        yield served


async def create(client: RawClient, executor: str, **params: Any) -> str:
    language = STEPS[executor][0]
    params = {"language": language, "executor": executor, **params}
    return (await client.call("sessions/create", params))["session_id"]


async def step(client: RawClient, session_id: str, code: str, **limits: int) -> dict[str, Any]:
    params: dict[str, Any] = {"session_id": session_id, "code": code}
    if limits:
        params["limits"] = limits
    return await client.call("execute", params)


@pytest.mark.parametrize("executor", EXECUTORS)
async def test_what_a_step_defines_is_there_for_the_next(
    shared: Served[ServingInfo], connect: Any, executor: str
) -> None:
    client = await connect(shared.value)
    language, first, second = STEPS[executor]
    session_id = await create(client, executor)
    try:
        defined = await step(client, session_id, first)
        assert defined["status"] == "ok", defined
        used = await step(client, session_id, second)
        assert (used["status"], used["result"]) == ("ok", 3), used
        assert (used["session_id"], used["session_reset"], used["executor"]) == (
            session_id,
            False,
            executor,
        )
        again = await step(client, session_id, DEFINED[language])
        assert again["result"] is True
        # A fresh execution sees none of it.
        fresh = await client.call(
            "execute", {"language": language, "executor": executor, "code": DEFINED[language]}
        )
        assert (fresh["result"], fresh["session_id"]) == (False, None), fresh
    finally:
        await client.call("sessions/close", {"session_id": session_id})


@pytest.mark.parametrize("executor", EXECUTORS)
async def test_an_exception_keeps_the_session_and_a_timeout_says_whether_it_reset(
    shared: Served[ServingInfo], connect: Any, executor: str
) -> None:
    client = await connect(shared.value)
    language, first, _ = STEPS[executor]
    session_id = await create(client, executor)
    try:
        await step(client, session_id, first)
        failed = await step(client, session_id, "undefined_name_here")
        assert failed["status"] == "error" and not failed["session_reset"], failed
        assert (await step(client, session_id, DEFINED[language]))["result"] is True
        spun = await step(client, session_id, SPIN[language], timeout_ms=1000)
        assert spun["status"] == "timeout", spun
        after = await step(client, session_id, DEFINED[language])
        assert after["status"] == "ok", after
        # A reset sandbox has nothing of the earlier steps; one that survived has it all.
        assert after["result"] is (not spun["session_reset"])
        listed = await client.call("sessions/list")
        [mine] = [s for s in listed["sessions"] if s["session_id"] == session_id]
        assert mine["resets"] == int(spun["session_reset"])
    finally:
        await client.call("sessions/close", {"session_id": session_id})


@pytest.mark.parametrize("executor", ["wasm-python", "pyodide"])
async def test_a_python_traceback_shows_each_frames_own_step(
    shared: Served[ServingInfo], connect: Any, executor: str
) -> None:
    client = await connect(shared.value)
    session_id = await create(client, executor)
    try:
        await step(client, session_id, "def fail(n):\n    raise ValueError(f'bad {n}')\n")
        await step(client, session_id, "x = 1")
        failed = await step(client, session_id, "# the third step\nfail(3)")
        assert failed["status"] == "error", failed
        traceback = failed["error"]["traceback"]
        assert 'File "<step 3>", line 2, in <module>\n    fail(3)' in traceback, traceback
        assert 'File "<step 1>", line 2, in fail\n    raise ValueError' in traceback, traceback
    finally:
        await client.call("sessions/close", {"session_id": session_id})


@pytest.mark.parametrize("executor", ["wasm-python", "deno"])
async def test_sessions_do_not_see_each_other(
    shared: Served[ServingInfo], connect: Any, executor: str
) -> None:
    client = await connect(shared.value)
    language, first, _ = STEPS[executor]
    ours, theirs = await create(client, executor), await create(client, executor)
    try:
        await step(client, ours, first)
        assert (await step(client, theirs, DEFINED[language]))["result"] is False
        assert (await step(client, ours, DEFINED[language]))["result"] is True
    finally:
        for session_id in (ours, theirs):
            await client.call("sessions/close", {"session_id": session_id})


async def test_another_principal_finds_no_such_session(
    shared: Served[ServingInfo], connect: Any
) -> None:
    owner = await connect(shared.value)
    session_id = await create(owner, "wasm-python")
    bob = await connect(shared.value)
    await bob.call("auth/login", {"token": BOB_TOKEN})
    try:
        replies = [
            await bob.request("execute", {"session_id": session_id, "code": "1"}),
            await bob.request("sessions/close", {"session_id": session_id}),
            await bob.request("execute", {"session_id": "ses_0000000000000000", "code": "1"}),
        ]
        assert {r["error"]["code"] for r in replies} == {NotFound.code}
        assert len({r["error"]["message"] for r in replies}) == 1  # no hint that it exists
        assert (await bob.call("sessions/list"))["sessions"] == []
        assert (await step(owner, session_id, "41 + 1"))["result"] == 42
    finally:
        await owner.call("sessions/close", {"session_id": session_id})


async def test_a_step_asking_for_another_language_or_memory_is_refused(
    shared: Served[ServingInfo], connect: Any
) -> None:
    client = await connect(shared.value)
    session_id = await create(client, "wasm-python")
    try:
        other = {"session_id": session_id, "code": "1", "language": "javascript"}
        memory = {"session_id": session_id, "code": "1", "limits": {"memory_mb": 512}}
        for params in (other, memory):
            reply = await client.request("execute", params)
            assert reply["error"]["code"] == InvalidParams.code, reply
        assert (await step(client, session_id, "1"))["status"] == "ok"
    finally:
        await client.call("sessions/close", {"session_id": session_id})


async def test_a_thousand_sessions_asked_for_get_the_cap_and_the_daemon_serves_on(
    shared: Served[ServingInfo], connect: Any
) -> None:
    client = await connect(shared.value)
    made: list[str] = []
    refused = 0
    try:
        for _ in range(1000):
            reply = await client.request(
                "sessions/create", {"language": "python", "executor": "wasm-python"}
            )
            if "error" in reply:
                assert reply["error"]["code"] == Overloaded.code
                assert "max_per_principal" in reply["error"]["message"]
                refused += 1
            else:
                made.append(reply["result"]["session_id"])
        assert (len(made), refused) == (PER_PRINCIPAL, 1000 - PER_PRINCIPAL)
        assert (await step(client, made[0], "6 * 7"))["result"] == 42
        other = await connect(shared.value)
        assert (await other.call("execute", {"language": "python", "code": "1"}))["result"] == 1
    finally:
        for session_id in made:
            await client.call("sessions/close", {"session_id": session_id})


@pytest.mark.parametrize("executor", ["wasm-js", "deno"])
async def test_a_program_cannot_keep_its_session_past_the_idle_timeout(
    shared: Served[ServingInfo], connect: Any, executor: str
) -> None:
    client = await connect(shared.value)
    session_id = await create(client, executor, idle_timeout_s=1.0)
    kept_busy = "globalThis.ticks = 0;\nsetInterval(() => { globalThis.ticks += 1; }, 5);\n1"
    assert (await step(client, session_id, kept_busy))["status"] == "ok"
    with trio.fail_after(WAIT_S):
        while any(
            s["session_id"] == session_id for s in (await client.call("sessions/list"))["sessions"]
        ):
            await trio.sleep(0.2)
    reply = await client.request("execute", {"session_id": session_id, "code": "1"})
    assert reply["error"]["code"] == NotFound.code


async def test_an_mcp_connections_named_sessions_end_with_it(
    shared: Served[ServingInfo], connect: Any
) -> None:
    mcp = await connect(shared.value)

    async def call(code: str, **arguments: Any) -> dict[str, Any]:
        params = {"name": "execute_python", "arguments": {"code": code, **arguments}}
        return await mcp.call("tools/call", params)

    await call("y = 5", session="nb")
    kept = await call("y * 2", session="nb")
    assert kept["structuredContent"]["result"] == 10, kept
    other = await call("'y' in globals()", session="other")
    assert other["structuredContent"]["result"] is False
    fresh = await call("'y' in globals()")
    assert fresh["structuredContent"]["result"] is False
    watcher = await connect(shared.value)
    assert len((await watcher.call("sessions/list"))["sessions"]) == 2
    await mcp.aclose()
    with trio.fail_after(WAIT_S):
        while (await watcher.call("sessions/list"))["sessions"]:
            await trio.sleep(0.05)


async def test_the_execute_tools_tell_the_model_about_sessions(
    shared: Served[ServingInfo], connect: Any
) -> None:
    client = await connect(shared.value)
    tools = {t["name"]: t for t in (await client.call("tools/list"))["tools"]}
    for name in ("execute_python", "execute_typescript", "execute_javascript"):
        assert "session" in tools[name]["inputSchema"]["properties"]
        assert "session" in tools[name]["description"]


async def test_two_mcp_calls_naming_a_new_session_at_once_open_one(
    shared: Served[ServingInfo], connect: Any
) -> None:
    mcp = await connect(shared.value)
    params = {"name": "execute_python", "arguments": {"code": "1", "session": "raced"}}
    for ident in range(3):  # pipelined: the daemon handles them at once
        await mcp.send({"jsonrpc": "2.0", "id": ident, "method": "tools/call", "params": params})
    replies = [await mcp.recv() for _ in range(3)]
    assert all(r["result"]["structuredContent"]["status"] == "ok" for r in replies), replies
    watcher = await connect(shared.value)
    assert len((await watcher.call("sessions/list"))["sessions"]) == 1
    await mcp.aclose()
    with trio.fail_after(WAIT_S):
        while (await watcher.call("sessions/list"))["sessions"]:
            await trio.sleep(0.05)
