"""Generated conversations against one `Connection`'s slots, held requests and questions.

A peer sends requests, notifications and batches that answer at once, wait on a gate,
or ask the peer a question; it opens gates, answers questions (alone or inside a
batch) and cancels requests by id (`notifications/cancelled`) in a generated order, with
one to three slots. The properties, once every gate is open and every question
answered: each request with an id is answered exactly once (a result, an overloaded
refusal, or a cancelled one that never ran), nothing else is answered, with one slot
single requests ran in the order they were read, and the connection holds nothing (no
busy count, no held request, every slot free).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.core.errors import Overloaded, RequestCancelled
from conduit.daemon.connection import Connection, ConnectionLimits
from tests.daemon.fakes import FakeDispatch, Lines, open_connection
from tests.fuzz.strategies import run_counts

KINDS = ("quick", "gate0", "gate1", "ask")
CANCELLED = RequestCancelled().message
SAID = {"said": "ok"}

kind = st.sampled_from(KINDS)
item = st.tuples(st.sampled_from(["req", "note"]), kind)
steps = st.lists(
    st.one_of(
        item,
        st.tuples(st.just("batch"), st.lists(item, min_size=1, max_size=3)),
        st.tuples(st.just("open"), st.sampled_from([0, 1])),
        st.tuples(st.just("answer"), st.booleans()),
        st.tuples(st.just("cancel"), st.integers(0, 40)),
        st.tuples(st.just("settle"), st.none()),
    ),
    max_size=30,
)


@dataclass
class Peer:
    """What the peer has sent, and what came back."""

    lines: Lines
    ids: itertools.count[int] = field(default_factory=itertools.count)
    expected: set[int] = field(default_factory=set)  # ids of every request sent
    singles: list[int] = field(default_factory=list)  # single requests, in order sent
    replies: list[Any] = field(default_factory=list)
    questions: list[Any] = field(default_factory=list)  # ids not answered yet

    def message(self, what: str, kind: str) -> dict[str, Any]:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": kind}
        if what == "req":
            message["id"] = next(self.ids)
            self.expected.add(message["id"])
        return message

    async def read(self) -> None:
        while True:
            line = json.loads(await self.lines.raw())
            if isinstance(line, dict) and "method" in line:
                self.questions.append(line["id"])
            else:
                self.replies.extend(line if isinstance(line, list) else [line])

    async def answer(self, in_batch: bool) -> None:
        if self.questions:
            answer = {"jsonrpc": "2.0", "id": self.questions.pop(0), "result": SAID}
            await self.lines.send([answer] if in_batch else answer)


def _dispatch(gates: list[trio.Event]) -> FakeDispatch:
    async def quick(params: Any, peer: Any, principal: Any) -> Any:
        return {}

    def gated(gate: trio.Event) -> Any:
        async def wait(params: Any, peer: Any, principal: Any) -> Any:
            await gate.wait()
            return {}

        return wait

    async def ask(params: Any, peer: Connection, principal: Any) -> Any:
        return await peer.ask("sampling/createMessage", {})

    async def cancelled(params: Any, peer: Connection, principal: Any) -> None:
        peer.cancel_request(params["requestId"])

    return FakeDispatch(
        quick=quick,
        gate0=gated(gates[0]),
        gate1=gated(gates[1]),
        ask=ask,
        notifications__cancelled=cancelled,
    )


async def _converse(plan: list[tuple[str, Any]], slots: int) -> None:
    gates = [trio.Event(), trio.Event()]
    dispatch = _dispatch(gates)
    limits = ConnectionLimits(max_message_bytes=4096, max_in_flight=slots, max_auth_failures=3)
    async with trio.open_nursery() as nursery:
        lines, connection, _ = open_connection(nursery, dispatch, limits)
        peer = Peer(lines)
        nursery.start_soon(peer.read)
        for step, arg in plan:
            if step in ("req", "note"):
                message = peer.message(step, arg)
                if "id" in message:
                    peer.singles.append(message["id"])
                await lines.send(message)
            elif step == "batch":
                await lines.send([peer.message(what, kind) for what, kind in arg])
            elif step == "open":
                gates[arg].set()
            elif step == "answer":
                await peer.answer(arg)
            elif step == "cancel":
                params = {"requestId": arg}
                await lines.send(
                    {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}
                )
            else:
                await trio.testing.wait_all_tasks_blocked()
        for gate in gates:
            gate.set()
        with trio.fail_after(10):  # questions asked late (by held requests) answered too
            while len(peer.replies) < len(peer.expected) or connection._busy:
                await trio.testing.wait_all_tasks_blocked()
                await peer.answer(False)
        _check(peer, connection, dispatch, slots)
        nursery.cancel_scope.cancel()


def _check(peer: Peer, connection: Connection, dispatch: FakeDispatch, slots: int) -> None:
    ids = [reply["id"] for reply in peer.replies]
    assert sorted(ids) == sorted(peer.expected), "a request answered twice, or never"
    refused = {r["id"] for r in peer.replies if "error" in r}
    cancelled = {r["id"] for r in peer.replies if r.get("error", {}).get("message") == CANCELLED}
    assert all(
        r["error"]["code"] == Overloaded.code or r["id"] in cancelled
        for r in peer.replies
        if "error" in r
    ), peer.replies
    assert not cancelled & {ident for _, ident in dispatch.calls}, "a cancelled request ran"
    if slots == 1:  # with more, requests given slots freed together start together
        ran = [ident for _, ident in dispatch.calls if ident in set(peer.singles)]
        assert ran == [i for i in peer.singles if i not in refused], "requests out of turn"
    assert (connection._busy, connection._held, connection._held_by_id) == (0, 0, {})
    assert connection._slots.value == slots


@pytest.mark.parametrize("examples", run_counts(20_000, parts=4))
def test_every_request_is_answered_once_in_turn_and_nothing_is_kept(examples: int) -> None:
    @settings(max_examples=examples, deadline=None, database=None)
    @given(steps, st.integers(min_value=1, max_value=3))
    def prop(plan: list[tuple[str, Any]], slots: int) -> None:
        trio.run(_converse, plan, slots)

    prop()
