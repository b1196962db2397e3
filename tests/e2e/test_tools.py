"""Code mode end to end: programs in real Deno sandboxes calling real MCP upstreams."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.core.errors import Forbidden, InvalidParams, NotFound, Unauthenticated
from conduit.daemon.auth import hash_token
from conduit.daemon.server import ServingInfo
from tests.conftest import MASTER_TOKEN, RawClient, link_wasm_cache
from tests.e2e.helpers import daemon_in_a_thread, execute, wait_upstreams
from tests.fixtures.mcp_echo_server import command as echo_command
from tests.served import Served

ECHO = {
    "name": "echo",
    "transport": "stdio",
    "command": echo_command()[0],
    "args": echo_command()[1:],
}
TIME = {
    "name": "time",
    "transport": "stdio",
    "command": sys.executable,
    "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
}


@pytest.fixture
async def tooled(start_daemon: Any, connect: Any) -> Callable[..., Any]:
    """Start a daemon with the echo fixture (and the published time server, for a test
    that asks: it takes most of a second of CPU to start)."""

    async def start(*, time: bool = False, **sections: Any) -> tuple[Any, Any, Any]:
        upstreams = [ECHO, TIME] if time else [ECHO]
        server, info = await start_daemon(upstreams=upstreams, **sections)
        await wait_upstreams(server, *(u["name"] for u in upstreams))
        return server, info, await connect(info)

    return start


@pytest.fixture(scope="module")
def shared_daemon(
    tmp_path_factory: pytest.TempPathFactory, wasm_cache: Path
) -> Iterator[Served[ServingInfo]]:
    """One daemon with both upstreams for a module's tests that change nothing of it
    (no config of their own, no upstream killed): each starts ~3 s of CPU, upstreams
    and sandboxes included."""
    state = tmp_path_factory.mktemp("tools") / "state"
    link_wasm_cache(state, wasm_cache)
    settings = {"executors.deno.pool_size": 1, "upstreams": [ECHO, TIME]}
    with daemon_in_a_thread(state, settings, upstreams=("echo", "time")) as served:
        yield served


@pytest.fixture
async def shared(shared_daemon: Served[ServingInfo], connect: Any) -> RawClient:
    """A connection of the test's own to the module's `shared_daemon`."""
    client: RawClient = await connect(shared_daemon.value)
    return client


async def test_programs_call_upstream_tools_through_the_sdk(shared: RawClient) -> None:
    client = shared
    code = """
const said = await tools.echo.echo({ text: "hi" });
const sum = await tools.echo.add({ a: 2, b: 3 });
const now = await tools.time.get_current_time({ timezone: "UTC" });
return { said, sum, tz: now.timezone };
"""
    result = await execute(client, code)
    assert result["status"] == "ok", result
    assert result["result"] == {"said": "hi", "sum": {"sum": 5}, "tz": "UTC"}
    assert result["tool_calls"] == 3


async def test_tool_errors_throw_tool_error_with_code_and_tool(shared: RawClient) -> None:
    client = shared
    code = """
const caught = [];
for (const attempt of [
  () => tools.echo.fail({ message: "nope" }),
  () => tools.echo.no_such_tool({}),
]) {
  try { await attempt(); } catch (e) {
    const { code, tool, message } = e;
    caught.push({ isToolError: e instanceof ToolError, code, tool, message });
  }
}
return caught;
"""
    result = await execute(client, code)
    failed, missing = result["result"]
    assert failed == {"isToolError": True, "code": -32007, "tool": "echo__fail", "message": "nope"}
    assert missing["isToolError"] is True
    assert missing["code"] == Forbidden.code  # one answer for missing and forbidden
    assert "echo.no_such_tool" in missing["message"]


async def test_allowlist_limits_what_a_program_sees_and_calls(shared: RawClient) -> None:
    client = shared
    code = """
const listed = (await tools.$discover()).map((t) => [t.id, t.path]);
let refused;
try { await tools.time.get_current_time({ timezone: "UTC" }); } catch (e) { refused = e.code; }
return { listed, echoed: await tools.echo.echo({ text: "ok" }), refused };
"""
    result = await execute(client, code, allowed_tools=["echo.echo"])
    assert result["result"] == {
        "listed": [["echo__echo", "echo.echo"]],
        "echoed": "ok",
        "refused": Forbidden.code,
    }


async def test_bad_allowlist_pattern_is_a_params_error(shared: RawClient) -> None:
    client = shared
    reply = await client.request(
        "execute", {"language": "typescript", "code": "1", "allowed_tools": ["ech*"]}
    )
    assert reply["error"]["code"] == InvalidParams.code
    assert reply["error"]["data"]["field"] == "allowed_tools"


async def test_tool_calls_never_wait_for_an_execution_slot(tooled: Any) -> None:
    _, _, client = await tooled(limits={"max_concurrent_executions": 1, "queue_size": 0})
    code = """
