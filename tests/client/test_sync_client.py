"""`Client`, the blocking client: against a real daemon (run from a worker thread, so
the daemon keeps serving on the test's event loop) and, for streamed output and events,
against a scripted peer on a socket pair."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import trio

from conduit.client import (
    Client,
    ConnectionFailed,
    Event,
    InvalidParams,
    MethodNotFound,
    OutputChunk,
    ProgramFailed,
    SubscriptionDropped,
    Timeout,
    Unauthenticated,
)
from conduit.client.endpoint import Backoff
from tests.client.fake_daemon import wire_result
from tests.client.helpers import NO_DENO, client_options
from tests.conftest import MASTER_TOKEN, WAIT_S


async def in_thread(work: Callable[[], Any]) -> Any:
    """Run blocking client code off the event loop the daemon serves on."""
    with trio.fail_after(WAIT_S * 2):
        return await trio.to_thread.run_sync(work)


@pytest.fixture
async def started(start_daemon: Any) -> Any:
    return await start_daemon(server={"tcp": "127.0.0.1:0"}, **NO_DENO)


@pytest.mark.parametrize("transport", ["unix", "tcp"])
async def test_executes_over_each_transport(started: Any, transport: str) -> None:
    _, info = started
    token = MASTER_TOKEN if transport == "tcp" else None

    def work() -> Any:
        with Client(**client_options(info, transport), token=token) as client:
            return client.whoami(), client.execute("console.log('hi'); 6 * 7", language="js")

    whoami, result = await in_thread(work)
    assert whoami["kind"] == ("master" if transport == "tcp" else "peer")
    assert (result.status, result.result, result.stdout) == ("ok", 42, "hi\n")


async def test_failures_are_typed_results_and_errors_are_classes(started: Any) -> None:
    _, info = started

    def work() -> Any:
        with Client(unix_path=info.unix_path) as client:
            failed = client.execute("throw new RangeError('no')", language="javascript")
            with pytest.raises(MethodNotFound):
                client.call("no/such/method")
            with pytest.raises(InvalidParams) as bad:
                client.execute("1", language="javascript", limits={"timeout_ms": -1})
            return failed, bad.value

    failed, bad = await in_thread(work)
    assert (failed.status, failed.error.type) == ("error", "RangeError")
    with pytest.raises(ProgramFailed, match="RangeError: no"):
        failed.raise_for_status()
    assert bad.data["field"] == "limits.timeout_ms"


async def test_a_wrong_token_is_unauthenticated_and_no_daemon_is_connection_failed(
    started: Any, short_dir: Any
) -> None:
    _, info = started
    nowhere = str(short_dir / "nobody.sock")

    def work() -> tuple[BaseException, BaseException]:
        with pytest.raises(Unauthenticated) as refused:
            Client(**client_options(info, "tcp"), token="cdt_wrong").connect()
        fast = Backoff(attempts=2, first_delay_s=0)
        with pytest.raises(ConnectionFailed) as missing:
            Client(unix_path=nowhere, token="", backoff=fast).ping()
        return refused.value, missing.value

    refused, missing = await in_thread(work)
    assert "not valid" in str(refused)
    assert nowhere in str(missing)


async def test_a_session_keeps_state_and_the_block_closes_it(started: Any) -> None:
    _, info = started

    def work() -> Any:
        with Client(unix_path=info.unix_path) as client:
            with client.session("javascript") as session:
                session.execute("const base = 40;")
                step = session.execute("base + 2")
                with session.stream("console.log(base); base") as run:
                    streamed = "".join(chunk.text for chunk in run)
            return step, streamed, session.session_id, client.sessions()

    step, streamed, session_id, after = await in_thread(work)
    assert (step.result, step.session_id, streamed) == (42, session_id, "40\n")
    assert after == []


async def test_a_timed_out_call_leaves_the_connection_usable(started: Any) -> None:
    server, info = started

    def work() -> Any:
        with Client(unix_path=info.unix_path) as client:
            with pytest.raises(Timeout, match=r"within 0\.5 s"):
                client.execute(
                    "while (true) {}",
                    language="javascript",
                    limits={"timeout_ms": 120_000},
                    timeout_s=0.5,
                )
            return client.execute("'after'", language="javascript"), client.is_connected

    result, connected = await in_thread(work)
    assert (result.result, connected) == ("after", True)
    # The abandoned execution was cancelled, long before its own two-minute limit.
    with trio.fail_after(WAIT_S):
        while len(server.executions):
            await trio.sleep(0.02)


async def test_reconnects_after_the_daemon_restarts(start_daemon: Any, make_config: Any) -> None:
    config = make_config(**NO_DENO)
    first, info = await start_daemon(config)
    client = Client(unix_path=info.unix_path)
    try:
        before = await in_thread(lambda: client.execute("'first'", language="javascript"))
        first.shutdown()
        with trio.fail_after(WAIT_S):
            while first.connections:
                await trio.sleep(0.02)
        second, _ = await start_daemon(config)
        # Not a read, so never resent: it works because the drop is noticed before sending.
        after = await in_thread(lambda: client.execute("'second'", language="javascript"))
        connections = len(second.connections)
    finally:
        client.close()
    assert (before.result, after.result) == ("first", "second")
    assert connections == 1


# ---- a scripted peer ---------------------------------------------------------------------


@pytest.fixture
def peer() -> Iterator[tuple[socket.socket, Client]]:
    """A `Client` on one end of a socket pair, and the other end for the test to script."""
    ours, theirs = socket.socketpair()
    ours.settimeout(WAIT_S)
    client = Client(connector=lambda: theirs, token="")
    yield ours, client
    client.close()
    ours.close()


def send(sock: socket.socket, *messages: dict[str, Any]) -> None:
    sock.sendall(b"".join(json.dumps({"jsonrpc": "2.0", **m}).encode() + b"\n" for m in messages))


def requests(sock: socket.socket, count: int) -> list[dict[str, Any]]:
    buffer = b""
    while buffer.count(b"\n") < count:
        buffer += sock.recv(65536)
    return [json.loads(line) for line in buffer.splitlines()]


def answer_next(sock: socket.socket, result: Any) -> None:
    """Answer the next request with `result` (from a thread: the client blocks meanwhile)."""
    (request,) = requests(sock, 1)
    send(sock, {"id": request["id"], "result": result})


def output(text: str, seq: int) -> dict[str, Any]:
    params = {"execution_id": "ex_1", "stream": "stdout", "text": text, "seq": seq}
    return {"method": "execution/output", "params": params}


def test_stream_yields_output_then_the_result(peer: Any) -> None:
    sock, client = peer
    # The first request gets id 1: the output and the answer can be written ahead.
    send(sock, output("a\n", 0), output("b\n", 1), {"id": 1, "result": wire_result("ex_1")})
    run = client.stream("print('a'); print('b')")
    chunks = list(run)
    assert chunks == [
        OutputChunk("ex_1", "stdout", "a\n", 0),
        OutputChunk("ex_1", "stdout", "b\n", 1),
    ]
    assert (run.result.execution_id, run.execution_id) == ("ex_1", "ex_1")
    assert requests(sock, 1)[0]["params"]["stream"] is True


def test_a_timed_out_stream_is_cancelled_and_its_late_reply_skipped(peer: Any) -> None:
    sock, client = peer
    with pytest.raises(Timeout, match=r"within 0\.2 s"):
        list(client.stream("while True: pass", timeout_s=0.2))
    execute, cancel = requests(sock, 2)
    assert (cancel["method"], cancel["params"]) == ("executions/cancel", {"request_id": 1})
    send(
        sock,
        {"id": execute["id"], "result": wire_result("ex_1", status="cancelled")},
        {"id": cancel["id"], "result": {"cancelled": True, "execution_id": "ex_1"}},
    )
    answering = threading.Thread(target=answer_next, args=(sock, "pong"))
    answering.start()
    # Answered by its own reply, not by the late ones before it.
    assert client.call("ping") == "pong"
    answering.join()


def test_events_then_a_drop(peer: Any) -> None:
    sock, client = peer
    reason = "dropped: more than 1024 events were waiting"
    send(
        sock,
        {"id": 1, "result": {"subscription": "sub_1"}},
        {"method": "event", "params": {"type": "tool.called", "subscription": "sub_1"}},
        {"method": "event", "params": {"type": "tool.called", "subscription": "sub_9"}},
        {"method": "event", "params": {"type": "subscription.dropped", "reason": reason}},
    )
    received: list[Event] = []
    with client.subscribe(["tool.called"]) as events, pytest.raises(SubscriptionDropped):
        received.extend(events)
    assert [(e.type, e.subscription) for e in received] == [("tool.called", "sub_1")]
    assert requests(sock, 1)[0]["params"] == {"types": ["tool.called"]}


def test_waiting_for_an_event_is_bounded(peer: Any) -> None:
    sock, client = peer
    send(sock, {"id": 1, "result": {"subscription": "sub_1"}})
    with (
        client.subscribe(event_timeout_s=0.1) as events,
        pytest.raises(Timeout, match="events/subscribe"),
    ):
        next(events)
