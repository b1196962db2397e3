"""What MCP clients see of Conduit on any connection: the execute tools' descriptions and
schemas, tool errors for what a model can act on (bad arguments, an executor that is
unavailable, overload, rate limits), list-changed notifications and cancellation."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import trio

from conduit.daemon.methods.tools import MAX_DECLARATIONS_CHARS
from conduit.executors.caveats import CANNOT_USE, cannot_use
from tests.conftest import WAIT_S, RawClient
from tests.e2e.helpers import wait_upstreams
from tests.e2e.mcp_helpers import DENO_ONLY, ECHO, ENDLESS_TIMEOUT_MS, NO_SANDBOXES
from tests.fixtures.mcp_echo_server import command as echo_command

# Enough tools that their declarations overflow MAX_DECLARATIONS_CHARS several times.
MANY_TOOLS = 400
INITIALIZE = {"protocolVersion": "2025-11-25", "capabilities": {}}


async def _mcp_client(
    start_daemon: Any, connect: Any, **sections: Any
) -> tuple[Any, Any, RawClient]:
    """A daemon for `sections`, its upstreams ready, and a client that initialized."""
    daemon, info = await start_daemon(**sections)
    names = [upstream["name"] for upstream in sections.get("upstreams", [])]
    await wait_upstreams(daemon, *names)
    client = await connect(info)
    await client.call("initialize", INITIALIZE)
    await client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    return daemon, info, client


async def _execute_tools(client: RawClient) -> dict[str, Any]:
    listed = await client.call("tools/list", {"_meta": {"progressToken": 1}})
    return {tool["name"]: tool for tool in listed["tools"] if tool["name"].startswith("execute_")}


async def test_descriptions_declare_the_callable_tools_in_each_language(
    start_daemon: Any, connect: Any
) -> None:
    _, _, client = await _mcp_client(
        start_daemon, connect, upstreams=[ECHO], executors=NO_SANDBOXES
    )
    tools = await _execute_tools(client)
    python = tools["execute_python"]["description"]
    assert "tools.<namespace>.<tool>(name=value, ...)" in python
    assert "```python\n" in python and "    class echo:" in python
    # Typed from the tool's input and output schemas.
    assert "def add(*, a: int, b: int) -> echo__add__Result:" in python
    for name in ("execute_typescript", "execute_javascript"):
        description = tools[name]["description"]
        assert "```typescript\n" in description and "declare const tools: {" in description
        assert "add(args: {\n      a: number;\n      b: number;\n    }): Promise<{" in description
    assert tools["execute_python"]["annotations"] == {"openWorldHint": True}


async def test_too_many_tools_are_listed_by_name_within_the_budget(
    start_daemon: Any, connect: Any
) -> None:
    many = {**ECHO, "name": "many", "args": [*echo_command()[1:], "--many", str(MANY_TOOLS)]}
    _, _, client = await _mcp_client(
        start_daemon, connect, upstreams=[many], executors=NO_SANDBOXES
    )
    for tool in (await _execute_tools(client)).values():
        description = tool["description"]
        assert len(description) < MAX_DECLARATIONS_CHARS + 1000
        assert f"may call {MANY_TOOLS + 9} tools, too many to declare here" in description
        assert "- many: add, add_tool, big, crash, echo, env, extra_000" in description
        assert "declare const tools" not in description and "class many" not in description


async def test_without_upstreams_the_description_says_there_are_no_tools(
    start_daemon: Any, connect: Any
) -> None:
    _, _, client = await _mcp_client(start_daemon, connect, executors=NO_SANDBOXES)
    for tool in (await _execute_tools(client)).values():
        assert tool["description"].endswith(
            "No tools are available to these programs: they compute, print and return."
        )
        assert tool["annotations"] == {"openWorldHint": False}


async def test_input_schema_is_flat_and_output_schema_describes_every_result(
    start_daemon: Any, connect: Any
) -> None:
    _, _, client = await _mcp_client(start_daemon, connect, executors=DENO_ONLY)
    tool = (await _execute_tools(client))["execute_typescript"]
    schema, output = tool["inputSchema"], tool["outputSchema"]
    text = json.dumps(schema)
    assert "$ref" not in text and "$defs" not in text and '"title"' not in text
    assert set(schema["properties"]) == {
        "code",
        "executor",
        "limits",
        "allowed_tools",
        "inputs",
        "files",
        "session",
    }
    assert schema["properties"]["limits"]["properties"]["timeout_ms"] == {
        "type": "integer",
        "minimum": 1,
        "description": "wall-clock limit",
    }
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate({"code": "1", "limits": {"timeout_ms": 5}, "inputs": [1]}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"code": "1", "stream": True}, schema)

    programs = {
        "ok": {"code": "console.log('x'); ({ n: 1 })"},
        "error": {"code": "throw new Error('no')"},
        "timeout": {"code": "for (;;) {}", "limits": {"timeout_ms": 300}},
    }
    for status, arguments in programs.items():
        result = await client.call("tools/call", {"name": tool["name"], "arguments": arguments})
        assert result["structuredContent"]["status"] == status
        assert result["isError"] is (status != "ok")
        jsonschema.validate(result["structuredContent"], output)


async def test_bad_arguments_are_tool_errors_the_model_can_read(
    start_daemon: Any, connect: Any
) -> None:
    _, _, client = await _mcp_client(start_daemon, connect, executors=NO_SANDBOXES)
    missing = await client.call("tools/call", {"name": "execute_python", "arguments": {}})
    assert missing == {
        "content": [
            {
                "type": "text",
                "text": "invalid arguments for execute_python: code is required; "
                "the tool's inputSchema lists its arguments",
            }
        ],
        "isError": True,
    }
    arguments = {"code": "1", "limits": {"timeout_ms": 10**9}}
    over = await client.call("tools/call", {"name": "execute_python", "arguments": arguments})
    assert over["isError"] is True
    assert "timeout_ms" in over["content"][0]["text"]


async def test_tool_list_changes_reach_mcp_clients_only(start_daemon: Any, connect: Any) -> None:
    _, info, mcp = await _mcp_client(start_daemon, connect, executors=NO_SANDBOXES)
    plain = await connect(info)
    await plain.call("upstreams/register", {"upstream": {**ECHO, "name": "fresh"}})
    note = await mcp.recv()
    assert note == {"jsonrpc": "2.0", "method": "notifications/tools/list_changed", "params": {}}
    # The connection that never initialized heard nothing: its next line is its answer.
    assert (await plain.request("ping"))["result"] == {}


async def test_notifications_cancelled_stops_the_program_of_that_request(
    start_daemon: Any, connect: Any
) -> None:
    daemon, _, client = await _mcp_client(start_daemon, connect, executors=DENO_ONLY)
    endless = {"code": "while (true) {}", "limits": {"timeout_ms": ENDLESS_TIMEOUT_MS}}
    call = {"name": "execute_typescript", "arguments": endless}
    await client.send({"jsonrpc": "2.0", "id": "long", "method": "tools/call", "params": call})
    with trio.fail_after(WAIT_S):
        while not len(daemon.executions):
            await trio.sleep(0.01)  # the daemon announces no execution's start to us
    cancel = {"requestId": "long", "reason": "the user gave up"}
    await client.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel})
    reply = await client.recv()
    assert reply["id"] == "long"
    assert reply["result"]["structuredContent"]["status"] == "cancelled"


async def test_descriptions_and_sdk_say_what_programs_cannot_use(
    start_daemon: Any, connect: Any
) -> None:
    _, _, client = await _mcp_client(start_daemon, connect, executors=NO_SANDBOXES)
    tools = await _execute_tools(client)
    for name, executor, line in [
        ("execute_python", "wasm-python", "wasm-python"),
        # No deno configured: TypeScript runs on wasm-js alone, whose types must erase.
        ("execute_typescript", "wasm-js", "wasm-js/typescript"),
        ("execute_javascript", "wasm-js", "wasm-js"),
    ]:
        summary = tools[name]["description"].split("\n\n")[0]
        assert f"Programs on {executor} cannot use {CANNOT_USE[line]}." in summary
    assert "threads (use asyncio), subprocesses" in tools["execute_python"]["description"]
    assert "a program using imports, Intl" in tools["execute_javascript"]["description"]
    sdk = await client.call("sdk/get", {"language": "python"})
    assert sdk["cannot_use"] == cannot_use("wasm-python")
    assert sdk["declarations"].startswith(f"# {cannot_use('wasm-python')}\n")
    compile(sdk["declarations"], "<sdk>", "exec")  # still a valid Python module
    javascript = await client.call("sdk/get", {"language": "javascript"})
    assert javascript["declarations"].startswith(f"// {cannot_use('wasm-js')}\n")


async def test_unavailable_overloaded_and_rate_limited_are_tool_errors(
    start_daemon: Any, connect: Any
) -> None:
    """What a model can act on reaches it as a tool result, not a protocol error."""
    limits = {"max_concurrent_executions": 1, "queue_size": 0, "executions_per_minute": 2}
    daemon, _, client = await _mcp_client(
        start_daemon, connect, executors=DENO_ONLY, limits={**limits, "burst": 2}
    )
    python = {"name": "execute_python", "arguments": {"code": "1"}}
    disabled = await client.call("tools/call", python)
    assert disabled["isError"] is True
    text = disabled["content"][0]["text"]
    assert text.startswith("executor 'wasm-python' is disabled in the configuration"), text

    endless = {"code": "while (true) {}", "limits": {"timeout_ms": ENDLESS_TIMEOUT_MS}}
    busy = {"name": "execute_typescript", "arguments": endless}
    await client.send({"jsonrpc": "2.0", "id": "busy", "method": "tools/call", "params": busy})
    with trio.fail_after(WAIT_S):
        while not len(daemon.executions):
            await trio.sleep(0.01)  # the daemon announces no execution's start to us
    one = {"name": "execute_typescript", "arguments": {"code": "1"}}
    overloaded = await client.call("tools/call", one)
    assert overloaded["isError"] is True
    assert overloaded["content"][0]["text"].startswith("overloaded: ")
    daemon.executions.cancel_all()
    assert (await client.recv())["result"]["structuredContent"]["status"] == "cancelled"

    limited = await client.call("tools/call", one)  # the third start within the minute
    assert limited["isError"] is True
    assert limited["content"][0]["text"].startswith("rate limited: ")


async def test_bad_arguments_to_an_upstream_tool_are_a_tool_error(
    start_daemon: Any, connect: Any
) -> None:
    _, _, client = await _mcp_client(
        start_daemon, connect, upstreams=[ECHO], executors=NO_SANDBOXES, gateway={"strict": True}
    )
    refused = await client.call("tools/call", {"name": "echo__add", "arguments": {"a": 1}})
    assert refused["isError"] is True
    assert refused["content"][0]["text"].startswith("invalid arguments for echo__add: ")
    assert "b" in refused["content"][0]["text"]


async def test_a_missing_tool_says_where_to_look_once(start_daemon: Any, connect: Any) -> None:
    _, _, client = await _mcp_client(
        start_daemon, connect, upstreams=[ECHO], executors=NO_SANDBOXES
    )
    missing = await client.request("tools/call", {"name": "echo.ech", "arguments": {}})
    message = missing["error"]["message"]
    assert message.count("tools/list") == 1, message
    assert message.endswith("tools/list shows the tools you may call")
