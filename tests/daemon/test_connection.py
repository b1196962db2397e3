"""`Connection` on its own: framing, refusals, concurrency, back-pressure, closing, auth
and deadlines, over in-memory streams with a fake dispatcher. No daemon is started."""

from __future__ import annotations

import contextlib
import json
import socket
from typing import Any

import pytest
import trio
import trio.testing

from conduit.core.errors import (
    InvalidRequest,
    MethodNotFound,
    Overloaded,
    ParseError,
    Unauthenticated,
)
from conduit.core.left_calls import LeftCalls
from conduit.daemon.connection import Connection, ConnectionLimits
from tests.daemon.fakes import (
    LIMITS,
    OWNER,
    TOKEN,
    WAIT_S,
    FakeDispatch,
    Lines,
    known_token,
    open_connection,
)


def reply(ident: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "result": result}


# ---- framing -----------------------------------------------------------------------


def answers_once_open(gate: trio.Event) -> Any:
    """A handler that answers `{"slow": true}` once `gate` is set."""

    async def slow(params: Any, peer: Any, principal: Any) -> Any:
        await gate.wait()
        return {"slow": True}

    return slow


async def test_a_request_is_answered_with_one_line(nursery: trio.Nursery) -> None:
    peer, _, dispatch = open_connection(nursery)
    await peer.send_line(b'{"jsonrpc":"2.0","id":1,"method":"ping"}')
    assert await peer.raw() == b'{"jsonrpc":"2.0","id":1,"result":{}}'
    assert dispatch.calls == [("ping", 1)]


async def test_blank_lines_and_crlf_are_tolerated(nursery: trio.Nursery) -> None:
    peer, _, dispatch = open_connection(nursery)
    await peer.send_line(b"")
    await peer.send_line(b'{"jsonrpc":"2.0","id":"a","method":"ping"}\r')
    assert await peer.recv() == reply("a", {})
    assert dispatch.refusals == []


async def test_bad_json_answers_parse_error_and_keeps_the_connection(
    nursery: trio.Nursery,
) -> None:
    peer, _, dispatch = open_connection(nursery)
    await peer.send_line('{"jsonrpc": "2.0", "id": 1, "method": "ping"')
    error = await peer.recv()
    assert error["id"] is None
    assert error["error"]["code"] == ParseError.code
    assert "one JSON object per line" in error["error"]["message"]
    assert await peer.request(2, "ping") == reply(2, {})
    assert dispatch.refusals == [(None, ParseError.code)]
    assert dispatch.calls == [("ping", 2)]


async def test_an_oversize_line_is_refused_and_the_connection_stays_usable(
    nursery: trio.Nursery,
) -> None:
    peer, _, dispatch = open_connection(nursery)
    huge = {"jsonrpc": "2.0", "id": 7, "method": "ping", "params": {"x": "a" * 100_000}}
    await peer.send(huge)
    error = await peer.recv()
    assert error == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {
            "code": InvalidRequest.code,
            "message": "message too large: a line may hold at most 4096 bytes; "
            "the line was discarded",
        },
    }
    assert await peer.request(8, "ping") == reply(8, {})
    assert dispatch.calls == [("ping", 8)]  # nothing of the long line reached a method
    assert dispatch.refusals == [(None, InvalidRequest.code)]


async def test_invalid_utf8_is_a_parse_error(nursery: trio.Nursery) -> None:
    peer, _, _ = open_connection(nursery)
    await peer.send_line(b'{"jsonrpc":"2.0","id":1,"method":"\xff\xfe"}')
    error = await peer.recv()
    assert (error["id"], error["error"]["code"]) == (None, ParseError.code)
    assert "utf-8" in error["error"]["message"]
    assert await peer.request(2, "ping") == reply(2, {})


@pytest.mark.parametrize(
    ("line", "ident", "code"),
    [
        (rb'{"jsonrpc":"2.0","id":1,"method":"\ud800"}', 1, MethodNotFound.code),
        (rb'{"jsonrpc":"2.0","id":"\udfff","method":"nope"}', "\ufffd", MethodNotFound.code),
        (rb'{"jsonrpc":"2.0","id":1e400,"method":"ping"}', None, ParseError.code),
        (rb'{"jsonrpc":"2.0","id":NaN,"method":"ping"}', None, ParseError.code),
        # The rest of the line is readable: its error goes to its id, whose sender (a
        # sandbox's call) would otherwise wait for an answer that names no request.
        (
            b'{"jsonrpc":"2.0","id":4,"method":"ping","params":{"n":' + b"7" * 5000 + b"}}",
            4,
            ParseError.code,
        ),
        (rb'{"jsonrpc":"2.0","id":"n","method":"ping","params":{"n":NaN}}', "n", ParseError.code),
        (
            b'{"jsonrpc":"2.0","id":6,"method":"ping","params":{"n":'
            + b"[" * 3000
            + b"]" * 3000
            + b"}}",
            6,
            ParseError.code,
        ),
    ],
    ids=[
        "lone-surrogate-method",
        "lone-surrogate-id",
        "1e400-id",
        "nan-id",
        "5000-digits",
        "nan-param",
        "nested-too-deep",
    ],
)
async def test_unrepresentable_text_is_answered_with_valid_json(
    nursery: trio.Nursery, line: bytes, ident: Any, code: int
) -> None:
    limits = ConnectionLimits(max_message_bytes=65536, max_in_flight=8, max_auth_failures=3)
    peer, _, _ = open_connection(nursery, limits=limits)
    await peer.send_line(line)
    text = (await peer.raw()).decode("utf-8")  # strict: a lone surrogate would not survive
    assert "\\ud8" not in text.lower() and "\\udf" not in text.lower()
    error = json.loads(text)
    assert (error["id"], error["error"]["code"]) == (ident, code)
    assert await peer.request(2, "ping") == reply(2, {})


