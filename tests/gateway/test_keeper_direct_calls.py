"""What the keeper does to a tool call that bypasses the SDK session (`DirectRequests`),
in our own code over the SDK's public API: the session's stamp, taken from what the
session wrote, and its checks of the answer."""

from __future__ import annotations

from typing import Any

import mcp_types as types
import trio
from mcp.shared.message import SessionMessage
from mcp_types.version import KNOWN_PROTOCOL_VERSIONS

from conduit.gateway import keeper

OLD = "2025-11-25"
NEW = "2026-07-28"


class _Answers:
    """A `DirectRequests` that answers every request with `raw`, and keeps the params."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw
        self.sent: list[tuple[str, dict[str, Any]]] = []

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.sent.append((method, params))
        return dict(self.raw)


async def _call(version: str, raw: dict[str, Any], meta: Any = None) -> types.CallToolResult:
    connection = keeper._Connection(version=version, call_meta=meta)
    connection.direct = _Answers(raw)  # type: ignore[assignment]
    return await keeper._call_direct(connection, "echo", {"text": "x"})


def test_a_later_revisions_result_fields_are_known_for_older_versions_only() -> None:
    older = keeper._later_revision_fields("tools/call", OLD)
    assert {"resultType", "inputRequests"} <= older
    assert "content" not in older
    assert keeper._later_revision_fields("tools/call", KNOWN_PROTOCOL_VERSIONS[-1]) == set()
    assert keeper._later_revision_fields("tools/call", "1999-01-01") == set()


async def test_a_later_revisions_field_is_dropped_on_an_older_session() -> None:
    """It is outside the older contract: the result is read as that version defines it."""
    raw = {"content": [], "resultType": "later"}
    assert (await _call(OLD, raw)).result_type == "complete"
    assert (await _call(NEW, raw)).result_type == "later"


def test_a_negative_ttl_becomes_zero_and_nothing_else_changes() -> None:
    for ttl, floored in [(-5, 0), (-0.5, 0), (7, 7), (True, True), ("-1", "-1")]:
        raw = {"ttlMs": ttl}
        keeper._floor_ttl(raw)
        assert raw == {"ttlMs": floored}


async def test_a_direct_call_carries_the_stamp_and_the_arguments() -> None:
    stamp = {types.PROTOCOL_VERSION_META_KEY: NEW}
    connection = keeper._Connection(version=NEW, call_meta=stamp)
    answers = _Answers({"content": [{"type": "text", "text": "x"}], "resultType": "complete"})
    connection.direct = answers  # type: ignore[assignment]
    result = await keeper._call_direct(connection, "echo", {"text": "x"})
    assert result.content == [types.TextContent(type="text", text="x")]
    assert answers.sent == [
        ("tools/call", {"name": "echo", "arguments": {"text": "x"}, "_meta": stamp})
    ]


class _Written:
    def __init__(self) -> None:
        self.items: list[SessionMessage] = []
        self.closed = False

    async def send(self, item: SessionMessage, /) -> None:
        self.items.append(item)

    async def aclose(self) -> None:
        self.closed = True


def _request(method: str, meta: dict[str, Any] | None) -> SessionMessage:
    params = {"_meta": meta} if meta is not None else None
    return SessionMessage(types.JSONRPCRequest(jsonrpc="2.0", id=1, method=method, params=params))


async def test_the_stamp_is_the_sessions_own_from_its_tools_list() -> None:
    stamp = {
        types.PROTOCOL_VERSION_META_KEY: NEW,
        types.CLIENT_INFO_META_KEY: {"name": "conduit", "version": "1"},
        types.CLIENT_CAPABILITIES_META_KEY: {},
    }
    connection = keeper._Connection()
    inner = _Written()
    writes = keeper._StampedWrites(inner, connection)  # type: ignore[arg-type]
    sent = [
        _request("subscriptions/listen", {**stamp, "other": 1}),
        # A trace context is per request: it is not part of the stamp.
        _request("tools/list", {**stamp, "traceparent": "00-ab-cd-01"}),
        _request("tools/call", {types.PROTOCOL_VERSION_META_KEY: "elsewhere"}),
    ]
    async with writes:
        for item in sent:
            await writes.send(item)
    assert inner.items == sent
    assert inner.closed
    assert connection.call_meta == stamp


async def test_a_tools_list_without_a_stamp_leaves_none() -> None:
    """Before 2026-07-28 the session stamps no `_meta`."""
    connection = keeper._Connection(call_meta={"stale": True})
    writes = keeper._StampedWrites(_Written(), connection)  # type: ignore[arg-type]
    await writes.send(_request("tools/list", None))
    assert connection.call_meta is None
    with trio.fail_after(1):
        await writes.aclose()