let n = 0;
for (let i = 0; i < 10; i++) n += (await tools.echo.add({ a: i, b: 1 })).sum;
n"""
    result = await execute(client, code)
    assert result["status"] == "ok", result
    assert result["result"] == 55
    assert result["tool_calls"] == 10


async def test_rate_limit_never_applies_to_tool_calls(tooled: Any) -> None:
    _, _, client = await tooled(limits={"executions_per_minute": 1, "burst": 1})
    code = "for (let i = 0; i < 20; i++) await tools.echo.echo({ text: 'x' });\n'done'"
    assert (await execute(client, code))["result"] == "done"


async def test_tool_call_limit_stops_the_program_and_keeps_its_output(shared: RawClient) -> None:
    client = shared
    code = "for (let i = 0; ; i++) { console.log(i); await tools.echo.echo({ text: 'x' }); }"
    result = await execute(client, code, limits={"tool_calls": 3})
    assert result["status"] == "tool_limit", result
    assert result["stdout"].startswith("0\n1\n2\n3\n")
    assert result["tool_calls"] == 3
    assert result["error"]["type"] == "ToolLimit"


async def test_an_upstream_killed_mid_call_costs_only_that_call(tooled: Any) -> None:
    server, _, client = await tooled()
    code = "try { await tools.echo.crash({}); } catch (e) { return [e.code, e.tool]; }"
    result = await execute(client, code)
    assert result["result"] == [-32007, "echo__crash"]
    await wait_upstreams(server, "echo", restarts=1)
    result = await execute(client, "await tools.echo.echo({ text: 'back' })")
    assert result["result"] == "back", result
    assert (await execute(client, "6 * 7"))["result"] == 42


async def test_upstreams_do_not_see_the_daemons_environment(
    tooled: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONDUIT_TEST_SECRET", "s3cret-value")
    _, _, client = await tooled()
    result = await execute(client, "await tools.echo.env({ name: 'CONDUIT_TEST_SECRET' })")
    assert "s3cret-value" not in json.dumps(result)


async def test_discovery_methods_for_agents(shared: RawClient) -> None:
    client = shared
    listed = await client.call("tools/list")
    names = {tool["name"] for tool in listed["tools"]}
    assert {"execute_typescript", "echo__echo", "echo__add", "time__get_current_time"} <= names
    schema = await client.call("tools/schema", {"name": "echo.add"})
    assert schema["id"] == "echo__add"
    assert schema["inputSchema"]["required"] == ["a", "b"]
    valid = await client.call("tools/validate", {"name": "echo__add", "arguments": {"a": "x"}})
    assert valid["valid"] is False
    assert any("a" in error for error in valid["errors"])
    packages = await client.call("tools/packages")
    assert {p["namespace"] for p in packages["packages"]} == {"echo", "time"}
    sdk = await client.call("sdk/get", {"language": "typescript", "allowed_tools": ["echo.*"]})
    assert "echo" in sdk["declarations"]
    assert "get_current_time" not in sdk["declarations"]
    upstreams = await client.call("upstreams/list")
    assert {(u["name"], u["state"]) for u in upstreams["upstreams"]} == {
        ("echo", "ready"),
        ("time", "ready"),
    }


async def test_clients_call_upstream_tools_directly(shared: RawClient) -> None:
    client = shared
    result = await client.call("tools/call", {"name": "echo__add", "arguments": {"a": 1, "b": 2}})
    assert result["structuredContent"] == {"sum": 3}
    seed = await client.call("mcp.callTool", {"name": "echo.echo", "arguments": {"text": "s"}})
    assert seed["content"][0]["text"] == "s"
    missing = await client.request("tools/call", {"name": "echo.nope", "arguments": {}})
    assert missing["error"]["code"] == NotFound.code


async def test_strict_mode_validates_arguments_and_names_the_field(tooled: Any) -> None:
    _, _, client = await tooled(gateway={"strict": True})
    arguments = {"name": "echo.add", "arguments": {"a": 1, "b": "two"}}
    # A tool error the model can correct; the value shape (sandboxes') keeps the code.
    refused = await client.call("tools/call", arguments)
    assert refused["isError"] is True
    assert "invalid arguments for echo__add" in refused["content"][0]["text"]
    reply = await client.request("tools/call", {**arguments, "shape": "value"})
    assert reply["error"]["code"] == InvalidParams.code
    assert "b" in reply["error"]["message"]


async def test_upstreams_register_is_for_admins_and_adds_tools(tooled: Any, connect: Any) -> None:
    server, info, client = await tooled()
    second = {**ECHO, "name": "echo2"}
    registered = await client.call("upstreams/register", {"upstream": second})
    assert registered == {"registered": "echo2"}
    await wait_upstreams(server, "echo2")
    assert (await execute(client, "await tools.echo2.echo({ text: 'two' })"))["result"] == "two"
    session = server.auth.mint_session("ex_forged", (("*",),))
    refused = await client.request(
        "upstreams/register", {"upstream": {**ECHO, "name": "x"}}, auth={"bearerToken": session}
    )
    assert refused["error"]["code"] == Forbidden.code


async def test_sandbox_socket_admits_only_live_session_tokens(tooled: Any) -> None:
    server, _, client = await tooled()
    path = server.callback_address.unix_path
    stream = await trio.open_unix_socket(path)
    sandbox = RawClient(stream)
    # Same uid as the daemon, but peer credentials count for nothing here.
    assert (await sandbox.request("tools/list"))["error"]["code"] == Unauthenticated.code
    refused = await sandbox.request("tools/list", auth={"bearerToken": MASTER_TOKEN})
    assert refused["error"]["code"] == Unauthenticated.code
    forged = await sandbox.request("tools/list", auth={"bearerToken": "cdt_" + "A" * 43})
    assert forged["error"]["code"] == Unauthenticated.code
    await sandbox.aclose()


async def test_session_tokens_die_with_their_execution(tooled: Any) -> None:
    """The very token a program used, replayed after it ended, is refused."""
    server, _, client = await tooled()
    minted: list[str] = []
    mint = server.auth.mint_session

    def recording_mint(*args: Any) -> str:
        minted.append(mint(*args))
        return minted[-1]

    server.auth.mint_session = recording_mint
    result = await execute(client, "await tools.echo.echo({ text: 'x' }); 1", executor="deno")
    assert result["status"] == "ok"
    assert len(minted) == 1
    assert server.auth.live_sessions() == 0
    sandbox = RawClient(await trio.open_unix_socket(server.callback_address.unix_path))
    replayed = await sandbox.request(
        "tools/call",
        {"name": "echo.echo", "arguments": {"text": "again"}},
        auth={"bearerToken": minted[0]},
    )
    assert replayed["error"]["code"] == Unauthenticated.code
    await sandbox.aclose()


async def test_a_program_cannot_reach_the_clients_socket(tooled: Any) -> None:
    _, info, client = await tooled()
    code = f"""
