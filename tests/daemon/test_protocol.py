"""The wire protocol over a real socket: framing, errors, batches, notifications, pipelining."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from conduit.core.errors import InvalidParams, InvalidRequest, MethodNotFound, ParseError
from conduit.daemon.dispatcher import MethodRouter
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


@pytest.fixture
async def raw(info: Any, connect: Any) -> Any:
    return await connect(info)


@pytest.mark.parametrize("transport", ["unix", "tcp"])
async def test_ping_over_each_transport(start_daemon: Any, connect: Any, transport: str) -> None:
    _, info = await start_daemon(server={"tcp": "127.0.0.1:0"}, **NO_EXECUTORS)
    client = await connect(info, transport)
    if transport == "tcp":
        await client.call("auth/login", {"token": MASTER_TOKEN})
    reply = await client.request("ping")
    assert reply == {"jsonrpc": "2.0", "id": reply["id"], "result": {}}


async def test_bad_json_answers_parse_error_and_keeps_the_connection(raw: Any) -> None:
    await raw.send_line('{"jsonrpc": "2.0", "id": 1, "method": "ping"')
    reply = await raw.recv()
    assert reply["id"] is None
    assert reply["error"]["code"] == ParseError.code
    assert "one JSON object per line" in reply["error"]["message"]
    assert (await raw.request("ping"))["result"] == {}


async def test_oversize_line_is_refused_and_the_connection_stays_usable(
    start_daemon: Any, connect: Any
) -> None:
    _, info = await start_daemon(server={"max_message_bytes": 4096}, **NO_EXECUTORS)
    client = await connect(info)
    huge = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "ping", "params": {"x": "a" * 100_000}})
    await client.send_line(huge)
    reply = await client.recv()
    assert reply["id"] is None
    assert reply["error"]["code"] == InvalidRequest.code
    assert "4096 bytes" in reply["error"]["message"]
    assert (await client.request("ping"))["result"] == {}


async def test_blank_lines_and_crlf_are_tolerated(raw: Any) -> None:
    await raw.send_line("")
    await raw.send_line('{"jsonrpc":"2.0","id":"a","method":"ping"}\r')
    assert await raw.recv() == {"jsonrpc": "2.0", "id": "a", "result": {}}


async def test_notifications_are_never_answered(raw: Any) -> None:
    await raw.send({"jsonrpc": "2.0", "method": "ping"})
    await raw.send({"jsonrpc": "2.0", "method": "no/such/method"})
    await raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    # The next reply on the wire must be for this request, not a null or an error line.
    assert await raw.request("ping") == {"jsonrpc": "2.0", "id": 1, "result": {}}


async def test_batch_is_answered_as_an_array_without_notifications(raw: Any) -> None:
    await raw.send(
        [
            {"jsonrpc": "2.0", "id": 1, "method": "ping"},
            {"jsonrpc": "2.0", "method": "ping"},
            {"jsonrpc": "2.0", "id": 2, "method": "pnig"},
            {"foo": "bar"},
        ]
    )
    reply = await raw.recv()
    assert isinstance(reply, list)
    by_id = {item["id"]: item for item in reply if item["id"] is not None}
    assert by_id[1] == {"jsonrpc": "2.0", "id": 1, "result": {}}
    assert by_id[2]["error"]["code"] == MethodNotFound.code
    assert "did you mean 'ping'" in by_id[2]["error"]["message"]
    assert [item["error"]["code"] for item in reply if item["id"] is None] == [InvalidRequest.code]
    assert len(reply) == 3


async def test_empty_batch_and_all_notification_batch(raw: Any) -> None:
    await raw.send([])
    reply = await raw.recv()
    assert reply["error"]["code"] == InvalidRequest.code
    await raw.send([{"jsonrpc": "2.0", "method": "ping"}])
    assert (await raw.request("ping"))["id"] == 1


@pytest.mark.parametrize(
    ("message", "fragment"),
    [
        ({"jsonrpc": "1.0", "id": 1, "method": "ping"}, '"jsonrpc" must be "2.0"'),
        ({"jsonrpc": "2.0", "id": 1}, '"method" must be'),
        ({"jsonrpc": "2.0", "id": [1], "method": "ping"}, '"id" must be'),
        ({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": [1]}, '"params" must be'),
        ("just a string", "must be a JSON object"),
    ],
)
async def test_invalid_requests_say_what_is_wrong(raw: Any, message: Any, fragment: str) -> None:
    await raw.send(message)
    reply = await raw.recv()
    assert reply["error"]["code"] == InvalidRequest.code
    assert fragment in reply["error"]["message"]


async def test_missing_jsonrpc_member_is_accepted_for_people_typing(raw: Any) -> None:
    await raw.send_line('{"id": 5, "method": "ping"}')
    assert await raw.recv() == {"jsonrpc": "2.0", "id": 5, "result": {}}


async def test_unknown_param_is_named(raw: Any) -> None:
    reply = await raw.request("auth/login", {"tokn": "x"})
    error = reply["error"]
    assert error["code"] == InvalidParams.code
    assert error["data"]["field"] in {"tokn", "token"}
    assert "rpc/discover" in error["message"]


async def test_pipelined_requests_run_concurrently_and_answer_by_id(
    start_daemon: Any, connect: Any
) -> None:
    daemon, info = await start_daemon(**NO_EXECUTORS)
    client = await connect(info)
    gate = trio.Event()
    order: list[str] = []

    async def slow(params: Any, ctx: Any) -> Any:
        order.append("slow-start")
        await gate.wait()
        return {"slow": True}

    async def fast(params: Any, ctx: Any) -> Any:
        order.append("fast")
        gate.set()
        return {"fast": True}

    # Methods of this test's daemon alone.
    routes = MethodRouter()
    routes.method("test/slow", scope=None, description="test")(slow)
    routes.method("test/fast", scope=None, description="test")(fast)
    daemon.methods.add(*routes.specs)
    await client.send({"jsonrpc": "2.0", "id": "s", "method": "test/slow"})
    await client.send({"jsonrpc": "2.0", "id": "f", "method": "test/fast"})
    first, second = await client.recv(), await client.recv()
    assert first == {"jsonrpc": "2.0", "id": "f", "result": {"fast": True}}
    assert second == {"jsonrpc": "2.0", "id": "s", "result": {"slow": True}}
    assert order == ["slow-start", "fast"]


async def test_in_flight_cap_applies_back_pressure_not_errors(
    start_daemon: Any, connect: Any
) -> None:
    _, info = await start_daemon(server={"max_in_flight_per_connection": 2}, **NO_EXECUTORS)
    client = await connect(info)
    for ident in range(50):
        await client.send({"jsonrpc": "2.0", "id": ident, "method": "ping"})
    replies = [await client.recv() for _ in range(50)]
    assert sorted(r["id"] for r in replies) == list(range(50))
    assert all(r["result"] == {} for r in replies)


async def test_requests_read_together_start_in_order_and_let_other_tasks_run(
    start_daemon: Any, connect: Any
) -> None:
    """Many requests arriving in one write: each task starts in the order its request
    came, and a task beside the connection runs while they are being read."""
    daemon, info = await start_daemon(
        server={"max_in_flight_per_connection": 10_000}, **NO_EXECUTORS
    )
    client = await connect(info)
    ticks = 0
    started: list[tuple[int, int]] = []

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.lowlevel.checkpoint()

    async def burst(params: Any, ctx: Any) -> Any:
        started.append((ctx.request_id, ticks))
        return {}

    routes = MethodRouter()
    routes.method("test/burst", scope=None, description="test")(burst)
    daemon.methods.add(*routes.specs)
    count = 320
    lines = "\n".join(
        json.dumps({"jsonrpc": "2.0", "id": i, "method": "test/burst"}) for i in range(count)
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(tick)
        await client.send_line(lines)
        replies = [await client.recv() for _ in range(count)]
        nursery.cancel_scope.cancel()
    assert sorted(r["id"] for r in replies) == list(range(count))
    assert [n for n, _ in started] == list(range(count))
    # Spawned in one pass, the burst's tasks would all see the same tick.
    assert len({tick for _, tick in started}) >= count // 2


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


async def test_rpc_discover_lists_every_method_with_schema(raw: Any) -> None:
    result = await raw.call("rpc/discover")
    names = {m["name"] for m in result["methods"]}
    expected = {"initialize", "ping", "rpc/discover", "tools/list", "tools/call", "execute"}
    expected |= {"executions/cancel", "executors/list", "auth/login", "auth/whoami"}
    assert expected <= names
    execute = next(m for m in result["methods"] if m["name"] == "execute")
    assert set(execute["params"]["required"]) == {"language", "code"}
    assert result["aliases"]["mcp.executeTypeScript"]["language"] == "typescript"


async def test_initialize_negotiates_the_protocol_version(raw: Any) -> None:
    known = await raw.call("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}})
    assert known["protocolVersion"] == "2025-06-18"
    assert known["serverInfo"]["name"] == "conduit"
    unknown = await raw.call("initialize", {"protocolVersion": "1999-01-01"})
    assert unknown["protocolVersion"] == "2025-11-25"


async def _raw_line(stream: trio.abc.Stream) -> bytes:
    data = b""
    with trio.fail_after(10):
        while not data.endswith(b"\n"):
            chunk = await stream.receive_some(65536)
            assert chunk, "the daemon closed the connection"
            data += chunk
    return data


@pytest.mark.parametrize(
    ("line", "ident", "code"),
    [
        (rb'{"jsonrpc":"2.0","id":1,"method":"\ud800"}', 1, MethodNotFound.code),
        (rb'{"jsonrpc":"2.0","id":"\udfff","method":"nope"}', "\ufffd", MethodNotFound.code),
        (rb'{"jsonrpc":"2.0","id":1e400,"method":"ping"}', None, ParseError.code),
        (rb'{"jsonrpc":"2.0","id":NaN,"method":"ping"}', None, ParseError.code),
        (
            b'{"jsonrpc":"2.0","id":4,"method":"ping","params":{"n":' + b"7" * 5000 + b"}}",
            None,
            ParseError.code,
        ),
    ],
    ids=["lone-surrogate-method", "lone-surrogate-id", "1e400-id", "nan-id", "5000-digits"],
)
async def test_unrepresentable_text_is_answered_with_valid_json(
    info: Any, line: bytes, ident: Any, code: int
) -> None:
    stream = await trio.open_unix_socket(info.unix_path)
    try:
        await stream.send_all(line + b"\n")
        reply = await _raw_line(stream)
        text = reply.decode("utf-8")  # strict: a lone surrogate would not survive this
        assert "\\ud8" not in text.lower() and "\\udf" not in text.lower()
        error = json.loads(text)
        assert (error["id"], error["error"]["code"]) == (ident, code)
        await stream.send_all(b'{"id":2,"method":"ping"}\n')
        assert json.loads(await _raw_line(stream)) == {"jsonrpc": "2.0", "id": 2, "result": {}}
    finally:
        await stream.aclose()


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
