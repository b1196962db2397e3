"""`AskTable`: requests to a client, matched to its answers by id, and nothing else."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from conduit.core.errors import InternalError, Overloaded, RpcError
from conduit.daemon.client_asks import MAX_WAITING, AskTable

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


class Client:
    """What the table sends, kept for the test to answer."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.arrived = trio.Event()

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        self.arrived.set()


async def _asked(table: AskTable, client: Client, nursery: trio.Nursery) -> list[Any]:
    """Start one `ask`; its outcome lands in the returned list."""
    outcome: list[Any] = []

    async def ask() -> None:
        try:
            outcome.append(await table.ask(client.send, "sampling/createMessage", {"a": 1}))
        except RpcError as exc:
            outcome.append(exc)

    client.arrived = trio.Event()
    nursery.start_soon(ask)
    await client.arrived.wait()
    return outcome


async def test_an_answer_reaches_the_request_with_its_id() -> None:
    table, client = AskTable(), Client()
    async with trio.open_nursery() as nursery:
        first = await _asked(table, client, nursery)
        second = await _asked(table, client, nursery)
        one, two = client.sent
        assert one["method"] == "sampling/createMessage" and one["params"] == {"a": 1}
        assert one["id"] != two["id"]
        assert table.answer({"jsonrpc": "2.0", "id": two["id"], "result": {"said": 2}})
        assert table.answer({"jsonrpc": "2.0", "id": one["id"], "result": {"said": 1}})
    assert first == [{"said": 1}] and second == [{"said": 2}]
    assert len(table) == 0


async def test_the_clients_error_is_raised_with_its_code() -> None:
    table, client = AskTable(), Client()
    async with trio.open_nursery() as nursery:
        outcome = await _asked(table, client, nursery)
        error = {"code": -1, "message": "User rejected sampling request"}
        table.answer({"id": client.sent[0]["id"], "error": error})
    [failure] = outcome
    assert isinstance(failure, RpcError)
    assert (failure.code, failure.message) == (-1, "User rejected sampling request")


@pytest.mark.parametrize(
    "answer",
    [
        {"result": "not an object"},
        {"result": None},
        {"error": "not an object"},
        {"error": {"code": True, "message": ["x"]}},
    ],
)
async def test_an_answer_that_is_neither_result_nor_error_object_fails_plainly(
    answer: dict[str, Any],
) -> None:
    table, client = AskTable(), Client()
    async with trio.open_nursery() as nursery:
        outcome = await _asked(table, client, nursery)
        table.answer({"id": client.sent[0]["id"], **answer})
    [failure] = outcome
    assert isinstance(failure, RpcError)
    # A boolean never passes for a code; anything else becomes a plain internal error.
    assert failure.code == InternalError.code


async def test_answers_to_nothing_are_dropped() -> None:
    table, client = AskTable(), Client()
    async with trio.open_nursery() as nursery:
        outcome = await _asked(table, client, nursery)
        ident = client.sent[0]["id"]
        for stray in ("conduit-999", 1, None, [ident], {"id": ident}):
            assert not table.answer({"id": stray, "result": {}})
        assert outcome == []
        assert table.answer({"id": ident, "result": {"ok": True}})
        # A second answer for the same request finds nobody waiting.
        assert not table.answer({"id": ident, "result": {"again": True}})
    assert outcome == [{"ok": True}]


async def test_at_most_max_waiting_wait_and_the_next_fails_at_once() -> None:
    table, client = AskTable(), Client()
    async with trio.open_nursery() as nursery:
        for _ in range(MAX_WAITING):
            await _asked(table, client, nursery)
        with pytest.raises(Overloaded):
            await table.ask(client.send, "elicitation/create", {})
        nursery.cancel_scope.cancel()
    # Cancelled waiters take their entries with them.
    assert len(table) == 0


@given(messages=st.lists(st.dictionaries(st.sampled_from(["id", "result", "error"]), JSON)))
def test_no_message_a_client_sends_breaks_the_table(messages: list[dict[str, Any]]) -> None:
    async def main() -> None:
        table, client = AskTable(), Client()
        async with trio.open_nursery() as nursery:
            outcome = await _asked(table, client, nursery)
            for message in messages:
                table.answer(message)
            table.answer({"id": client.sent[0]["id"], "result": {"last": True}})
        # Only an answer with the request's own id counts; a generated one may be it.
        assert len(outcome) == 1
        assert isinstance(outcome[0], dict | RpcError)

    trio.run(main)
