"""MCP sessions over HTTP: what a socket connection holds, kept between requests.

Over streamable HTTP each message is its own request, so the state a socket
`Connection` keeps for its peer (who it is, whether it initialized, its log level, the
sandbox sessions its tool calls named, what runs at its close) lives here instead, in
one `McpSession` per `Mcp-Session-Id`. A session is the `Peer` of every call made in
it, so the dispatcher and the methods serve it exactly as they serve a connection, and
`notifications/cancelled` finds the execution a request of the same session started.

`McpSessions` is the table: ids are unguessable, a session belongs to the principal
that initialized it (another principal's request naming it is answered as if it did
not exist), and the table is bounded per principal and in total. A principal at its
cap that initializes again replaces its least recently used idle session (a client
restarted without DELETE would otherwise be locked out until expiry); the total cap
refuses. `run` ends sessions idle for `idle_timeout_s`.

Notifications reach a client only on a stream it holds open: the SSE response of the
request they belong to (`notify(..., request_id=...)`), or else the session's
standalone stream (a GET; at most one at a time), which is where
`notifications/tools/list_changed` goes. Without either they are dropped, as a socket
drops notifications for a peer that is gone. A session with its standalone stream open
is not idle: its client is there.

Resource handling: `close` (DELETE, expiry, the daemon stopping) cancels the session's
requests in flight and runs its closing callbacks, shielded and bounded by the caller.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from conduit.core.errors import InvalidRequest
from conduit.daemon.auth import Principal
from conduit.daemon.client_asks import AskTable
from conduit.daemon.sessions import NamedSessions

__all__ = ["Exchange", "McpSession", "McpSessions", "TooManySessions"]

log = logging.getLogger("conduit.mcp_http")

# 32 random bytes: as unguessable as a token, since knowing one is half of using it.
_ID_BYTES = 32
# How long a notification may wait for a client that is not reading its stream.
_NOTIFY_STALL_S = 5.0
# How long a session's closing work may take (ending the sandbox sessions its calls
# named), shielded: the daemon has usually closed those already if it is draining.
_CLOSE_S = 5.0
# Notifications waiting on the standalone stream; past this, more are dropped (a
# client that reads nothing must not make the daemon hold more for it).
_STANDALONE_BUFFER = 64


@dataclass(slots=True)
class Exchange:
    """One request in flight in a session: its scope, and its SSE stream if it has one."""

    scope: trio.CancelScope
    events: trio.MemorySendChannel[dict[str, Any]] | None = None
    # Set when the client cancelled it (`notifications/cancelled`), not the session.
    cancelled_by_client: bool = False


class McpSession:
    """One MCP client's session: the `Peer` its calls are made by."""

    def __init__(self, session_id: str, principal: Principal) -> None:
        self.id = session_id
        self.principal = principal
        self.transport = "mcp-http"
        self.mcp_session = False
        self.log_level: str | None = None
        self.answers: dict[str, frozenset[str]] = {}
        self.subscriptions: dict[str, trio.CancelScope] = {}
        self.named_sessions = NamedSessions()
        self.last_used = trio.current_time()
        self.closed = False
        self._exchanges: dict[Any, Exchange] = {}
        self._standalone: trio.MemorySendChannel[dict[str, Any]] | None = None
        self._receiving: trio.MemoryReceiveChannel[dict[str, Any]] | None = None
        self._at_close: list[Callable[[], Awaitable[object]]] = []
        self._asks = AskTable()

    def __repr__(self) -> str:
        return f"<McpSession {self.principal.name} [{len(self._exchanges)} in flight]>"

    @property
    def busy(self) -> bool:
        return bool(self._exchanges) or self._standalone is not None

    @property
    def in_flight(self) -> int:
        return len(self._exchanges)

    def owned_by(self, principal: Principal) -> bool:
        return (principal.kind, principal.name) == (self.principal.kind, self.principal.name)

    # ---- the Peer protocol ---------------------------------------------------------

    def login(self, token: str) -> Principal:
        raise InvalidRequest(
            "invalid request: over HTTP a token goes in the Authorization header "
            "(Bearer), not in auth/login"
        )

    async def notify(self, method: str, params: dict[str, Any], *, request_id: Any = None) -> None:
        """Send a notification on the SSE stream of request `request_id`, if it has one;
        dropped otherwise, or if the client has not read for `_NOTIFY_STALL_S`."""
        exchange = self._exchanges.get(_key(request_id)) if request_id is not None else None
        if exchange is None or exchange.events is None:
            self.notify_nowait(method, params)
            return
        message = {"jsonrpc": "2.0", "method": method, "params": params}
        with trio.move_on_after(_NOTIFY_STALL_S):
            # Closed: the request has been answered, or its client left.
            with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
                await exchange.events.send(message)

    async def ask(
        self, method: str, params: dict[str, Any], *, request_id: Any = None
    ) -> dict[str, Any]:
        """Send a request to the client on the SSE stream of request `request_id` and
        return its result, which it POSTs back (`answer`). Raises `RpcError` as
        `AskTable.ask` does, and `InvalidRequest` when that request has no stream."""
        exchange = self._exchanges.get(_key(request_id)) if request_id is not None else None
        events = exchange.events if exchange is not None else None
        if events is None:
            raise InvalidRequest(
                f"invalid request: {method} needs the request it belongs to answered as "
                "an SSE stream (Accept: text/event-stream)"
            )

        async def send(message: dict[str, Any]) -> None:
            try:
                await events.send(message)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                raise InvalidRequest(
                    f"invalid request: the stream to send {method} on has closed"
                ) from None

        return await self._asks.ask(send, method, params)

    def answer(self, message: dict[str, Any]) -> bool:
        """The client's response to an `ask` (POSTed); False if it answers none."""
        self.last_used = trio.current_time()
        return self._asks.answer(message)

    def notify_nowait(self, method: str, params: dict[str, Any]) -> bool:
        """Queue a notification on the standalone stream; False if there is none or it
        is full (dropped)."""
        if self._standalone is None:
            return False
        message = {"jsonrpc": "2.0", "method": method, "params": params}
        try:
            self._standalone.send_nowait(message)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            return False
        return True

    def open_standalone(self) -> trio.MemoryReceiveChannel[dict[str, Any]] | None:
        """The standalone stream's notifications, or None if one is open already (or
        the session is closed). `close_standalone` ends it."""
        if self._standalone is not None or self.closed:
            return None
        send, receive = trio.open_memory_channel[dict[str, Any]](_STANDALONE_BUFFER)
        self._standalone, self._receiving = send, receive
        return receive

    def close_standalone(self, receive: trio.MemoryReceiveChannel[Any] | None = None) -> None:
        """End the standalone stream: any, or only the one `receive` reads (its GET is
        over; a newer one stays)."""
        if self._standalone is not None and (receive is None or self._receiving is receive):
            self._standalone.close()
            self._standalone = self._receiving = None
        self.last_used = trio.current_time()

    def start_stream(self, stream: Callable[[], Awaitable[object]]) -> None:
        raise InvalidRequest(
            "invalid request: event subscriptions need a connection that stays open; "
            "use the daemon's socket (docs/protocol.md), not MCP over HTTP"
        )

    def at_close(self, callback: Callable[[], Awaitable[object]]) -> None:
        self._at_close.append(callback)

    # ---- requests ------------------------------------------------------------------

    def begin(self, request_id: Any, exchange: Exchange) -> bool:
        """Register a request in flight; False if one with that id already is."""
        key = _key(request_id)
        if key in self._exchanges or self.closed:
            return False
        self._exchanges[key] = exchange
        self.last_used = trio.current_time()
        return True

    def end(self, request_id: Any) -> None:
        self._exchanges.pop(_key(request_id), None)
        self.last_used = trio.current_time()

    def cancel_request(self, request_id: Any) -> bool:
        """Stop request `request_id` of this session (the client's
        `notifications/cancelled`); False if it is not in flight."""
        exchange = self._exchanges.get(_key(request_id))
        if exchange is None:
            return False
        exchange.cancelled_by_client = True
        exchange.scope.cancel()
        return True

    def touch(self) -> None:
        self.last_used = trio.current_time()

    async def close(self) -> None:
        """Cancel what is in flight and run the closing callbacks (shielded); once."""
        if self.closed:
            return
        self.closed = True
        for exchange in self._exchanges.values():
            exchange.scope.cancel()
        self.close_standalone()
        callbacks, self._at_close = self._at_close, []
        with trio.CancelScope(shield=True) as bounded:
            bounded.deadline = trio.current_time() + _CLOSE_S
            for callback in callbacks:
                try:
                    await callback()
                except Exception:
                    log.exception("an MCP session's closing work failed")


