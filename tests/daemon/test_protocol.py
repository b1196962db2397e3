"""The wire protocol over a real daemon's sockets: each transport, a half-closed socket,
and one connection failing alone. Framing, refusals, batches and pipelining are the
connection's own (test_connection.py); errors and scopes the dispatcher's
(test_dispatcher.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from tests.conftest import MASTER_TOKEN, RawClient

# Framing and listeners need no sandbox: no executor is started.
NO_EXECUTORS = {
    "executors": {
        "deno": {"enabled": False},
        "wasm_python": {"enabled": False},
        "wasm_js": {"enabled": False},
    }
}


@pytest.fixture
async def info(start_daemon: Any) -> Any:
    _, info = await start_daemon(**NO_EXECUTORS)
    return info


@pytest.mark.parametrize("transport", ["unix", "tcp"])
async def test_ping_over_each_transport(start_daemon: Any, connect: Any, transport: str) -> None:
    _, info = await start_daemon(server={"tcp": "127.0.0.1:0"}, **NO_EXECUTORS)
    client = await connect(info, transport)
    if transport == "tcp":
        await client.call("auth/login", {"token": MASTER_TOKEN})
    reply = await client.request("ping")
    assert reply == {"jsonrpc": "2.0", "id": reply["id"], "result": {}}


async def test_half_closed_client_still_gets_its_replies(info: Any) -> None:
    stream = await trio.open_unix_socket(info.unix_path)
    await stream.send_all(b'{"id":1,"method":"ping"}\n{"id":2,"method":"ping"}\n')
    await stream.send_eof()
    data = b""
    with trio.fail_after(10):
        while chunk := await stream.receive_some(65536):
            data += chunk
    await stream.aclose()
    assert [json.loads(line)["id"] for line in data.splitlines()] == [1, 2]


@pytest.mark.parametrize("transport", ["unix", "sandbox"])
async def test_an_exception_in_one_connection_closes_only_that_connection(
    start_daemon: Any,
    connect: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    transport: str,
) -> None:
    from conduit.daemon import connection as connection_module

    real_encode = connection_module.encode

    def encode(message: Any) -> bytes:
        if isinstance(message, dict) and message.get("id") == "boom":
            raise RuntimeError("cannot encode this reply")
        return real_encode(message)

    monkeypatch.setattr(connection_module, "encode", encode)
    server, info = await start_daemon(**NO_EXECUTORS)
    bystander = await connect(info)
    path = info.unix_path if transport == "unix" else server.callback_address.unix_path
    doomed = RawClient(await trio.open_unix_socket(path))
    try:
        await doomed.send({"jsonrpc": "2.0", "id": "boom", "method": "ping"})
        await doomed.expect_closed()
    finally:
        await doomed.aclose()
    assert (await bystander.request("ping"))["result"] == {}
    assert (await (await connect(info)).request("ping"))["result"] == {}
    left = 2 if transport == "unix" else 0  # the bystander and the one just opened
    with trio.fail_after(10):
        while server.budgets[transport].statistics().open != left:
            await trio.sleep(0.01)  # the slot is given back just after the stream closes
    assert "connection failed and was closed" in caplog.text