@pytest.mark.parametrize(
    ("message", "fragment"),
    [
        ({"jsonrpc": "1.0", "id": 1, "method": "ping"}, '"jsonrpc" must be "2.0"'),
        ({"jsonrpc": "2.0", "id": 1}, '"method" must be'),
        ({"jsonrpc": "2.0", "id": [1], "method": "ping"}, '"id" must be'),
        ({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": [1]}, '"params" must be'),
        ({"jsonrpc": "2.0", "id": 1, "method": "ping", "auth": "x"}, '"auth" must be'),
        ("just a string", "must be a JSON object"),
    ],
)
async def test_invalid_requests_say_what_is_wrong(
    nursery: trio.Nursery, message: Any, fragment: str
) -> None:
    peer, _, dispatch = open_connection(nursery)
    await peer.send(message)
    error = (await peer.recv())["error"]
    assert error["code"] == InvalidRequest.code
    assert fragment in error["message"]
    assert dispatch.calls == []
    assert [code for _, code in dispatch.refusals] == [InvalidRequest.code]


async def test_a_missing_jsonrpc_member_is_accepted_for_people_typing(
    nursery: trio.Nursery,
) -> None:
    peer, _, _ = open_connection(nursery)
    await peer.send_line('{"id": 5, "method": "ping"}')
    assert await peer.recv() == reply(5, {})


async def test_notifications_are_dispatched_and_never_answered(nursery: trio.Nursery) -> None:
    peer, _, dispatch = open_connection(nursery)
    await peer.send({"jsonrpc": "2.0", "method": "ping"})
    await peer.send({"jsonrpc": "2.0", "method": "no/such/method"})
    # The next line on the wire must be this request's reply, not a null or an error.
    assert await peer.request(1, "ping") == reply(1, {})
    assert sorted(name for name, _ in dispatch.calls) == ["no/such/method", "ping", "ping"]


async def test_a_batch_is_answered_as_an_array_without_notifications(
    nursery: trio.Nursery,
) -> None:
    peer, _, _ = open_connection(nursery)
    await peer.send(
        [
            {"jsonrpc": "2.0", "id": 1, "method": "ping"},
            {"jsonrpc": "2.0", "method": "ping"},
            {"jsonrpc": "2.0", "id": 2, "method": "pnig"},
            {"foo": "bar"},
        ]
    )
    answers = await peer.recv()
    assert isinstance(answers, list) and len(answers) == 3
    by_id = {item["id"]: item for item in answers if item["id"] is not None}
    assert by_id[1] == reply(1, {})
    assert by_id[2]["error"]["code"] == MethodNotFound.code
    assert [a["error"]["code"] for a in answers if a["id"] is None] == [InvalidRequest.code]


async def test_an_empty_batch_is_refused_and_a_batch_of_notifications_is_silent(
    nursery: trio.Nursery,
) -> None:
    peer, _, _ = open_connection(nursery)
    await peer.send([])
    assert (await peer.recv())["error"]["code"] == InvalidRequest.code
    await peer.send([{"jsonrpc": "2.0", "method": "ping"}])
    assert await peer.request(1, "ping") == reply(1, {})


# ---- concurrency and back-pressure --------------------------------------------------


async def test_pipelined_requests_run_concurrently_and_answer_by_id(
    nursery: trio.Nursery,
) -> None:
    gate = trio.Event()
    slow = answers_once_open(gate)

    async def fast(params: Any, peer: Any, principal: Any) -> Any:
        gate.set()
        return {"fast": True}

    peer, _, _ = open_connection(nursery, FakeDispatch(slow=slow, fast=fast))
    await peer.send({"jsonrpc": "2.0", "id": "s", "method": "slow"})
    await peer.send({"jsonrpc": "2.0", "id": "f", "method": "fast"})
    assert await peer.recv() == reply("f", {"fast": True})
    assert await peer.recv() == reply("s", {"slow": True})


async def test_the_in_flight_cap_applies_back_pressure_not_errors(nursery: trio.Nursery) -> None:
    release = trio.Event()
    running = peak = 0

    async def hold(params: Any, peer: Any, principal: Any) -> Any:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await release.wait()
        running -= 1
        return {}

    limits = ConnectionLimits(max_message_bytes=4096, max_in_flight=2, max_auth_failures=3)
    peer, _, dispatch = open_connection(nursery, FakeDispatch(hold=hold), limits)
    for ident in range(20):
        await peer.send({"jsonrpc": "2.0", "id": ident, "method": "hold"})
    await trio.testing.wait_all_tasks_blocked()
    assert (running, len(dispatch.calls)) == (2, 2)  # the rest wait unread
    release.set()
    answers = [await peer.recv() for _ in range(20)]
    assert sorted(a["id"] for a in answers) == list(range(20))
    assert all(a["result"] == {} for a in answers)
    assert peak == 2


async def _cancel_held(params: Any, peer: Any, principal: Any) -> None:
    """`notifications/cancelled` as the daemon's: no program of that id runs, so the
    connection is asked to cancel the request itself."""
    peer.cancel_request(params["requestId"])


def _noting(told: list[Any]) -> Any:
    """A `notifications/cancelled` handler that notes which request it names."""

    async def cancelled(params: Any, peer: Any, principal: Any) -> None:
        told.append(params["requestId"])

    return cancelled


async def test_a_cancellation_is_served_while_every_slot_is_taken(
    nursery: trio.Nursery,
) -> None:
    """A client whose calls fill its slots can still cancel one: requests past the cap
    are held (as many as may run) and read past, and a notification to the daemon
    runs at once, without a slot."""
    release = trio.Event()
    told: list[Any] = []
    limits = ConnectionLimits(max_message_bytes=4096, max_in_flight=2, max_auth_failures=3)
    dispatch = FakeDispatch(hold=answers_once_open(release), notifications__cancelled=_noting(told))
    peer, connection, _ = open_connection(nursery, dispatch, limits)
    for ident in range(4):  # two run, two are held
        await peer.send({"jsonrpc": "2.0", "id": ident, "method": "hold"})
    await peer.send(
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 0}}
    )
    await trio.testing.wait_all_tasks_blocked()
    assert told == [0]
    assert dispatch.calls == [("hold", 0), ("hold", 1), ("notifications/cancelled", None)]
    # A request that is not a notification to the daemon still waits its turn.
    await peer.send({"jsonrpc": "2.0", "id": 9, "method": "ping"})
    await peer.send({"jsonrpc": "2.0", "method": "hold"})
    await trio.testing.wait_all_tasks_blocked()
    assert len(dispatch.calls) == 3
    release.set()
    answers = [await peer.recv() for _ in range(5)]
    assert sorted(a["id"] for a in answers) == [0, 1, 2, 3, 9]
    await trio.testing.wait_all_tasks_blocked()
    assert (connection._busy, connection._held) == (0, 0)


