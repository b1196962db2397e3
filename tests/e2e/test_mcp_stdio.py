"""`conduit mcp` as MCP clients run it: a child process speaking MCP on stdio.

The official Python MCP SDK's client launches `conduit mcp` (embedded, and relaying to a
daemon the test runs with `--connect`), lists the tools and runs programs that call an
upstream tool; raw pipes check that stdout carries nothing but protocol, whatever the
sandboxes print.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import jsonschema
import mcp_types as types
import pytest
import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

from conduit.daemon.auth import hash_token
from conduit.daemon.config import Config
from tests.conftest import MASTER_TOKEN, WAIT_S
from tests.e2e.first_start import (
    QUEUE_TIMEOUT_S,
    REQUEST_TIMEOUT_MS,
    compile_held,
    cpu_hog,
    read_replies,
)
from tests.e2e.helpers import CONDUIT, call, wait_for_socket, wait_upstreams
from tests.e2e.mcp_helpers import CONFORMANCE_TOOLS, ECHO, ENDLESS_TIMEOUT_MS, NO_SANDBOXES


def conduit_mcp(config: Config, *args: str, env: dict[str, str] | None = None) -> Any:
    """How an MCP client's configuration launches `conduit mcp` for `config`."""
    return StdioServerParameters(
        command=CONDUIT,
        args=["mcp", "--config", config.source, "--state-dir", config.server.state_dir, *args],
        env=env,
    )


@asynccontextmanager
async def sdk_client(server: Any, **options: Any) -> AsyncIterator[Client]:
    with trio.fail_after(WAIT_S):
        async with Client(server, **options) as client:
            yield client


async def _check_progress(client: Client) -> None:
    """A call with a progress token hears the program's output while it runs."""
    heard: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        heard.append(message or "")

    program = "import time\nfor i in range(5):\n    print(i)\n    time.sleep(0.05)"
    result = await client.call_tool(
        "execute_python", {"code": program}, progress_callback=on_progress
    )
    assert result.structured_content is not None
    assert "".join(heard) == result.structured_content["stdout"] == "0\n1\n2\n3\n4\n"


async def _check_tools_and_programs(client: Client) -> None:
    """What both modes must give an SDK client: tools, programs, upstream calls, errors."""
    listed = (await client.list_tools()).tools
    names = [tool.name for tool in listed]
    assert names[:3] == ["execute_python", "execute_typescript", "execute_javascript"]
    assert {"echo__echo", "echo__add"} <= set(names)
    by_name = {tool.name: tool for tool in listed}
    python, typescript = by_name["execute_python"], by_name["execute_typescript"]
    # Each description declares the tools programs may call, in the program's language.
    assert "class echo:" in python.description and "def add(" in python.description
    assert "echo: {" in typescript.description and "add(args: {" in typescript.description
    assert python.input_schema["required"] == ["code"]
    assert python.output_schema is not None

    said = await client.call_tool(
        "execute_python", {"code": 'said = tools.echo.echo(text="hi")\nsaid + "!"'}
    )
    assert said.is_error is False
    assert said.structured_content is not None
    assert said.structured_content["result"] == "hi!"
    assert said.structured_content["tool_calls"] == 1
    total = await client.call_tool(
        "execute_typescript", {"code": "(await tools.echo.add({ a: 2, b: 3 })).sum * 10"}
    )
    assert total.is_error is False
    assert total.structured_content is not None
    assert total.structured_content["result"] == 50

    failed = await client.call_tool(
        "execute_python", {"code": "print('partial')\nraise ValueError('boom')"}
    )
    assert failed.is_error is True
    assert failed.structured_content is not None
    assert failed.structured_content["status"] == "error"
    assert failed.structured_content["stdout"] == "partial\n"
    assert failed.structured_content["error"]["type"] == "ValueError"
    text = failed.content[0]
    assert isinstance(text, types.TextContent)
    assert json.loads(text.text)["error"]["message"] == "boom"
    jsonschema.validate(failed.structured_content, python.output_schema)

    direct = await client.call_tool("echo__echo", {"text": "straight"})
    assert direct.is_error is False
    assert isinstance(direct.content[0], types.TextContent)
    assert direct.content[0].text == "straight"