const path = {json.dumps(info.unix_path)};
try {{ await Deno.connect({{ transport: "unix", path }}); return "connected"; }}
catch (e) {{ return e.name; }}
"""
    assert (await execute(client, code))["result"] == "NotCapable"


async def test_concurrent_calls_share_one_connection_and_come_back_matched(
    shared: RawClient,
) -> None:
    client = shared
    code = "await Promise.all([...Array(20).keys()].map((i) => tools.echo.add({ a: i, b: 100 })))"
    result = await execute(client, code)
    assert [item["sum"] for item in result["result"]] == [100 + i for i in range(20)]
    assert result["tool_calls"] == 20


# Synchronous calls, ToolError and discovery from Python; every Python executor runs it.
PYTHON_TOOLS_PROGRAM = """
said = tools.echo.echo(text="hi")
summed = tools.echo.add({"a": 2, "b": 3})
try:
    tools.echo.fail(message="nope")
except ToolError as e:
    failed = [e.code, e.tool, e.message]
listed = sorted(t["path"] for t in tools._discover() if t["path"].startswith("echo."))
return {"said": said, "sum": summed, "failed": failed, "has_echo": "echo.echo" in listed}
"""


async def test_python_programs_call_tools_synchronously(shared: RawClient) -> None:
    client = shared
    result = await client.call("execute", {"language": "python", "code": PYTHON_TOOLS_PROGRAM})
    assert result["status"] == "ok", result
    assert result["result"] == {
        "said": "hi",
        "sum": {"sum": 5},
        "failed": [-32007, "echo__fail", "nope"],
        "has_echo": True,
    }
    assert result["tool_calls"] == 3


async def test_python_programs_meet_both_allowlists(tooled: Any) -> None:
    """The client token's allowlist and the request's both bind a Python program."""
    token = "cdt_python-allowlist-client-0123456789abcdef"
    client_entry = {"name": "py-agent", "sha256": hash_token(token), "allowed_tools": ["echo.*"]}
    _, _, client = await tooled(time=True, auth={"clients": [client_entry]})
    login = await client.call("auth/login", {"token": token})
    assert login["principal"]["name"] == "py-agent"
    code = """
refused = {}
for name, call in [
    ("time", lambda: tools.time.get_current_time(timezone="UTC")),  # not the client's
    ("add", lambda: tools.echo.add(a=1, b=2)),  # not the request's
]:
    try:
        call()
    except ToolError as e:
        refused[name] = [e.code, e.tool, e.message]
listed = [t["id"] for t in tools._discover()]
return {"listed": listed, "echoed": tools.echo.echo(text="ok"), "refused": refused}
"""
    result = await client.call(
        "execute",
        {"language": "python", "code": code, "allowed_tools": ["echo.echo", "time.*"]},
    )
    assert result["status"] == "ok", result
    refusal = "is not allowed here; add it to allowed_tools, within what your token allows"
    assert result["result"] == {
        "listed": ["echo__echo"],
        "echoed": "ok",
        "refused": {
            "time": [
                Forbidden.code,
                "time.get_current_time",
                f"forbidden: tool time.get_current_time {refusal}",
            ],
            "add": [Forbidden.code, "echo.add", f"forbidden: tool echo.add {refusal}"],
        },
    }