async def test_a_held_request_cancelled_is_answered_so_and_never_runs(
    nursery: trio.Nursery,
) -> None:
    release = trio.Event()
    limits = ConnectionLimits(max_message_bytes=4096, max_in_flight=1, max_auth_failures=3)
    dispatch = FakeDispatch(hold=answers_once_open(release), notifications__cancelled=_cancel_held)
    peer, connection, _ = open_connection(nursery, dispatch, limits)
    await peer.send({"jsonrpc": "2.0", "id": "running", "method": "hold"})
    await peer.send({"jsonrpc": "2.0", "id": "held", "method": "hold"})
    for ident in ("held", "nobody", 5):
        await peer.send(
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": ident}}
        )
    await peer.send({"jsonrpc": "2.0", "id": "kept", "method": "ping"})
    refused = await peer.recv()
    assert refused["id"] == "held" and refused["error"]["code"] == InvalidRequest.code
    assert "cancelled" in refused["error"]["message"]
    release.set()
    assert sorted([(await peer.recv())["id"] for _ in range(2)]) == ["kept", "running"]
    await trio.testing.wait_all_tasks_blocked()
    assert ("hold", "held") not in dispatch.calls
    assert (connection._busy, connection._held, connection._held_by_id) == (0, 0, {})


async def test_a_held_request_cancelled_as_its_slot_comes_still_never_runs(
    nursery: trio.Nursery,
) -> None:
    """The cancel lands after the slot is handed to the held request and before its
    task resumes: it is still answered as cancelled, and the slot goes back."""
    release = trio.Event()
    ran: list[str] = []

    async def work(params: Any, peer: Any, principal: Any) -> Any:
        ran.append("victim")
        return {}

    limits = ConnectionLimits(max_message_bytes=4096, max_in_flight=1, max_auth_failures=3)
    dispatch = FakeDispatch(hold=answers_once_open(release), work=work)
    peer, connection, _ = open_connection(nursery, dispatch, limits)
    await peer.send({"jsonrpc": "2.0", "id": "running", "method": "hold"})
    await peer.send({"jsonrpc": "2.0", "id": "victim", "method": "work"})
    await trio.testing.wait_all_tasks_blocked()
    said: list[bool] = []
    handing = connection._slots.release

    def release_then_cancel() -> None:
        handing()  # the held task is given the slot, and has not run yet
        said.append(connection.cancel_request("victim"))

    connection._slots.release = release_then_cancel  # type: ignore[method-assign]
    release.set()
    replies = {reply["id"]: reply for reply in [await peer.recv(), await peer.recv()]}
    assert said[0] is True and ran == []
    assert replies["victim"]["error"]["code"] == InvalidRequest.code
    connection._slots.release = handing  # type: ignore[method-assign]
    await trio.testing.wait_all_tasks_blocked()
    assert (connection._busy, connection._held, connection._slots.value) == (0, 0, 1)


async def test_cancelling_held_requests_of_a_peer_that_reads_nothing_keeps_no_more(
    nursery: trio.Nursery,
) -> None:
    """A cancelled request's answer may wait for room: it is counted as held meanwhile,
    so a peer that sends request after request and cancels each, reading nothing, is
    not read past the held cap (each held a whole message)."""
    limits = ConnectionLimits(max_message_bytes=1 << 16, max_in_flight=2, max_auth_failures=3)
    dispatch = FakeDispatch(
        hold=answers_once_open(trio.Event()), notifications__cancelled=_cancel_held
    )
    peer, connection, _ = open_connection(nursery, dispatch, limits, lockstep=True)
    sent: list[int] = []

    async def send_and_cancel() -> None:
        for ident in range(600):
            pad = {"pad": "x" * 1000}
            await peer.send({"jsonrpc": "2.0", "id": ident, "method": "hold", "params": pad})
            params = {"requestId": ident}
            await peer.send(
                {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}
            )
            sent.append(ident)

    for ident in range(2):
        await peer.send({"jsonrpc": "2.0", "id": f"run{ident}", "method": "hold"})
    async with trio.open_nursery() as sending:
        sending.start_soon(send_and_cancel)
        await trio.testing.wait_all_tasks_blocked()
        sending.cancel_scope.cancel()
    assert len(sent) < 600  # the connection stopped reading
    assert connection._held == 2
    assert connection._busy <= 2 + 2 + 1  # running, held, one notification in the reader


