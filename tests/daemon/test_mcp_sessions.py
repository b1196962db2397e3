"""The MCP HTTP sessions table and the Host/Origin policy, each on its own: no daemon,
no sockets; expiry on Trio's autojump clock."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from conduit.core.errors import InvalidRequest
from conduit.daemon import mcp_sessions
from conduit.daemon.auth import ALL_SCOPES, Principal
from conduit.daemon.http_origin import OriginPolicy
from conduit.daemon.mcp_notifications import (
    LEVELS,
    MAX_PROGRESS_CHARS,
    ProgressRelay,
    listens,
    open_upstream_relay,
)
from conduit.daemon.mcp_sessions import Exchange, McpSessions, TooManySessions

ALICE = Principal("alice", "client", ALL_SCOPES)
BOB = Principal("bob", "client", ALL_SCOPES)


def _table(per_principal: int = 2, total: int = 3, idle_s: float = 60.0) -> McpSessions:
    return McpSessions(per_principal, total, idle_s)


async def test_a_session_is_found_only_by_its_own_principal() -> None:
    table = _table()
    session, replaced = table.open(ALICE)
    assert replaced is None
    assert len(session.id) >= 40  # unguessable
    assert table.get(session.id, ALICE) is session
    assert table.get(session.id, BOB) is None
    assert table.get("nope", ALICE) is None


async def test_past_its_cap_a_principal_replaces_its_least_recently_used_idle_session(
    autojump_clock: trio.testing.MockClock,
) -> None:
    table = _table()
    first, _ = table.open(ALICE)
    await trio.sleep(1)
    second, _ = table.open(ALICE)
    await trio.sleep(1)
    first.touch()  # now the second is the least recently used
    _, replaced = table.open(ALICE)
    assert replaced is second
    assert table.get(second.id, ALICE) is None


async def test_a_busy_principal_at_its_cap_and_a_full_table_are_refused() -> None:
    table = _table()
    for _ in range(2):
        session, _ = table.open(ALICE)
        assert session.begin(1, Exchange(trio.CancelScope()))
    with pytest.raises(TooManySessions, match="in flight") as busy:
        table.open(ALICE)
    assert busy.value.busy
    table.open(BOB)
    with pytest.raises(TooManySessions, match="the daemon holds 3") as full:
        table.open(BOB)
    assert not full.value.busy


async def test_idle_sessions_expire_and_are_closed(autojump_clock: trio.testing.MockClock) -> None:
    table = _table(idle_s=10.0)
    closed: list[str] = []
    idle, _ = table.open(ALICE)
    busy, _ = table.open(BOB)

    async def note() -> None:
        closed.append("idle")

    idle.at_close(note)
    scope = trio.CancelScope()
    busy.begin("call", Exchange(scope))
    async with trio.open_nursery() as nursery:
        await nursery.start(table.run)
        await trio.sleep(20)
        assert table.get(idle.id, ALICE) is None and closed == ["idle"]
        assert table.get(busy.id, BOB) is busy  # a request in flight keeps it
        busy.end("call")
        await trio.sleep(20)
        assert table.get(busy.id, BOB) is None
        nursery.cancel_scope.cancel()


async def test_sessions_slow_to_close_are_closed_side_by_side(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Each close has `_CLOSE_S`: expiry and the daemon's stop wait that once, not per
    session, however many hang."""
    idle_s = 10.0
    table = McpSessions(10, 20, idle_s)
    for principal in (ALICE, BOB):
        for _ in range(10):
            session, _ = table.open(principal)
            session.at_close(trio.sleep_forever)
    await trio.sleep(idle_s)
    started = trio.current_time()
    await table._expire(trio.current_time())  # Alice's and Bob's all at once
    assert len(table) == 0
    assert trio.current_time() - started <= mcp_sessions._CLOSE_S + 1
    for _ in range(10):
        session, _ = table.open(ALICE)
        session.at_close(trio.sleep_forever)
    started = trio.current_time()
    await table.close_all()
    assert trio.current_time() - started <= mcp_sessions._CLOSE_S + 1


async def test_closing_a_session_cancels_its_requests_and_refuses_new_ones() -> None:
    table = _table()
    session, _ = table.open(ALICE)
    scope = trio.CancelScope()
    assert session.begin(1, Exchange(scope))
    assert not session.begin(1, Exchange(trio.CancelScope()))  # the id is in flight
    assert session.begin("1", Exchange(trio.CancelScope()))  # "1" is another id
    await session.close()
    assert scope.cancel_called
    assert not session.begin(2, Exchange(trio.CancelScope()))