@pytest.mark.slow
async def test_sdk_client_runs_programs_on_an_embedded_daemon(
    make_config: Callable[..., Config],
) -> None:
    config = make_config(upstreams=[ECHO, CONFORMANCE_TOOLS])
    asked: list[types.CreateMessageRequestParams] = []

    async def sampling(context: Any, params: types.CreateMessageRequestParams) -> Any:
        asked.append(params)
        said = types.TextContent(text="from the client's model")
        return types.CreateMessageResult(role="assistant", content=said, model="test")

    async with sdk_client(conduit_mcp(config), sampling_callback=sampling) as client:
        capabilities = client.session.initialize_result.capabilities
        assert capabilities.tools is not None and capabilities.tools.list_changed is True
        assert capabilities.prompts is None and capabilities.resources is None
        assert capabilities.logging is not None
        await _check_tools_and_programs(client)
        await _check_progress(client)
        # An upstream tool asking its caller's model: over stdio, on the same pipes.
        sampled = await client.call_tool("test_sampling", {"prompt": "on stdio"})
    assert sampled.content[0].text == "LLM response: from the client's model"  # type: ignore[union-attr]
    assert asked[0].messages[0].content.text == "on stdio"  # type: ignore[union-attr]


@pytest.mark.slow
async def test_sdk_client_through_connect_hears_tool_changes_and_cancels(
    start_daemon: Any, make_config: Callable[..., Config]
) -> None:
    config = make_config(upstreams=[ECHO])
    daemon, info = await start_daemon(config)
    await wait_upstreams(daemon, "echo")
    changed = trio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    env = {"CONDUIT_TOKEN": MASTER_TOKEN}
    server = conduit_mcp(config, "--connect", info.unix_path, env=env)
    async with sdk_client(server, message_handler=on_message) as client:
        relayed = [c for c in daemon.connections if c.mcp_session]
        assert len(relayed) == 1 and relayed[0].principal.name == "master"  # logged in
        await _check_tools_and_programs(client)

        # The upstream grows a tool: Conduit re-lists it and tells the client.
        await client.call_tool("echo__add_tool", {"name": "fresh"})
        with trio.fail_after(WAIT_S):
            await changed.wait()
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert "echo__fresh" in tools
        assert "fresh(args: {" in (tools["execute_typescript"].description or "")

        # A call the client abandons sends notifications/cancelled: the program stops.
        endless = {"code": "while (true) {}", "limits": {"timeout_ms": ENDLESS_TIMEOUT_MS}}
        with pytest.raises(MCPError):
            await client.call_tool("execute_typescript", endless, read_timeout_seconds=1)
        with trio.fail_after(WAIT_S):
            while len(daemon.executions):
                await trio.sleep(0.05)  # the daemon announces no execution's end to us


async def test_connect_with_a_wrong_token_fails_with_a_message(
    start_daemon: Any, tmp_path: Path
) -> None:
    _, info = await start_daemon(executors=NO_SANDBOXES)
    env = {**os.environ, "CONDUIT_TOKEN": "cdt_not-the-token-0000000000000000"}
    with trio.fail_after(WAIT_S):
        done = await trio.run_process(
            [CONDUIT, "mcp", "--connect", info.unix_path, "--state-dir", str(tmp_path / "s")],
            stdin=b"",
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=env,
        )
    assert done.returncode == 1
    assert done.stdout == b""
    assert "the token is not valid" in done.stderr.decode()


async def test_connect_leaves_another_daemons_token_file_to_peer_credentials(
    start_daemon: Any, tmp_path: Path
) -> None:
    # The state dir the relay reads holds some other daemon's master token: on the Unix
    # socket, peer credentials let the relay in, and that token is never presented.
    _, info = await start_daemon(executors=NO_SANDBOXES)
    state = tmp_path / "s"
    state.mkdir()
    (state / "master.token").write_text("cdt_another-daemons-token-000000000000\n")
    with trio.fail_after(WAIT_S):
        done = await trio.run_process(
            [CONDUIT, "mcp", "--connect", info.unix_path, "--state-dir", str(state)],
            stdin=_rpc(1, "auth/whoami", {}) + b"\n",
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    reply = json.loads(done.stdout)  # only the client's own answer: none of the relay's
    assert reply["result"]["principal"]["name"] == f"uid:{os.getuid()}"


@pytest.mark.parametrize("transport", ["unix", "tcp"])
async def test_relay_bounds_lines_and_ends_when_the_client_does(
    start_daemon: Any, tmp_path: Path, transport: str
) -> None:
    max_bytes = 4096
    server = {"max_message_bytes": max_bytes, "tcp": "127.0.0.1:0"}
    _, info = await start_daemon(server=server, executors=NO_SANDBOXES)
    host, port = info.tcp_address
    where = (
        ["--connect", info.unix_path]
        if transport == "unix"
        else ["--connect-tcp", f"{host}:{port}"]
    )
    requests = [
        _rpc(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {}}),
        _rpc(2, "ping", {"padding": "x" * max_bytes}),  # too long: refused by the relay
        _rpc(3, "auth/whoami", {}),
    ]
    env = {**os.environ, "CONDUIT_TOKEN": MASTER_TOKEN}
    command = [CONDUIT, "mcp", *where, "--state-dir", str(tmp_path / "s")]
    with trio.fail_after(WAIT_S):
        done = await trio.run_process(
            command,
            stdin=b"\n".join(requests) + b"\n",
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=env,
        )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    # Answers come as they are ready: the relay's own refusal may overtake the daemon's.
    replies = {reply["id"]: reply for reply in map(json.loads, done.stdout.splitlines())}
    assert set(replies) == {1, None, 3}
    assert replies[None]["error"]["code"] == -32600
    assert f"at most {max_bytes} bytes" in replies[None]["error"]["message"]
    assert replies[3]["result"]["principal"]["name"] == "master"  # the relay logged in