async def test_a_refused_notification_past_full_slots_is_written_whole_when_draining() -> None:
    """The reader serves it; its refusal goes through the writer, so draining (which
    cancels the reader) leaves no half line before the answers that follow."""
    release = trio.Event()
    ours, theirs = trio.socket.socketpair()
    for sock, option in ((theirs, socket.SO_SNDBUF), (ours, socket.SO_RCVBUF)):
        sock.setsockopt(socket.SOL_SOCKET, option, 4096)
    limits = ConnectionLimits(max_message_bytes=4 << 20, max_in_flight=1, max_auth_failures=3)
    dispatch = FakeDispatch(hold=answers_once_open(release))
    connection = Connection(
        trio.SocketStream(theirs),
        dispatch,
        limits,
        transport="unix",
        authenticate=known_token,
        principal=OWNER,
    )
    client = trio.SocketStream(ours)
    async with client, trio.open_nursery() as nursery:
        nursery.start_soon(connection.run)
        await client.send_all(b'{"jsonrpc":"2.0","id":"run","method":"hold"}\n')
        await trio.testing.wait_all_tasks_blocked()
        refused = {"jsonrpc": "x" * 500_000, "method": "notifications/whatever"}
        await client.send_all(json.dumps(refused).encode() + b"\n")
        while not dispatch.refusals:  # read, and refused
            await trio.testing.wait_all_tasks_blocked()
        await trio.testing.wait_all_tasks_blocked()  # its refusal is being written
        connection.stop_reading()
        release.set()
        data = b""
        with trio.move_on_after(WAIT_S):
            while chunk := await client.receive_some(1 << 20):
                data += chunk
        lines = [json.loads(line) for line in data.split(b"\n") if line]
        assert [line.get("id") for line in lines] == [None, "run"]
        nursery.cancel_scope.cancel()


async def test_a_peer_without_a_token_has_nothing_held(nursery: trio.Nursery) -> None:
    """Held requests are for a peer that has shown who it is: one that has not holds no
    more messages than its slots, and is not read past them."""
    release = trio.Event()
    limits = ConnectionLimits(max_message_bytes=4096, max_in_flight=1, max_auth_failures=3)
    dispatch = FakeDispatch(hold=answers_once_open(release))
    peer, connection, _ = open_connection(nursery, dispatch, limits, principal=None)
    for ident in range(3):
        await peer.send({"jsonrpc": "2.0", "id": ident, "method": "hold"})
    await trio.testing.wait_all_tasks_blocked()
    assert (connection._held, len(dispatch.calls)) == (0, 1)
    release.set()
    assert sorted([(await peer.recv())["id"] for _ in range(3)]) == [0, 1, 2]


async def test_past_as_many_held_as_may_run_the_reader_waits_without_asks(
    nursery: trio.Nursery,
) -> None:
    """Held requests are bounded: with no question pending, the reader stops reading
    there (back-pressure), and a cancellation behind them waits too."""
    release = trio.Event()
    told: list[Any] = []
    limits = ConnectionLimits(max_message_bytes=4096, max_in_flight=1, max_auth_failures=3)
    dispatch = FakeDispatch(hold=answers_once_open(release), notifications__cancelled=_noting(told))
    peer, connection, _ = open_connection(nursery, dispatch, limits)
    for ident in range(3):  # one runs, one is held, the reader waits with the third
        await peer.send({"jsonrpc": "2.0", "id": ident, "method": "hold"})
    await peer.send(
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 0}}
    )
    await trio.testing.wait_all_tasks_blocked()
    assert (connection._held, told) == (1, [])
    release.set()
    assert sorted([(await peer.recv())["id"] for _ in range(3)]) == [0, 1, 2]
    assert told == [0]


def _asking(asked: list[Any] | None = None, gate: trio.Event | None = None) -> Any:
    """A handler that asks its peer a question (once `gate` is set) and answers with
    the peer's answer."""

    async def ask(params: Any, peer: Any, principal: Any) -> Any:
        if gate is not None:
            await gate.wait()
        return await peer.ask("sampling/createMessage", {"q": 1})

    return ask


SAID = {"role": "assistant", "content": {"type": "text", "text": "ok"}, "model": "m"}


async def test_while_the_peer_is_asked_requests_past_the_cap_are_held_not_its_answer(
    nursery: trio.Nursery,
) -> None:
    release = trio.Event()
    limits = ConnectionLimits(max_message_bytes=4096, max_in_flight=2, max_auth_failures=3)
    dispatch = FakeDispatch(ask=_asking(), hold=answers_once_open(release))
    peer, _, _ = open_connection(nursery, dispatch, limits)
    await peer.send({"jsonrpc": "2.0", "id": "a", "method": "ask"})
    question = await peer.recv()
    assert question["method"] == "sampling/createMessage"
    for ident in range(4):  # one takes the other slot, two are held, one is too many
        await peer.send({"jsonrpc": "2.0", "id": ident, "method": "hold"})
    refused = await peer.recv()
    assert refused["id"] == 3 and refused["error"]["code"] == Overloaded.code, refused
    assert "waits for its answer" in refused["error"]["message"]
    await peer.send({"jsonrpc": "2.0", "id": question["id"], "result": SAID})
    assert await peer.recv() == reply("a", SAID)
    await trio.testing.wait_all_tasks_blocked()
    # The held requests took the freed slot in the order they came.
    assert dispatch.calls == [("ask", "a"), ("hold", 0), ("hold", 1)]
    release.set()
    answers = [await peer.recv() for _ in range(3)]
    assert sorted(a["id"] for a in answers) == [0, 1, 2]
    assert dispatch.calls[3:] == [("hold", 2)]