class TooManySessions(Exception):
    """No session for now: the principal's are all busy (`busy`), or the table is full."""

    def __init__(self, message: str, *, busy: bool) -> None:
        super().__init__(message)
        self.message = message
        self.busy = busy


def _key(request_id: Any) -> tuple[str, Any]:
    """Ids 1 and "1" are different requests; 1 and 1.0 are one (as JSON compares them)."""
    return (type(request_id).__name__ if isinstance(request_id, str) else "number", request_id)


@dataclass(slots=True)
class McpSessions:
    """The daemon's MCP HTTP sessions, by id; bounded, and expired when idle."""

    max_per_principal: int
    max_total: int
    idle_timeout_s: float
    _sessions: dict[str, McpSession] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, principal: Principal) -> tuple[McpSession, McpSession | None]:
        """A new session for `principal`, and the one it replaces (the caller closes it).

        At the principal's cap, its least recently used idle session is replaced.
        Raises `TooManySessions` when all of the principal's are busy (`busy`) or the
        table is full.
        """
        own = [s for s in self._sessions.values() if s.owned_by(principal)]
        replaced = None
        if len(own) >= self.max_per_principal:
            idle = [s for s in own if not s.busy]
            if not idle:
                raise TooManySessions(
                    f"too many MCP sessions: {principal.name} has {len(own)} with requests "
                    "in flight; end one (DELETE) or wait",
                    busy=True,
                )
            replaced = min(idle, key=lambda s: s.last_used)
            self._sessions.pop(replaced.id, None)
        elif len(self._sessions) >= self.max_total:
            raise TooManySessions(
                f"too many MCP sessions: the daemon holds {len(self._sessions)}; retry later",
                busy=False,
            )
        session = McpSession(secrets.token_urlsafe(_ID_BYTES), principal)
        self._sessions[session.id] = session
        return session, replaced

    def get(self, session_id: str, principal: Principal) -> McpSession | None:
        """The session `session_id` if it is `principal`'s and open, else None."""
        session = self._sessions.get(session_id)
        if session is None or session.closed or not session.owned_by(principal):
            return None
        return session

    def sessions(self) -> list[McpSession]:
        """Every open session (a snapshot)."""
        return list(self._sessions.values())

    def discard(self, session: McpSession) -> None:
        """Forget `session` (its caller closes it)."""
        if self._sessions.get(session.id) is session:
            del self._sessions[session.id]

    async def close_all(self) -> None:
        """Close every session, all at once (so within `_CLOSE_S`, however many)."""
        sessions, self._sessions = list(self._sessions.values()), {}
        await _close_each(sessions)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """End idle sessions until cancelled; closes every session on the way out."""
        task_status.started()
        try:
            while True:
                await trio.sleep(max(self.idle_timeout_s / 4, 0.05))
                await self._expire(trio.current_time() - self.idle_timeout_s)
        finally:
            with trio.CancelScope(shield=True):
                await self.close_all()

    async def _expire(self, idle_since: float) -> None:
        stale = [s for s in self._sessions.values() if not s.busy and s.last_used <= idle_since]
        for session in stale:
            self.discard(session)
            log.info("MCP session expired", extra={"principal": session.principal.name})
        await _close_each(stale)


async def _close_each(sessions: list[McpSession]) -> None:
    """Close `sessions` side by side: each close is bounded by `_CLOSE_S`, so one slow
    to close holds up neither the others nor expiry nor the daemon's stop for longer."""
    async with trio.open_nursery() as nursery:
        for session in sessions:
            nursery.start_soon(session.close)