async def test_notifications_go_to_their_request_stream_only() -> None:
    table = _table()
    session, _ = table.open(ALICE)
    send, receive = trio.open_memory_channel[dict[str, Any]](4)
    session.begin(7, Exchange(trio.CancelScope(), send))
    await session.notify("notifications/progress", {"progress": 1}, request_id=7)
    await session.notify("notifications/progress", {"progress": 2}, request_id=8)
    await session.notify("notifications/progress", {"progress": 3})
    assert receive.receive_nowait()["params"] == {"progress": 1}
    with pytest.raises(trio.WouldBlock):
        receive.receive_nowait()
    assert session.notify_nowait("notifications/tools/list_changed", {}) is False
    with pytest.raises(InvalidRequest):
        session.login("token")


@pytest.mark.parametrize(
    ("host", "origin", "accepted"),
    [
        ("127.0.0.1:8766", None, True),
        ("localhost:8766", "http://localhost:6274", True),
        ("[::1]:8766", "http://[::1]:3000", True),
        ("localhost", "https://127.0.0.1", True),
        ("127.0.0.1", "https://app.example.com", True),  # listed
        ("evil.example.com", None, False),
        ("evil.example.com:8766", "http://evil.example.com", False),
        ("127.0.0.1:8766", "http://evil.example.com", False),
        ("127.0.0.1:8766", "null", False),
        ("127.0.0.1:8766", "file://", False),
        (None, None, False),
        ("[::1", None, False),
        ("127.0.0.1:port", None, False),
        ("127.0.0.1.evil.example.com", None, False),
    ],
)
def test_origin_policy(host: str | None, origin: str | None, accepted: bool) -> None:
    policy = OriginPolicy.from_config(("https://app.example.com/",))
    assert (policy.refusal(host, origin) is None) is accepted


class _Peer:
    """Just enough of a `Peer` to hear notifications."""

    log_level: str | None = None

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def notify(self, method: str, params: dict[str, Any], *, request_id: Any = None) -> None:
        self.sent.append(params)


async def test_progress_is_coalesced_and_bounded(autojump_clock: trio.testing.MockClock) -> None:
    peer = _Peer()
    relay = ProgressRelay(peer, "t", 1)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(relay.run)
        for index in range(1000):  # a tight loop of prints: 1000 pieces in 1 s
            await relay({"text": f"{index:04d}\n"})
            await trio.sleep(0.001)
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    await relay.flush()
    assert 5 <= len(peer.sent) <= 25  # about ten a second
    assert "".join(sent["message"] for sent in peer.sent) == "".join(
        f"{index:04d}\n" for index in range(1000)
    )
    assert [sent["progress"] for sent in peer.sent] == sorted(
        sent["progress"] for sent in peer.sent
    )


async def test_an_upstreams_progress_flood_is_coalesced_and_bounded(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A hostile upstream's progress costs the client what a program's output does."""
    peer = _Peer()
    async with open_upstream_relay(peer, {"progressToken": "t"}, 1) as observer:  # type: ignore[arg-type]
        assert observer is not None and observer.progress is not None
        for index in range(1000):  # 1000 in 1 s, each with a megabyte's message
            await observer.progress(index, 999, "x" * 1_000_000)
            await trio.sleep(0.001)
    assert len(peer.sent) <= 25  # a burst of 10, then ten a second
    assert all(len(params["message"]) <= MAX_PROGRESS_CHARS for params in peer.sent)
    assert peer.sent[-1]["progress"] == 999  # the latest is never lost


async def test_progress_past_the_pending_bound_is_left_out_and_said_to_be() -> None:
    peer = _Peer()
    relay = ProgressRelay(peer, "t", 1)  # type: ignore[arg-type]
    await relay({"text": "x" * 200_000})
    await relay.flush()
    text = "".join(sent["message"] for sent in peer.sent)
    assert text.startswith("x" * 65536) and "characters of output left out" in text
    assert peer.sent[-1]["progress"] == 200_000


def test_log_levels_filter_by_severity() -> None:
    peer = _Peer()
    assert not listens(peer, "emergency")  # type: ignore[arg-type]
    peer.log_level = "warning"
    assert [level for level in LEVELS if listens(peer, level)] == list(LEVELS[3:])  # type: ignore[arg-type]