async def test_a_question_asked_while_the_reader_waits_for_a_slot_is_answered(
    nursery: trio.Nursery,
) -> None:
    """The reader waits for a slot (nothing asked yet); then a call in flight asks its
    peer, whose answer is behind the request the reader holds."""
    release, gate = trio.Event(), trio.Event()
    limits = ConnectionLimits(max_message_bytes=4096, max_in_flight=2, max_auth_failures=3)
    dispatch = FakeDispatch(ask=_asking(gate=gate), hold=answers_once_open(release))
    peer, _, _ = open_connection(nursery, dispatch, limits)
    await peer.send({"jsonrpc": "2.0", "id": "a", "method": "ask"})
    for ident in range(2):
        await peer.send({"jsonrpc": "2.0", "id": ident, "method": "hold"})
    await trio.testing.wait_all_tasks_blocked()
    assert len(dispatch.calls) == 2  # the reader waits for a slot
    gate.set()
    question = await peer.recv()
    await peer.send({"jsonrpc": "2.0", "id": question["id"], "result": SAID})
    assert await peer.recv() == reply("a", SAID)
    release.set()
    assert sorted([(await peer.recv())["id"] for _ in range(2)]) == [0, 1]


async def test_a_request_read_after_a_held_one_never_starts_before_it(
    nursery: trio.Nursery,
) -> None:
    """A slot that frees as a held request's task starts goes to that request, not to
    the next one read (Trio runs a pass's tasks in any order: many trials)."""
    limits = ConnectionLimits(max_message_bytes=4096, max_in_flight=2, max_auth_failures=3)

    async def trial() -> list[Any]:
        gate = trio.Event()

        async def spin(params: Any, peer: Any, principal: Any) -> Any:
            await gate.wait()
            for _ in range(2):
                await trio.lowlevel.checkpoint()

        dispatch = FakeDispatch(ask=_asking(), spin=spin, rec=answers_once_open(trio.Event()))
        async with trio.open_nursery() as inner:
            peer, _, _ = open_connection(inner, dispatch, limits)
            await peer.send({"jsonrpc": "2.0", "id": "a", "method": "ask"})
            await peer.recv()  # the question, left unanswered
            await peer.send({"jsonrpc": "2.0", "method": "spin"})  # the other slot
            await trio.testing.wait_all_tasks_blocked()
            gate.set()  # it frees the slot while the requests below are read
            lines = [{"jsonrpc": "2.0", "id": i, "method": "rec"} for i in range(3)]
            await peer.stream.send_all(b"".join(json.dumps(m).encode() + b"\n" for m in lines))
            await trio.testing.wait_all_tasks_blocked()
            inner.cancel_scope.cancel()
        return [ident for name, ident in dispatch.calls if name == "rec"]

    orders = [await trial() for _ in range(30)]
    assert all(order == list(range(len(order))) for order in orders), orders


async def test_requests_refused_while_held_are_answered_as_json_rpc_says(
    nursery: trio.Nursery,
) -> None:
    """Past the held cap: a notification gets no reply, a batch an array of errors."""
    limits = ConnectionLimits(max_message_bytes=4096, max_in_flight=1, max_auth_failures=3)
    dispatch = FakeDispatch(ask=_asking(), hold=answers_once_open(trio.Event()))
    peer, _, _ = open_connection(nursery, dispatch, limits)
    await peer.send({"jsonrpc": "2.0", "id": "a", "method": "ask"})
    await peer.recv()  # the question
    await peer.send({"jsonrpc": "2.0", "id": 0, "method": "hold"})  # held
    await peer.send({"jsonrpc": "2.0", "method": "hold"})
    await peer.send([{"jsonrpc": "2.0", "id": 1, "method": "hold"}, {"method": "hold"}])
    refused = await peer.recv()
    assert [r["id"] for r in refused] == [1], refused
    assert refused[0]["error"]["code"] == Overloaded.code
    assert dispatch.refusals == [(None, Overloaded.code)] * 3


async def test_an_answer_in_a_batch_is_taken_at_once_whatever_waits(
    nursery: trio.Nursery,
) -> None:
    limits = ConnectionLimits(max_message_bytes=4096, max_in_flight=1, max_auth_failures=3)
    peer, _, _ = open_connection(nursery, FakeDispatch(ask=_asking()), limits)
    await peer.send({"jsonrpc": "2.0", "id": "a", "method": "ask"})  # the only slot
    question = await peer.recv()
    answer = {"jsonrpc": "2.0", "id": question["id"], "result": SAID}
    await peer.send([answer, {"jsonrpc": "2.0", "id": 1, "method": "ping"}])
    assert await peer.recv() == reply("a", SAID)
    # The rest of the batch is a request like any other, run once the slot frees.
    assert await peer.recv() == [reply(1, {})]