async def test_connect_to_no_daemon_says_where_it_looked(tmp_path: Path) -> None:
    missing = str(tmp_path / "nobody.sock")
    with trio.fail_after(WAIT_S):
        done = await trio.run_process(
            [CONDUIT, "mcp", "--connect", missing, "--state-dir", str(tmp_path / "s")],
            stdin=b"",
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 3
    assert done.stdout == b""
    assert f"cannot reach the daemon at {missing}" in done.stderr.decode()


# ---- the first request ----------------------------------------------------------------


@pytest.mark.slow
async def test_execute_python_right_after_initialize_gets_its_result(
    make_config: Callable[..., Config], tmp_path: Path, wasm_cache: Path
) -> None:
    """An MCP client's first call comes as soon as `initialize` is answered: with
    wasm-python still loading, it waits for it and gets the program's result."""
    config = make_config(
        executors={"deno": {"enabled": False}, "wasm_js": {"enabled": False}},
        limits={"queue_timeout_s": QUEUE_TIMEOUT_S},
    )
    state = tmp_path / "fresh"
    command = [CONDUIT, "mcp", "--config", config.source, "--state-dir", str(state)]
    arguments = {"code": "6 * 7", "limits": {"timeout_ms": REQUEST_TIMEOUT_MS}}
    with compile_held(state, wasm_cache) as release:
        async with cpu_hog():
            process = await trio.lowlevel.open_process(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
            )
            try:
                initialize = {"protocolVersion": "2025-11-25", "capabilities": {}}
                await process.stdin.send_all(_rpc(1, "initialize", initialize) + b"\n")
                assert "result" in (await read_replies(process.stdout, 1))[1]
                # The listing comes after the call: once it is answered, the call has
                # been read, and waits for the executor.
                await process.stdin.send_all(
                    b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n'
                    + _rpc(3, "tools/call", {"name": "execute_python", "arguments": arguments})
                    + b"\n"
                    + _rpc(2, "executors/list", {})
                    + b"\n"
                )
                replies = await read_replies(process.stdout, 1)
                release()
                replies |= await read_replies(process.stdout, 1)
            finally:
                await process.stdin.aclose()
                with trio.move_on_after(WAIT_S):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()
                await process.stdout.aclose()
    listed = {e["name"]: e for e in replies[2]["result"]["executors"]}
    assert listed["wasm-python"]["available"] is False  # it was still starting
    called = replies[3]["result"]
    assert called["isError"] is False, called
    result = called["structuredContent"]
    assert (result["status"], result["result"], result["executor"]) == ("ok", 42, "wasm-python")
    assert result["queue_ms"] > 0  # the wait for the executor is queueing


# ---- stdout hygiene -------------------------------------------------------------------


def _rpc(ident: int, method: str, params: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": ident, "method": method, "params": params}).encode()


def _program(ident: int, tool: str, code: str) -> bytes:
    return _rpc(ident, "tools/call", {"name": tool, "arguments": {"code": code}})


LINES = 3000
NOISY = {
    "execute_python": f"for i in range({LINES}):\n    print('py', i)\nimport sys\n"
    f"for i in range({LINES}):\n    print('err', i, file=sys.stderr)\n'done'",
    # (`Deno.pid`: on deno, whose worker is a process of its own with its own stdout.)
    "execute_typescript": f"const pid: number = Deno.pid;\n"
    f"for (let i = 0; i < {LINES}; i++) console.log('ts', i);\n"
    f"for (let i = 0; i < {LINES}; i++) console.error('err', i);\n'done'",
    "execute_javascript": f"for (let i = 0; i < {LINES}; i++) console.log('js', i);\n'done'",
}


@pytest.mark.slow
async def test_stdout_carries_only_protocol_whatever_sandboxes_print(
    make_config: Callable[..., Config], tmp_path: Path
) -> None:
    config = make_config(upstreams=[ECHO])
    requests = [_rpc(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {}})]
    requests.append(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}')
    requests += [_program(10 + n, tool, code) for n, (tool, code) in enumerate(NOISY.items())]
    calls_echo = "return (await tools.echo.big({ n: 100000 })).length"
    requests.append(_program(20, "execute_typescript", calls_echo))
    requests.append(_rpc(21, "tools/list", {}))
    stdin = b"\n".join(requests) + b"\n"
    command = [CONDUIT, "mcp", "--config", config.source]
    with trio.fail_after(WAIT_S * 4):
        # stdin closes once written: the daemon must answer everything, then exit 0.
        done = await trio.run_process(
            command, stdin=stdin, capture_stdout=True, capture_stderr=True, check=False
        )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    messages = [json.loads(line) for line in done.stdout.splitlines()]
    assert all(m.get("jsonrpc") == "2.0" and ("result" in m or "error" in m) for m in messages)
    replies = {m["id"]: m["result"] for m in messages}
    assert set(replies) == {1, 10, 11, 12, 20, 21}
    for ident in (10, 11, 12):
        result = replies[ident]["structuredContent"]
        assert result["status"] == "ok", result
        assert result["stdout"].count("\n") == LINES
    assert replies[11]["structuredContent"]["executor"] == "deno"
    assert replies[12]["structuredContent"]["executor"] == "wasm-js"
    assert replies[20]["structuredContent"]["result"] == 100_000
    # What the sandboxes wrote to their stderr is in the results, not on our stdout.
    assert replies[10]["structuredContent"]["stderr"].count("err") == LINES


async def test_claim_stdio_sends_stray_writes_to_stderr() -> None:
    """Prints, child processes and direct fd 1 writes after `claim_stdio` reach stderr."""
    script = r"""
import os, subprocess
from conduit.daemon.mcp_stdio import claim_stdio
fds = claim_stdio()
print("stray print", flush=True)
os.write(1, b"stray write\n")
subprocess.run(["echo", "stray child"], check=True)
subprocess.run(["cat"], check=True)  # reads /dev/null, not the protocol
os.write(fds.write_fd, os.read(fds.read_fd, 100))
"""
    with trio.fail_after(WAIT_S):
        done = await trio.run_process(
            [sys.executable, "-c", script],
            stdin=b'{"jsonrpc": "2.0", "method": "ping", "id": 1}\n',
            capture_stdout=True,
            capture_stderr=True,
        )
    assert done.stdout == b'{"jsonrpc": "2.0", "method": "ping", "id": 1}\n'
    assert done.stderr.decode().splitlines() == ["stray print", "stray write", "stray child"]


async def test_embedded_daemon_shares_itself_on_a_socket_only_when_asked(
    make_config: Callable[..., Config], short_dir: Path
) -> None:
    config = make_config(executors=NO_SANDBOXES)
    assert not Path(config.server.socket).exists()  # the configured one stays free
    shared = str(short_dir / "shared.sock")
    command = [CONDUIT, "mcp", "--config", config.source, "--socket", shared]
    process = await trio.lowlevel.open_process(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        await wait_for_socket(shared, process)
        assert not Path(config.server.socket).exists()
        reply = await call(shared, "auth/whoami")
        assert reply["result"]["principal"]["name"] == f"uid:{os.getuid()}"  # peer credentials
        await process.stdin.aclose()  # the MCP client leaves: the daemon drains and stops
        with trio.fail_after(WAIT_S):
            assert await process.wait() == 0
        assert not Path(shared).exists()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await process.stdout.aclose()


# ---- who the stdio peer is ------------------------------------------------------------


@pytest.mark.slow
async def test_client_option_narrows_the_stdio_peer_to_a_configured_client(
    make_config: Callable[..., Config],
) -> None:
    agent = {
        "name": "agent",
        "sha256": hash_token("cdt_unused-agent-token-0123456789"),
        "scopes": ["execute", "tools"],
        "allowed_tools": ["echo.echo"],
    }
    config = make_config(upstreams=[ECHO], auth={"clients": [agent]})
    async with sdk_client(conduit_mcp(config, "--client", "agent")) as client:
        listed = (await client.list_tools()).tools
        assert [tool.name for tool in listed][3:] == ["echo__echo"]
        assert "def echo(" in listed[0].description and "def add(" not in listed[0].description
        refused = await client.call_tool("execute_python", {"code": "tools.echo.add(a=1, b=2)"})
        assert refused.is_error is True
        assert refused.structured_content is not None
        assert refused.structured_content["error"]["type"] == "ToolError"


async def test_unknown_client_name_is_a_configuration_error(
    make_config: Callable[..., Config],
) -> None:
    config = make_config()
    command = [CONDUIT, "mcp", "--config", config.source, "--client", "nobody"]
    with trio.fail_after(WAIT_S):
        done = await trio.run_process(
            command, stdin=b"", capture_stdout=True, capture_stderr=True, check=False
        )
    assert done.returncode == 2
    assert done.stdout == b""
    assert "--client nobody: no such client" in done.stderr.decode()
