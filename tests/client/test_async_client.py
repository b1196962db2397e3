"""`AsyncClient` against a real daemon: transports, auth, executions, concurrency,
timeouts, reconnects, tool discovery and errors by class."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from conduit.client import (
    AsyncClient,
    ConnectionFailed,
    ExecutionResult,
    ExecutorUnavailable,
    Forbidden,
    InvalidParams,
    MethodNotFound,
    NotFound,
    ProgramFailed,
    RpcError,
    Timeout,
    Unauthenticated,
    open_client,
)
from conduit.client.endpoint import Backoff
from conduit.daemon.auth import hash_token, new_token
from tests.client.helpers import NO_DENO, client_options
from tests.conftest import MASTER_TOKEN, WAIT_S
from tests.e2e.helpers import wait_upstreams
from tests.e2e.test_tools import ECHO


@pytest.fixture
async def started(start_daemon: Any) -> Any:
    return await start_daemon(server={"tcp": "127.0.0.1:0"}, **NO_DENO)


@pytest.mark.parametrize("transport", ["unix", "tcp"])
async def test_connects_over_each_transport_and_logs_in(started: Any, transport: str) -> None:
    _, info = started
    token = MASTER_TOKEN if transport == "tcp" else None
    with trio.fail_after(WAIT_S):
        async with AsyncClient(**client_options(info, transport), token=token) as client:
            whoami = await client.whoami()
            await client.ping()
    # Over TCP the token made it the master; on the Unix socket, peer credentials did.
    assert whoami is not None
    assert whoami["kind"] == ("master" if transport == "tcp" else "peer")
    assert "admin" in whoami["scopes"]


async def test_token_defaults_to_conduit_token(started: Any, monkeypatch: Any) -> None:
    _, info = started
    monkeypatch.setenv("CONDUIT_TOKEN", MASTER_TOKEN)
    with trio.fail_after(WAIT_S):
        async with open_client(**client_options(info, "tcp")) as client:
            assert (await client.whoami() or {})["kind"] == "master"


async def test_client_token_is_scoped(start_daemon: Any) -> None:
    token = new_token()
    clients = [{"name": "agent", "sha256": hash_token(token), "scopes": ["execute", "tools"]}]
    _, info = await start_daemon(auth={"peer_credentials": False, "clients": clients}, **NO_DENO)
    with trio.fail_after(WAIT_S):
        async with AsyncClient(unix_path=info.unix_path, token=token) as client:
            assert await client.whoami() == {
                "name": "agent",
                "kind": "client",
                "scopes": ["execute", "tools"],
            }
            with pytest.raises(Forbidden, match="'admin' scope"):
                await client.call("config/reload")


async def test_a_wrong_token_raises_unauthenticated_on_entry(started: Any) -> None:
    _, info = started
    client = AsyncClient(**client_options(info, "tcp"), token="cdt_not-the-token")
    with trio.fail_after(WAIT_S), pytest.raises(Unauthenticated, match="not valid"):
        async with client:
            pytest.fail("entered with a wrong token")
    with pytest.raises(RuntimeError, match="not open"):
        await client.ping()


async def test_no_daemon_raises_connection_failed_naming_the_socket(short_dir: Any) -> None:
    path = str(short_dir / "nobody.sock")
    client = AsyncClient(unix_path=path, token="", backoff=Backoff(attempts=2, first_delay_s=0))
    with trio.fail_after(WAIT_S), pytest.raises(ConnectionFailed) as caught:
        async with client:
            pass
    assert path in str(caught.value)
    assert "after 2 attempts" in str(caught.value)


async def test_execute_results_are_typed(started: Any) -> None:
    _, info = started
    with trio.fail_after(WAIT_S):
        async with AsyncClient(unix_path=info.unix_path) as client:
            ok = await client.execute("console.log('hi'); 6 * 7", language="javascript")
            failed = await client.execute(
                "console.log('before');\nthrow new TypeError('boom');", language="javascript"
            )
            # Long enough that the line is out before the loop, however busy the
            # machine: console.log writes the text and the line feed separately.
            slow = await client.execute(
                "console.log('started'); while (true) {}",
                language="javascript",
                limits={"timeout_ms": 1000},
            )
    assert isinstance(ok, ExecutionResult)
    assert (ok.status, ok.ok, ok.result, ok.stdout) == ("ok", True, 42, "hi\n")
    assert ok.execution_id.startswith("ex_")
    assert ok.executor == "wasm-js"
    assert ok.raise_for_status() is ok

    assert (failed.status, failed.ok, failed.stdout) == ("error", False, "before\n")
    assert failed.error is not None
    assert (failed.error.type, failed.error.message) == ("TypeError", "boom")
    with pytest.raises(ProgramFailed, match="status error: TypeError: boom") as caught:
        failed.raise_for_status()
    assert caught.value.result is failed

    assert slow.status == "timeout"
    assert slow.stdout == "started\n"


async def test_twenty_concurrent_executions_on_one_connection(started: Any) -> None:
    server, info = started
    results: dict[int, ExecutionResult] = {}
    with trio.fail_after(WAIT_S * 2):
        async with AsyncClient(unix_path=info.unix_path) as client:

            async def run(n: int) -> None:
                results[n] = await client.execute(
                    "inputs.n * 2", language="javascript", inputs={"n": n}
                )

            async with trio.open_nursery() as nursery:
                for n in range(20):
                    nursery.start_soon(run, n)
            connections = len(server.connections)
    assert {n: r.result for n, r in results.items()} == {n: n * 2 for n in range(20)}
    assert all(r.ok for r in results.values())
    assert len({r.execution_id for r in results.values()}) == 20
    assert connections == 1


async def test_a_timed_out_call_leaves_the_connection_usable_and_cancels_it(
    started: Any,
) -> None:
    server, info = started
    with trio.fail_after(WAIT_S * 2):
        async with AsyncClient(unix_path=info.unix_path) as client:
            with pytest.raises(Timeout, match=r"execute: no answer within 0\.5 s"):
                await client.execute(
                    "while (true) {}",
                    language="javascript",
                    limits={"timeout_ms": 120_000},
                    timeout_s=0.5,
                )
            # The abandoned execution is cancelled on the daemon, long before its own limit.
            while len(server.executions):
                await trio.sleep(0.02)
            result = await client.execute("1 + 1", language="javascript")
            whoami = await client.whoami()
            connections = len(server.connections)
    assert result.result == 2
    assert whoami is not None
    assert connections == 1


async def test_reconnects_after_the_daemon_restarts(start_daemon: Any, make_config: Any) -> None:
    config = make_config(**NO_DENO)
    first, info = await start_daemon(config)
    with trio.fail_after(WAIT_S * 2):
        async with AsyncClient(unix_path=info.unix_path) as client:
            before = await client.execute("'first'", language="javascript")
            first.shutdown()
            while first.connections or client.is_connected:
                await trio.sleep(0.02)
            second, _ = await start_daemon(config)
            # Not a read: sent only because the drop was seen before it was sent.
            after = await client.execute("'second'", language="javascript")
            whoami = await client.whoami()
            reconnected = len(second.connections)
    assert (before.result, after.result) == ("first", "second")
    assert whoami is not None
    assert reconnected == 1


async def test_tool_discovery_and_calls(start_daemon: Any) -> None:
    server, info = await start_daemon(upstreams=[ECHO], **NO_DENO)
    await wait_upstreams(server, "echo")
    with trio.fail_after(WAIT_S):
        async with AsyncClient(unix_path=info.unix_path) as client:
            tools = {tool.name: tool for tool in await client.tools()}
            schema = await client.tool_schema("echo.add")
            declarations = await client.sdk("python", namespace="echo")
            added = await client.call_tool("echo.add", {"a": 2, "b": 3})
            failed = await client.call_tool("echo__fail", {"message": "nope"})
            with pytest.raises(NotFound):
                await client.tool_schema("echo.no_such_tool")
    assert {"echo__echo", "echo__add", "execute_python"} <= tools.keys()
    assert (tools["echo__add"].path, tools["echo__add"].upstream) == ("echo.add", "echo")
    assert tools["echo__add"].input_schema["type"] == "object"
    assert (schema.id, schema.path, schema.upstream) == ("echo__add", "echo.add", "echo")
    assert "def add(" in declarations
    assert (added.is_error, added.value, added.text) == (False, {"sum": 5}, "5")
    assert (failed.is_error, failed.text) == (True, "nope")


async def test_wire_errors_raise_their_classes(started: Any) -> None:
    _, info = started
    with trio.fail_after(WAIT_S):
        async with AsyncClient(unix_path=info.unix_path) as client:
            with pytest.raises(MethodNotFound) as no_method:
                await client.call("no/such/method")
            with pytest.raises(InvalidParams) as bad_params:
                await client.execute("1", language="cobol")
            with pytest.raises(ExecutorUnavailable):
                await client.execute("1", language="python", executor="pyodide")
            with pytest.raises(NotFound):
                await client.cancel("ex_nope")
            # The connection survives every one of them.
            await client.ping()
    assert no_method.value.code == MethodNotFound.code == -32601
    assert bad_params.value.data["field"] == "language"
    assert isinstance(bad_params.value, RpcError)