async def test_draining_answers_a_request_that_was_waiting_for_a_slot(
    nursery: trio.Nursery,
) -> None:
    release = trio.Event()
    limits = ConnectionLimits(max_message_bytes=4096, max_in_flight=1, max_auth_failures=3)
    peer, connection, _ = open_connection(
        nursery, FakeDispatch(hold=answers_once_open(release)), limits
    )
    await peer.send({"jsonrpc": "2.0", "id": 0, "method": "hold"})
    await peer.send({"jsonrpc": "2.0", "id": 1, "method": "ping"})  # read, no slot yet
    await trio.testing.wait_all_tasks_blocked()
    connection.stop_reading()
    release.set()
    assert sorted(line["id"] for line in await peer.until_closed()) == [0, 1]


async def test_requests_read_together_start_in_order_and_let_other_tasks_run(
    nursery: trio.Nursery,
) -> None:
    """Many requests arriving in one write: each task starts in the order its request
    came, and a task beside the connection runs while they are being read."""
    ticks = 0
    seen: list[int] = []

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.lowlevel.checkpoint()

    async def burst(params: Any, peer: Any, principal: Any) -> Any:
        seen.append(ticks)
        return {}

    count = 320
    limits = ConnectionLimits(max_message_bytes=4096, max_in_flight=10_000, max_auth_failures=3)
    peer, _, dispatch = open_connection(nursery, FakeDispatch(burst=burst), limits)
    lines = "\n".join(
        json.dumps({"jsonrpc": "2.0", "id": i, "method": "burst"}) for i in range(count)
    )
    async with trio.open_nursery() as ticking:
        ticking.start_soon(tick)
        await peer.send_line(lines)
        answers = [await peer.recv() for _ in range(count)]
        ticking.cancel_scope.cancel()
    assert sorted(a["id"] for a in answers) == list(range(count))
    assert [ident for _, ident in dispatch.calls] == list(range(count))
    # Spawned in one pass, the burst's tasks would all see the same tick.
    assert len(set(seen)) >= count // 2


async def flood_unread(nursery: trio.Nursery, peer: Lines, method: str, count: int) -> None:
    """Send `count` requests for `method` in one write, reading nothing, and return
    once the connection has done all it will: the write is lockstep, so it waits for
    the connection to read, which it stops doing."""
    lines = b"".join(
        json.dumps({"jsonrpc": "2.0", "id": i, "method": method}).encode() + b"\n"
        for i in range(count)
    )

    async def flood() -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await peer.stream.send_all(lines)

    nursery.start_soon(flood)
    await trio.testing.wait_all_tasks_blocked()


async def test_a_peer_that_stops_reading_is_not_buffered_without_bound(
    nursery: trio.Nursery,
) -> None:
    peer, connection, dispatch = open_connection(nursery, lockstep=True)
    await flood_unread(nursery, peer, "ping", 2000)
    answered = len(dispatch.calls)
    # A reply being written, two outboxes' worth waiting (one taken by the writer, one
    # queued behind it), and a request per slot: then reading stops.
    assert 0 < answered <= 1 + 2 * 256 + LIMITS.max_in_flight
    assert not connection.notify_nowait("note", {})  # the outbox is full: dropped
    await trio.testing.wait_all_tasks_blocked()
    assert len(dispatch.calls) == answered
    await peer.stream.aclose()  # the peer goes: the connection ends, its tasks with it
    with trio.fail_after(WAIT_S):
        await peer.ended.wait()


async def test_a_peer_that_stops_reading_is_not_sent_more_bytes_than_the_outbox_holds(
    nursery: trio.Nursery,
) -> None:
    """Large replies to a client reading none of them: the daemon holds a bounded
    number of bytes for it (16 MiB), not 256 replies' worth whatever their size."""

    async def big(params: Any, peer: Any, principal: Any) -> Any:
        return "x" * 1_000_000

    peer, _, dispatch = open_connection(nursery, FakeDispatch(big=big), lockstep=True)
    await flood_unread(nursery, peer, "big", 200)
    # One reply being written, 16 MiB of them queued, one waiting per request slot.
    assert 0 < len(dispatch.calls) <= 1 + 17 + LIMITS.max_in_flight
    await peer.stream.aclose()
    with trio.fail_after(WAIT_S):
        await peer.ended.wait()


# ---- closing ------------------------------------------------------------------------


async def test_a_half_closed_peer_still_gets_its_replies(nursery: trio.Nursery) -> None:
    gate = trio.Event()
    slow = answers_once_open(gate)
    peer, _, _ = open_connection(nursery, FakeDispatch(slow=slow))
    await peer.send_line(b'{"id":1,"method":"slow"}\n{"id":2,"method":"ping"}')
    await peer.stream.send_eof()
    assert await peer.recv() == reply(2, {})
    gate.set()
    assert await peer.until_closed() == [reply(1, {"slow": True})]


async def test_a_peer_gone_entirely_cancels_its_requests(nursery: trio.Nursery) -> None:
    cancelled = trio.Event()
    started = trio.Event()

    async def hang(params: Any, peer: Any, principal: Any) -> Any:
        try:
            started.set()
            await trio.sleep_forever()
        finally:
            cancelled.set()

    peer, _, _ = open_connection(nursery, FakeDispatch(hang=hang))
    await peer.send_line(b'{"id":1,"method":"hang"}')
    with trio.fail_after(WAIT_S):
        await started.wait()
        await peer.reset()
        await peer.ended.wait()
    assert cancelled.is_set()


def _held_until(gate: trio.Event, done: list[Any]) -> Any:
    """A handler that finishes once `gate` is set, noting its params in `done`."""

    async def slow(params: Any, peer: Any, principal: Any) -> Any:
        await gate.wait()
        done.append(params)
        return {}

    return slow


@pytest.mark.parametrize("room", [2, 1])
async def test_a_sandboxs_requests_go_on_within_their_room_once_it_is_gone(
    nursery: trio.Nursery, room: int
) -> None:
    """A worker that wrote its calls and exited: those it wrote are still read, and go
    on to their end while the room for calls left behind has space, with nobody to
    answer; a client's would be cancelled (above)."""
    gate = trio.Event()
    done: list[Any] = []
    left = LeftCalls(limit=room)
    dispatch = FakeDispatch(slow=_held_until(gate, done))
    peer, _, _ = open_connection(nursery, dispatch, transport="sandbox", left_calls=left)
    await peer.send_line(
        b'{"id":1,"method":"slow","params":{"n":1}}\n'
        b'{"id":2,"method":"slow","params":{"n":2}}\n{"id":3,"method":"ping"}'
    )
    await peer.stream.aclose()  # gone: the answer to `ping` cannot be written
    await trio.testing.wait_all_tasks_blocked()
    assert left.held(OWNER.name)[0] == room and not peer.ended.is_set()
    gate.set()
    with trio.fail_after(WAIT_S):
        await peer.ended.wait()
    assert len(done) == room and left.count == 0


async def test_a_sandbox_that_ends_its_stream_has_exited_and_left_its_requests(
    nursery: trio.Nursery,
) -> None:
    """A worker does not half-close: its end of the stream means it exited, and what
    it asked for is counted as left behind at once (not when an answer fails)."""
    gate = trio.Event()
    done: list[Any] = []
    left = LeftCalls()
    dispatch = FakeDispatch(slow=_held_until(gate, done))
    peer, _, _ = open_connection(nursery, dispatch, transport="sandbox", left_calls=left)
    await peer.send_line(b'{"id":1,"method":"slow"}')
    await peer.stream.send_eof()
    await trio.testing.wait_all_tasks_blocked()
    assert left.count == 1
    gate.set()
    assert await peer.until_closed() == []  # nobody to answer
    assert done and left.count == 0


async def test_stop_reading_answers_what_is_in_flight_then_closes(
    nursery: trio.Nursery,
) -> None:
    gate = trio.Event()
    slow = answers_once_open(gate)
    peer, connection, dispatch = open_connection(nursery, FakeDispatch(slow=slow))
    await peer.send_line(b'{"id":1,"method":"slow"}')
    await trio.testing.wait_all_tasks_blocked()
    connection.stop_reading()
    await peer.send_line(b'{"id":2,"method":"ping"}')  # not read any more
    gate.set()
    assert await peer.until_closed() == [reply(1, {"slow": True})]
    assert dispatch.calls == [("slow", 1)]


async def test_a_method_may_notify_before_it_answers(nursery: trio.Nursery) -> None:
    async def chatty(params: Any, peer: Any, principal: Any) -> Any:
        await peer.notify("note", {"n": 1})
        return {"done": True}

    peer, _, _ = open_connection(nursery, FakeDispatch(chatty=chatty))
    await peer.send({"jsonrpc": "2.0", "id": 1, "method": "chatty"})
    assert await peer.recv() == {"jsonrpc": "2.0", "method": "note", "params": {"n": 1}}
    assert await peer.recv() == reply(1, {"done": True})


async def test_a_notification_sent_nowait_leaves_replies_in_order(nursery: trio.Nursery) -> None:
    """`notify_nowait` (the tool list changed) counts as queued like every other message
    for the writer: uncounted, the writer's count went below zero, and a reply could
    then be written ahead of the notification its method sent before it."""

    async def chatty(params: Any, peer: Any, principal: Any) -> Any:
        await peer.notify("note", {"n": 1})
        return {"done": True}

    peer, connection, _ = open_connection(nursery, FakeDispatch(chatty=chatty))
    assert connection.notify_nowait("changed", {})
    assert await peer.recv() == {"jsonrpc": "2.0", "method": "changed", "params": {}}
    # Trio runs the tasks woken together in either order: a few rounds see both.
    for ident in range(20):
        await peer.send({"jsonrpc": "2.0", "id": ident, "method": "chatty"})
        assert await peer.recv() == {"jsonrpc": "2.0", "method": "note", "params": {"n": 1}}
        assert await peer.recv() == reply(ident, {"done": True})


async def test_a_notification_given_up_mid_write_leaves_no_half_line(
    nursery: trio.Nursery,
) -> None:
    """A notification whose sender stops waiting (streamed output's stall timeout)
    while the socket is full: the peer, reading again, gets whole lines only."""
    note = {"text": "x" * 4_000_000}  # far more than a socket's buffers hold
    returned = trio.Event()

    async def impatient(params: Any, peer: Any, principal: Any) -> Any:
        with trio.move_on_after(0.2):
            await peer.notify("big", note)
        returned.set()
        return {"done": True}

    ours, theirs = trio.socket.socketpair()
    stream = trio.SocketStream(theirs)
    peer = Lines(trio.SocketStream(ours), stream)
    connection = Connection(
        stream,
        FakeDispatch(impatient=impatient),
        LIMITS,
        transport="unix",
        authenticate=known_token,
        principal=OWNER,
    )

    async def serve() -> None:
        async with stream:
            await connection.run()
        peer.ended.set()

    nursery.start_soon(serve)
    await peer.send({"jsonrpc": "2.0", "id": 1, "method": "impatient"})
    with trio.fail_after(WAIT_S):
        await returned.wait()  # the peer has read nothing yet
    lines = [await peer.raw(), await peer.raw()]
    messages = [json.loads(line) for line in lines]  # each line is whole JSON
    assert messages[-1] == reply(1, {"done": True})
    assert all(m.get("params") == note for m in messages[:-1])
    assert (await peer.request(2, "ping")) == reply(2, {})
    await peer.stream.aclose()
    with trio.fail_after(WAIT_S):
        await peer.ended.wait()


# ---- authentication -------------------------------------------------------------------


async def test_a_bearer_token_names_the_caller_of_one_request(nursery: trio.Nursery) -> None:
    peer, _, _ = open_connection(nursery, principal=None)
    anonymous = await peer.request(1, "auth/whoami")
    bearer = await peer.request(2, "auth/whoami", auth={"bearerToken": TOKEN})
    assert (anonymous["result"], bearer["result"]) == ({"principal": None}, {"principal": "owner"})


async def test_a_bad_bearer_token_is_refused_before_dispatch(nursery: trio.Nursery) -> None:
    peer, _, dispatch = open_connection(nursery, principal=None)
    refused = await peer.request(1, "ping", auth={"bearerToken": "wrong"})
    assert refused["id"] == 1
    assert refused["error"]["code"] == Unauthenticated.code
    assert dispatch.calls == []
    assert dispatch.refusals == [("ping", Unauthenticated.code)]


async def test_repeated_bad_tokens_close_the_connection(nursery: trio.Nursery) -> None:
    peer, _, _ = open_connection(nursery, principal=None)
    for ident in (1, 2):
        answer = await peer.request(ident, "auth/login", {"token": "wrong"})
        assert "check CONDUIT_TOKEN" in answer["error"]["message"]
    await peer.send({"jsonrpc": "2.0", "id": 3, "method": "auth/login", "params": {"token": "x"}})
    [last] = await peer.until_closed()
    assert last["id"] == 3
    assert "3 failures in a row" in last["error"]["message"]


async def test_a_login_holds_for_later_requests(nursery: trio.Nursery) -> None:
    peer, connection, _ = open_connection(nursery, principal=None)
    assert not connection.authenticated
    login = await peer.request(1, "auth/login", {"token": TOKEN})
    assert login["result"]["principal"]["name"] == "owner"
    assert (await peer.request(2, "auth/whoami"))["result"] == {"principal": "owner"}
    assert connection.authenticated


# ---- deadlines, on the autojump clock -------------------------------------------------


def _deadlines(**seconds: float) -> ConnectionLimits:
    return ConnectionLimits(max_message_bytes=4096, max_in_flight=8, max_auth_failures=3, **seconds)


async def test_an_unauthenticated_connection_is_told_then_closed_at_its_deadline(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    peer, _, _ = open_connection(nursery, limits=_deadlines(auth_s=5), principal=None)
    start = trio.current_time()
    assert (await peer.request(1, "ping"))["result"] == {}  # allowed, and not a login
    [farewell] = await peer.until_closed(3600)
    assert 5 <= trio.current_time() - start < 6
    assert farewell["id"] is None
    assert farewell["error"]["code"] == Unauthenticated.code
    assert "no valid token within 5 s" in farewell["error"]["message"]


@pytest.mark.parametrize(
    "auth",
    [
        {"method": "auth/login", "params": {"token": TOKEN}},
        {"method": "auth/whoami", "auth": {"bearerToken": TOKEN}},
    ],
    ids=["login", "bearer"],
)
async def test_a_login_or_a_bearer_token_lifts_the_auth_deadline(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, auth: dict[str, Any]
) -> None:
    peer, connection, _ = open_connection(nursery, limits=_deadlines(auth_s=5), principal=None)
    assert "result" in await peer.request(1, **auth)
    await trio.sleep(60)
    assert connection.authenticated
    assert (await peer.request(2, "ping"))["result"] == {}


async def test_a_connection_idle_past_its_timeout_is_closed(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    peer, _, _ = open_connection(nursery, limits=_deadlines(auth_s=5, idle_s=30))
    await trio.sleep(20)
    assert (await peer.request(1, "ping"))["result"] == {}
    last = trio.current_time()
    [farewell] = await peer.until_closed(3600)
    assert 30 <= trio.current_time() - last < 31
    assert farewell["error"]["code"] == Overloaded.code
    assert "idle" in farewell["error"]["message"]


async def test_bytes_arriving_and_work_in_flight_are_not_idle(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    release = trio.Event()

    async def hold(params: Any, peer: Any, principal: Any) -> Any:
        await release.wait()
        return {}

    async def subscribe(params: Any, peer: Any, principal: Any) -> Any:
        peer.start_stream(release.wait)
        return {}

    dispatch = FakeDispatch(hold=hold, subscribe=subscribe)
    peer, _, _ = open_connection(nursery, dispatch, _deadlines(idle_s=30))
    for _ in range(5):  # a line trickling in, slower than a request but within 30 s
        await peer.stream.send_all(b" ")
        await trio.sleep(25)
    await peer.stream.send_all(b'{"id":1,"method":"hold"}\n')
    await peer.stream.send_all(b'{"id":2,"method":"subscribe"}\n')
    assert (await peer.recv())["id"] == 2
    await trio.sleep(300)  # a long execution, then a subscription, in flight
    release.set()
    freed = trio.current_time()
    lines = await peer.until_closed(3600)
    assert [line["id"] for line in lines] == [1, None]
    assert 30 <= trio.current_time() - freed < 31
