"""MCP over streamable HTTP: the transport, on a loopback listener of its own.

One endpoint path (`mcp_http.path`, `/mcp`) answers:

- **POST** one JSON-RPC message. A request gets its response as `application/json`,
  or as an SSE stream (`text/event-stream`) when notifications should flow while it
  runs (it carries `_meta.progressToken`, or the session set a log level and it is a
  `tools/call`) or when the client accepts only SSE; the stream ends with the
  response. A `tools/call` from a client that answers requests (sampling,
  elicitation) is answered as JSON unless the call asks it something first: then as
  SSE from there on, carrying the question. Notifications and responses (the
  client's answers) get 202. `initialize` without
  `Mcp-Session-Id` opens a session and the answer carries its id; every other message
  must carry it (400 without, 404 for one that is unknown, ended, or another
  principal's). Batches (arrays) are refused: the protocol dropped them in 2025-06-18.
- **GET** (`Accept: text/event-stream`) opens the session's standalone SSE stream, for
  notifications unrelated to a request (`notifications/tools/list_changed`); one at a
  time (409 for a second), kept alive with a comment every `PING_S`.
- **DELETE** ends the session (200).

Every request needs `Authorization: Bearer <token>` (the master token or a client
token, as on the socket; 401 otherwise) and a loopback `Host` and, if it has one, an
allowed `Origin` (403; `OriginPolicy`). Calls go to the daemon's `Dispatcher` with the
`McpSession` as their peer: this module parses and frames, and runs no method.

HTTP/1.1 with keep-alive, through `h11`. A request's head is bounded by
`MAX_HEAD_BYTES` (431) and its body by the daemon's `server.max_message_bytes` (413);
the head is checked (Host, Origin, path, method, token) before any body is invited or
read. A new connection waits `FIRST_HEAD_S` for its first request, a kept-alive one
`KEEPALIVE_S` for its next, and then `REQUEST_TIMEOUT_S` for the whole of it
(slowloris); at most `mcp_http.max_connections` are served at once: at the cap a new
connection replaces the oldest that has sent no acceptable request, and is closed
unanswered if there is none. A client that disconnects while its request runs
cancels that request (and the program it started): there is no resuming a stream,
so nobody could receive its answer. EOF ends an SSE answer's request only once a
write fails (a half-closed client is still answered); a JSON answer takes EOF for a
disconnect, since it has nothing to write that would tell the two apart.

Resource handling: `serve` owns the listener and the sessions table's expiry task; on
the way out every session is closed. `stop_accepting` (the daemon draining) closes the
listener and ends standalone streams; connections close after their current request.
A write that a client does not take within `WRITE_TIMEOUT_S` drops its connection.

Error handling: whatever one HTTP connection raises is logged with an error id and
closes that connection alone; it never reaches the endpoint's nursery.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from http import HTTPStatus
from typing import Any

import h11
import trio

from conduit.core.errors import (
    InvalidRequest,
    Overloaded,
    ParseError,
    RequestCancelled,
    RpcError,
    Unauthenticated,
)
from conduit.core.protocol import (
    Request,
    decode,
    encode,
    error_reply,
    parse_request,
    result_reply,
)
from conduit.daemon.auth import Principal
from conduit.daemon.connection import RequestDispatch
from conduit.daemon.http_origin import OriginPolicy
from conduit.daemon.mcp_sessions import Exchange, McpSession, McpSessions, TooManySessions
from conduit.daemon.methods.core import PROTOCOL_VERSIONS

__all__ = [
    "FIRST_HEAD_S",
    "KEEPALIVE_S",
    "MAX_HEAD_BYTES",
    "PING_S",
    "REQUEST_TIMEOUT_S",
    "WRITE_TIMEOUT_S",
    "HttpLimits",
    "McpHttpEndpoint",
]

log = logging.getLogger("conduit.mcp_http")

# A request line and the headers MCP clients send fit in 2 KiB; 16 KiB leaves room for
# long tokens and proxies' additions.
MAX_HEAD_BYTES = 16 * 1024
# From a request's first byte to its last: an honest client on loopback sends a body
# of megabytes in milliseconds, so 30 s only ever stops a client dripping it.
REQUEST_TIMEOUT_S = 30.0
# How long an idle keep-alive connection is held for its next request. MCP clients send
# in bursts; between them the connection costs a descriptor and little else.
KEEPALIVE_S = 60.0
# How long a new connection may take to send its first request's head. A client that
# connects sends at once; anything slower only holds a connection without a token.
FIRST_HEAD_S = 5.0
# How much a connection reads per receive.
_RECEIVE_BYTES = 65536
# SSE messages buffered for a request whose client reads slowly; past this its
# notifications wait (and are dropped after a stall, see `McpSession.notify`).
_EVENTS_BUFFER = 64
# How long a refusal may take to write before the connection is dropped.
_REFUSAL_S = 2.0
# How long one write may wait for a client that is not reading: an honest client on
# loopback takes megabytes in milliseconds.
WRITE_TIMEOUT_S = 30.0
# An idle standalone stream carries an SSE comment this often: proxies and clients see
# it is alive, and a client gone without a word is noticed.
PING_S = 30.0
# How often a request's SSE stream is written to once its client has sent EOF: a
# client that is gone is noticed (its program cancelled) by the second write.
_PROBE_S = 1.0
# Notifications dispatched from a POST: quick ones (cancelled, initialized); a slow one
# must not hold the client's 202.
_NOTIFICATION_S = 5.0

_JSON = "application/json"
_SSE = "text/event-stream"
_SESSION_HEADER = b"mcp-session-id"


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """What the endpoint accepts: body size, connections, requests per session."""

    max_body_bytes: int
    max_connections: int
    max_in_flight: int


class _Refused(Exception):
    """A request answered with an HTTP error: its status, JSON-RPC error and headers."""

    def __init__(
        self, status: int, error: RpcError, headers: tuple[tuple[bytes, bytes], ...] = ()
    ) -> None:
        super().__init__(error.message)
        self.status = status
        self.error = error
        self.headers = headers


@dataclass(slots=True)
class _Request:
    """A request's head, judged (`principal`) before its body is read."""

    method: str
    target: str
    headers: dict[bytes, bytes]
    body: bytes = b""
    principal: Principal | None = None

    def header(self, name: bytes) -> str | None:
        value = self.headers.get(name)
        return value.decode("latin-1") if value is not None else None


class McpHttpEndpoint:
    """Serves MCP over streamable HTTP on one listener until cancelled."""

    def __init__(
        self,
        dispatcher: RequestDispatch,
        *,
        authenticate: Callable[[str], Principal | None],
        sessions: McpSessions,
        origins: OriginPolicy,
        limits: HttpLimits,
        path: str = "/mcp",
    ) -> None:
        self._dispatcher = dispatcher
        self._authenticate = authenticate
        self.sessions = sessions
        self._origins = origins
        self.limits = limits
        self._path = path
        self._active = 0
        # Connections that have sent no acceptable request yet, oldest first: at the
        # cap, a new connection takes the place of the oldest of them (`_make_room`).
        self._unproven: dict[_HttpConnection, None] = {}
        self._accepting = trio.CancelScope()
        self.draining = False
        # Requests being answered now, and an event set whenever that reaches zero.
        self._answering = 0
        self._idle = trio.Event()
        self._idle.set()

    def __repr__(self) -> str:
        return f"<McpHttpEndpoint [Connections: {self._active} | Sessions: {len(self.sessions)}]>"

    async def serve(
        self,
        listener: trio.SocketListener,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve `listener` until cancelled, and expire idle sessions; closes the
        listener and every session on the way out. `started()` once it accepts."""
        async with listener, trio.open_nursery() as nursery:
            await nursery.start(self.sessions.run)
            await nursery.start(self._accept, listener, nursery)
            task_status.started()

    async def _accept(
        self,
        listener: trio.SocketListener,
        connections: trio.Nursery,
        *,
        task_status: trio.TaskStatus[object] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept until `stop_accepting` (then close `listener`); each connection runs
        in `connections`, so stopping the accept loop leaves them be."""
        with self._accepting:
            await trio.serve_listeners(
                self._serve_connection,
                [listener],
                handler_nursery=connections,
                task_status=task_status,
            )
        await listener.aclose()

    @property
    def connections(self) -> int:
        """HTTP connections being served now."""
        return self._active

    async def wait_idle(self) -> None:
        """Return once no request is being answered (kept-alive connections may stay)."""
        while self._answering:
            await self._idle.wait()

    def _begin_answer(self) -> None:
        self._answering += 1
        if self._idle.is_set():
            self._idle = trio.Event()

    def _end_answer(self) -> None:
        self._answering -= 1
        if not self._answering:
            self._idle.set()

    def stop_accepting(self) -> None:
        """Accept no more connections, and close each after its current request (the
        daemon is draining); requests in flight finish."""
        self.draining = True
        self._accepting.cancel()
        for session in self.sessions.sessions():  # standalone streams end here
            session.close_standalone()

    def _make_room(self) -> bool:
        """Whether a new connection may be served: under the cap, or by closing the
        oldest connection that has sent no acceptable request. Holding connections
        takes no token, so without this anyone could lock out every MCP client;
        a client with a token proves itself with its first head, and stays."""
        if self._active < self.limits.max_connections:
            return True
        oldest = next(iter(self._unproven), None)
        if oldest is None:
            return False
        self._unproven.pop(oldest)
        self._active -= 1
        oldest.evict()
        return True

    def prove(self, connection: _HttpConnection) -> None:
        """`connection` sent an acceptable request: it is no longer evicted for others."""
        self._unproven.pop(connection, None)

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        if not self._make_room():
            await trio.aclose_forcefully(stream)
            return
        connection = _HttpConnection(self, stream)
        self._active += 1
        self._unproven[connection] = None
        try:
            await connection.run()
        except* (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client left
        except* Exception as group:
            error_id = secrets.token_hex(6)
            log.error(
                "MCP HTTP connection failed and was closed",
                exc_info=group,
                extra={"error_id": error_id},
            )
        finally:
            if not connection.evicted:  # an evicted one was uncounted at once
                self._active -= 1
            self._unproven.pop(connection, None)
            await trio.aclose_forcefully(stream)

    # ---- one request -----------------------------------------------------------------

    def check(self, request: _Request) -> Principal:
        """The principal of an acceptable request; raises `_Refused` otherwise."""
        refusal = self._origins.refusal(request.header(b"host"), request.header(b"origin"))
        if refusal is not None:
            raise _Refused(403, InvalidRequest(refusal))
        if request.target.partition("?")[0] != self._path:
            raise _Refused(404, InvalidRequest(f"not found: MCP is served at {self._path}"))
        if request.method not in ("POST", "GET", "DELETE"):
            raise _Refused(
                405,
                InvalidRequest(
                    f"method not allowed: {request.method}; POST messages, GET the session's "
                    "stream, DELETE to end the session"
                ),
                ((b"allow", b"GET, POST, DELETE"),),
            )
        principal = self._principal(request.header(b"authorization"))
        version = request.header(b"mcp-protocol-version")
        if version is not None and version not in PROTOCOL_VERSIONS:
            raise _Refused(
                400,
                InvalidRequest(
                    f"unsupported MCP-Protocol-Version {version!r}: this server speaks "
                    f"{', '.join(PROTOCOL_VERSIONS)}"
                ),
            )
        return principal

    def _principal(self, authorization: str | None) -> Principal:
        scheme, _, token = (authorization or "").strip().partition(" ")
        principal = None
        if scheme.lower() == "bearer" and token.strip():
            principal = self._authenticate(token.strip())
        if principal is None:
            what = "is not valid" if authorization else "is missing"
            raise _Refused(
                401,
                Unauthenticated(
                    f"unauthenticated: the bearer token {what}; send `Authorization: Bearer "
                    "<token>` with the master token or a client token (conduit token new)"
                ),
                ((b"www-authenticate", b'Bearer realm="conduit"'),),
            )
        if principal.kind == "session":
            raise _Refused(
                403, InvalidRequest("forbidden: a sandbox's session token cannot use MCP over HTTP")
            )
        return principal

    def session_for(self, request: _Request, principal: Principal) -> McpSession:
        session_id = request.header(_SESSION_HEADER)
        if session_id is None:
            raise _Refused(
                400,
                InvalidRequest(
                    "bad request: Mcp-Session-Id header required; send initialize first "
                    "and then the session id it answered with"
                ),
            )
        session = self.sessions.get(session_id, principal)
        if session is None:
            raise _Refused(
                404,
                InvalidRequest(
                    "session not found: it ended, expired, or was never this client's; "
                    "send initialize to start a new one"
                ),
            )
        session.touch()
        return session

    async def dispatch(self, request: Request, principal: Principal, session: McpSession) -> Any:
        """Run one call of `session` through the daemon's dispatcher; raises `RpcError`."""
        return await self._dispatcher.dispatch(
            request.method,
            request.params,
            principal=principal,
            peer=session,  # type: ignore[arg-type]
            request_id=request.id,
        )

    async def delete(self, request: _Request, principal: Principal) -> None:
        session = self.session_for(request, principal)
        self.sessions.discard(session)
        await session.close()

    def open_session(self, principal: Principal) -> tuple[McpSession, McpSession | None]:
        try:
            return self.sessions.open(principal)
        except TooManySessions as exc:
            raise _Refused(429 if exc.busy else 503, Overloaded(exc.message)) from None


def _message(body: bytes) -> dict[str, Any]:
    """The one JSON-RPC message a POST carries; raises `_Refused` for anything else."""
    try:
        message = decode(body)
    except ParseError as exc:
        raise _Refused(400, exc) from None
    if isinstance(message, list):
        raise _Refused(
            400,
            InvalidRequest(
                "invalid request: batches are not supported over streamable HTTP (the "
                "protocol removed them in 2025-06-18); POST one message at a time"
            ),
        )
    if not isinstance(message, dict):
        raise _Refused(400, InvalidRequest("invalid request: a message is a JSON object"))
    return message


def _parse(message: dict[str, Any]) -> Request:
    """`message` as a request or notification; raises `_Refused` (400) for one that is
    neither. A request method without an id would run unanswered and outside the
    in-flight cap, so only `notifications/*` may come without one."""
    try:
        parsed = parse_request(message)
    except InvalidRequest as exc:
        raise _Refused(400, exc) from None
    if not parsed.is_notification and parsed.id is None:
        raise _Refused(
            400, InvalidRequest('invalid request: a request\'s "id" may not be null (MCP)')
        )
    if parsed.is_notification and not parsed.method.startswith("notifications/"):
        raise _Refused(
            400,
            InvalidRequest(
                f"invalid request: {parsed.method} is a request, not a notification; "
                'send it with an "id" to have it run and answered'
            ),
        )
    return parsed


def _accepts(accept: str | None) -> tuple[bool, bool]:
    """Whether the client takes JSON, and SSE, by its Accept header."""
    if not accept:
        return True, False
    kinds = {part.split(";")[0].strip().lower() for part in accept.split(",")}
    anything = "*/*" in kinds
    return (
        anything or _JSON in kinds or "application/*" in kinds,
        anything or _SSE in kinds or "text/*" in kinds,
    )


class _Answer(enum.Enum):
    """How a request is answered: as JSON, as an SSE stream, or as JSON unless
    something must reach the client before the response (then SSE from there on)."""

    JSON = "json"
    STREAM = "stream"
    JSON_UNLESS_ASKED = "json-unless-asked"


def _answer_kind(message: dict[str, Any], session: McpSession, json_ok: bool) -> _Answer:
    """Whether notifications may flow while this request runs (answer it with SSE)."""
    if not json_ok:
        return _Answer.STREAM
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if isinstance(meta, dict) and meta.get("progressToken") is not None:
        return _Answer.STREAM
    if message.get("method") != "tools/call":
        return _Answer.JSON
    if session.log_level is not None:
        return _Answer.STREAM
    # A call may ask its client something (`McpSession.ask`), if the client answers.
    return _Answer.JSON_UNLESS_ASKED if session.answers else _Answer.JSON


def _sse_event(message: Any) -> bytes:
    return b"event: message\ndata: " + encode(message) + b"\n\n"


class _HttpConnection:
    """One HTTP/1.1 connection: its requests, one after another (keep-alive)."""

    def __init__(self, endpoint: McpHttpEndpoint, stream: trio.SocketStream) -> None:
        self._endpoint = endpoint
        self._stream = stream
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self._client_gone = False
        # The client sent EOF (half-closed, or gone: only a write tells which).
        self._read_closed = False
        # The wait of an SSE answer for its next event (`_relay_events`).
        self._idle = trio.CancelScope()
        self._scope = trio.CancelScope()
        self.evicted = False
        self._first = True

    def evict(self) -> None:
        """Close this connection (still waiting for its first request) for another."""
        self.evicted = True
        self._scope.cancel()

    async def run(self) -> None:
        """Serve requests until the client leaves, idles out, or is refused."""
        with self._scope:
            await self._serve_requests()

    async def _serve_requests(self) -> None:
        while True:
            request = await self._next_request()
            if request is None:
                return
            await self._handle(request)
            if (
                self._client_gone
                or self._read_closed
                or self._endpoint.draining
                or self._h11.our_state is not h11.DONE
                or self._h11.their_state is not h11.DONE
            ):
                return
            self._h11.start_next_cycle()
            self._first = False

    # ---- reading ---------------------------------------------------------------------

    async def _next_request(self) -> _Request | None:
        """The next whole request, or None when the client closed, idled out, or sent
        something that was answered with an error here."""
        wait_s = min(FIRST_HEAD_S, KEEPALIVE_S) if self._first else KEEPALIVE_S
        scope = trio.CancelScope(deadline=trio.current_time() + wait_s)
        with scope:
            try:
                return await self._read_request(scope)
            except _Refused as exc:
                await self._refuse(exc)
                return None
            except h11.RemoteProtocolError as exc:
                status = exc.error_status_hint
                error = InvalidRequest(f"bad request: {exc}")
                await self._refuse(_Refused(status, error))
                return None
        return None  # timed out: close without a word (the client was idle, or dripping)

    async def _read_request(self, scope: trio.CancelScope) -> _Request | None:
        limit = self._endpoint.limits.max_body_bytes
        head: _Request | None = None
        body = bytearray()
        deadline = trio.current_time() + REQUEST_TIMEOUT_S
        while True:
            event = self._h11.next_event()
            if event is h11.NEED_DATA:
                if self._h11.they_are_waiting_for_100_continue and head is not None:
                    await self._send(h11.InformationalResponse(status_code=100, headers=[]))
                data = await self._stream.receive_some(_RECEIVE_BYTES)
                if data and head is None and not body:
                    # The request has started: the rest must come within its own deadline.
                    deadline = trio.current_time() + REQUEST_TIMEOUT_S
                    scope.deadline = min(scope.deadline, deadline)
                self._h11.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                head = self._accept_head(event)
                scope.deadline = deadline  # FIRST_HEAD_S bound the head alone
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > limit:
                    raise _Refused(413, _too_large(limit))
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                head.body = bytes(body)
                return head
            else:  # ConnectionClosed, or PAUSED after a protocol switch we never grant
                return None

    def _accept_head(self, event: h11.Request) -> _Request:
        """Judge a request by its head alone, before any of its body is invited (100
        Continue) or read: a client without a token must not get to make us buffer
        megabytes. Raises `_Refused`."""
        # h11's own limit binds only a head that arrives in pieces.
        size = (
            len(event.method) + len(event.target) + sum(len(n) + len(v) for n, v in event.headers)
        )
        if size > MAX_HEAD_BYTES:
            raise _Refused(
                431,
                InvalidRequest(
                    f"request header fields too large: a request's head may hold at most "
                    f"{MAX_HEAD_BYTES} bytes"
                ),
            )
        request = _Request(
            event.method.decode("ascii", "replace"),
            event.target.decode("latin-1"),
            {name.lower(): value for name, value in event.headers},
        )
        request.principal = self._endpoint.check(request)
        self._endpoint.prove(self)
        limit = self._endpoint.limits.max_body_bytes
        length = request.headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise _Refused(413, _too_large(limit))
        return request

    # ---- writing ---------------------------------------------------------------------

    async def _send(self, event: Any) -> None:
        data = self._h11.send(event)
        if not data:
            return
        with trio.move_on_after(WRITE_TIMEOUT_S) as waited:
            await self._stream.send_all(data)
        if waited.cancelled_caught:  # half written: the connection cannot go on
            self._client_gone = True
            raise trio.BrokenResourceError("the client stopped reading")

    async def _respond(
        self,
        status: int,
        body: bytes = b"",
        *,
        content_type: str | None = _JSON,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        fields = [(b"content-length", str(len(body)).encode()), *headers]
        if content_type is not None and body:
            fields.append((b"content-type", content_type.encode()))
        if self._h11.their_state is not h11.DONE:
            fields.append((b"connection", b"close"))  # the rest of the request goes unread
        await self._send(h11.Response(status_code=status, headers=fields, reason=_reason(status)))
        if body:
            await self._send(h11.Data(data=body))
        await self._send(h11.EndOfMessage())

    async def _refuse(self, refused: _Refused) -> None:
        """Answer with `refused`'s status and error, if a response can still start."""
        # IDLE: the request could not even be read (h11 still lets us answer that).
        if self._h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        body = encode(error_reply(None, refused.error))
        with trio.move_on_after(_REFUSAL_S):
            with contextlib.suppress(h11.LocalProtocolError):
                await self._respond(refused.status, body, headers=refused.headers)
            if self._h11.their_state is not h11.DONE:
                await self._discard_rest()

    async def _discard_rest(self) -> None:
        """Read and drop what the client still sends, up to a request's worth, so that
        closing with it unread does not reset the connection before the client reads
        its refusal. Nothing is kept: a refused body costs no memory."""
        await self._stream.send_eof()
        left = MAX_HEAD_BYTES + self._endpoint.limits.max_body_bytes
        while left > 0:
            data = await self._stream.receive_some(_RECEIVE_BYTES)
            if not data:
                return
            left -= len(data)

    # ---- handling --------------------------------------------------------------------

    async def _handle(self, request: _Request) -> None:
        self._endpoint._begin_answer()
        try:
            await self._answer(request)
        finally:
            self._endpoint._end_answer()

    async def _answer(self, request: _Request) -> None:
        endpoint = self._endpoint
        principal = request.principal
        assert principal is not None  # checked with the head
        try:
            if request.method == "DELETE":
                await endpoint.delete(request, principal)
                await self._respond(200)
                return
            if request.method == "GET":
                await self._standalone(endpoint.session_for(request, principal), request)
                return
            await self._post(request, principal)
        except _Refused as exc:
            await self._refuse(exc)

    async def _post(self, request: _Request, principal: Principal) -> None:
        content_type = (request.header(b"content-type") or "").split(";")[0].strip().lower()
        if content_type != _JSON:
            raise _Refused(
                415,
                InvalidRequest(
                    "unsupported media type: POST a JSON-RPC message as application/json"
                ),
            )
        json_ok, sse_ok = _accepts(request.header(b"accept"))
        if not (json_ok or sse_ok):
            raise _Refused(
                406,
                InvalidRequest("not acceptable: accept application/json and text/event-stream"),
            )
        message = _message(request.body)
        if "method" not in message:
            # A response to a request of ours (`McpSession.ask`); one that answers
            # none is dropped, as a response is never answered.
            self._endpoint.session_for(request, principal).answer(message)
            await self._respond(202)
            return
        parsed = _parse(message)
        if parsed.method == "initialize" and not parsed.is_notification:
            await self._initialize(request, parsed, principal)
            return
        session = self._endpoint.session_for(request, principal)
        if parsed.is_notification:
            # Nothing answers a notification, refused or not (one we do not know, say).
            with trio.move_on_after(_NOTIFICATION_S), contextlib.suppress(RpcError):
                await self._dispatch(parsed, principal, session)
            await self._respond(202)
            return
        kind = _answer_kind(message, session, json_ok) if sse_ok else _Answer.JSON
        await self._request(parsed, principal, session, kind)

    async def _standalone(self, session: McpSession, request: _Request) -> None:
        """Serve the session's standalone stream until the client or the session ends."""
        if not _accepts(request.header(b"accept"))[1]:
            raise _Refused(
                406, InvalidRequest("not acceptable: GET needs Accept: text/event-stream")
            )
        receive = session.open_standalone()
        if receive is None:
            raise _Refused(
                409, InvalidRequest("conflict: this session's stream is already open elsewhere")
            )
        try:
            await self._start_stream()
            async with trio.open_nursery() as nursery:
                gone = trio.CancelScope()
                nursery.start_soon(self._watch_client, gone)
                with gone:
                    await self._relay_events(receive)
                nursery.cancel_scope.cancel()
            if not self._client_gone:
                await self._send(h11.EndOfMessage())
        finally:
            receive.close()
            session.close_standalone(receive)

    async def _initialize(self, request: _Request, parsed: Request, principal: Principal) -> None:
        if request.header(_SESSION_HEADER) is not None:
            raise _Refused(
                400,
                InvalidRequest(
                    "bad request: initialize starts a new session; send it without "
                    "Mcp-Session-Id (DELETE ends the old one)"
                ),
            )
        session, replaced = self._endpoint.open_session(principal)
        if replaced is not None:
            await replaced.close()
        try:
            result = await self._dispatch(parsed, principal, session)
        except RpcError as exc:
            self._endpoint.sessions.discard(session)
            await session.close()
            await self._respond(200, encode(error_reply(parsed.id, exc)))
            return
        log.info("MCP session opened", extra={"principal": principal.name})
        header = ((_SESSION_HEADER, session.id.encode()),)
        await self._respond(200, encode(result_reply(parsed.id, result)), headers=header)

    async def _dispatch(self, parsed: Request, principal: Principal, session: McpSession) -> Any:
        return await self._endpoint.dispatch(parsed, principal, session)

    async def _request(
        self, parsed: Request, principal: Principal, session: McpSession, kind: _Answer
    ) -> None:
        """Run one request of `session` and answer it, as JSON or as an SSE stream."""
        if self._too_busy(session):
            raise _Refused(
                429,
                InvalidRequest(
                    "too many requests in flight in this session; wait for one to finish"
                ),
            )
        send, receive = trio.open_memory_channel[dict[str, Any]](_EVENTS_BUFFER)
        exchange = Exchange(trio.CancelScope(), None if kind is _Answer.JSON else send)
        if not session.begin(parsed.id, exchange):
            raise _Refused(
                409, InvalidRequest(f"request id {parsed.id!r} is already in flight here")
            )
        try:
            if kind is _Answer.STREAM:
                await self._answer_streaming(parsed, principal, session, exchange, receive)
            elif kind is _Answer.JSON_UNLESS_ASKED:
                await self._answer_unless_asked(parsed, principal, session, exchange, receive)
            else:
                await self._answer_json(parsed, principal, session, exchange)
        finally:
            session.end(parsed.id)
            send.close()
            receive.close()

    def _too_busy(self, session: McpSession) -> bool:
        return session.in_flight >= self._endpoint.limits.max_in_flight

    async def _reply_to(
        self, parsed: Request, principal: Principal, session: McpSession, exchange: Exchange
    ) -> dict[str, Any] | None:
        """The response to `parsed`, or None if it was cancelled (session ended, or the
        client left). One the client cancelled is answered with an error: the stream
        has to end with something, and a client that cancelled reads nothing from it."""
        with exchange.scope:
            try:
                result = await self._dispatch(parsed, principal, session)
            except RpcError as exc:
                return error_reply(parsed.id, exc)
            finally:
                # Answered: the client may use its id again as soon as it has the answer.
                session.end(parsed.id)
            return result_reply(parsed.id, result)
        if exchange.cancelled_by_client:
            return error_reply(parsed.id, RequestCancelled())
        return None

    async def _answer_json(
        self, parsed: Request, principal: Principal, session: McpSession, exchange: Exchange
    ) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_client, exchange.scope)
            reply = await self._reply_to(parsed, principal, session, exchange)
            nursery.cancel_scope.cancel()
        await self._respond_json(reply)

    async def _respond_json(self, reply: dict[str, Any] | None) -> None:
        if reply is None:
            if self._client_gone:
                return
            raise _Refused(
                404, InvalidRequest("the session ended while this request ran; it was cancelled")
            )
        await self._respond(200, encode(reply))

    async def _answer_unless_asked(
        self,
        parsed: Request,
        principal: Principal,
        session: McpSession,
        exchange: Exchange,
        receive: trio.MemoryReceiveChannel[dict[str, Any]],
    ) -> None:
        """The response as JSON if it comes first; if a question for the client comes
        first, an SSE stream from there on. EOF is taken for a disconnect, as for JSON:
        this connection carries nothing from the client until the response."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_client, exchange.scope)
            nursery.start_soon(self._reply_into_stream, parsed, principal, session, exchange)
            try:
                first = await receive.receive()
            except trio.EndOfChannel:
                first = None
            try:
                if first is None or "method" not in first:
                    await self._respond_json(first)
                    return
                await self._start_stream()
                await self._send(h11.Data(data=_sse_event(first)))
                await self._relay_events(receive)
                await self._send(h11.EndOfMessage())
            finally:
                nursery.cancel_scope.cancel()

    async def _answer_streaming(
        self,
        parsed: Request,
        principal: Principal,
        session: McpSession,
        exchange: Exchange,
        receive: trio.MemoryReceiveChannel[dict[str, Any]],
    ) -> None:
        await self._start_stream()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(self._watch_client, exchange.scope, half_close_ok=True))
            nursery.start_soon(self._reply_into_stream, parsed, principal, session, exchange)
            try:
                await self._relay_events(receive)
                await self._send(h11.EndOfMessage())
            finally:
                nursery.cancel_scope.cancel()

    async def _start_stream(self) -> None:
        headers = [(b"content-type", _SSE.encode()), (b"cache-control", b"no-cache")]
        await self._send(h11.Response(status_code=200, headers=headers, reason=b"OK"))

    async def _reply_into_stream(
        self, parsed: Request, principal: Principal, session: McpSession, exchange: Exchange
    ) -> None:
        """Run the request and put its response, if any, last on its events."""
        events = exchange.events
        assert events is not None
        reply = await self._reply_to(parsed, principal, session, exchange)
        if reply is not None:
            await events.send(reply)
        events.close()

    async def _relay_events(self, receive: trio.MemoryReceiveChannel[dict[str, Any]]) -> None:
        """Write a stream's events until it ends (a request's, at its response; the
        standalone one, when its session closes). While idle, an SSE comment goes out
        now and then, soon once the client has sent EOF: a client that only
        half-closed takes it, and one that is gone makes the write fail, which ends
        the stream (the nursery around this is cancelled)."""
        while True:
            message = None
            wait_s = _PROBE_S if self._read_closed else PING_S
            with trio.CancelScope(deadline=trio.current_time() + wait_s) as self._idle:
                try:
                    message = await receive.receive()
                except trio.EndOfChannel:
                    return
            data = _sse_event(message) if message is not None else b": ping\n\n"
            await self._send(h11.Data(data=data))

    async def _watch_client(self, scope: trio.CancelScope, *, half_close_ok: bool = False) -> None:
        """Cancel `scope` if the client disconnects; what it sends early is kept for
        its next request (bounded, like any request). With `half_close_ok` EOF only
        stops the watch: the caller's writes find out whether the client is gone.
        Without it (a JSON answer, which writes nothing before the end) EOF is taken
        for a disconnect, since nothing else could tell a half-close from one."""
        buffered = 0
        while True:
            try:
                data = await self._stream.receive_some(_RECEIVE_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = None  # reset: certainly gone
            if data == b"" and half_close_ok:
                self._read_closed = True
                self._idle.deadline = min(self._idle.deadline, trio.current_time() + _PROBE_S)
                return
            if not data:
                self._client_gone = True
                scope.cancel()
                return
            buffered += len(data)
            if buffered > MAX_HEAD_BYTES + self._endpoint.limits.max_body_bytes:
                self._client_gone = True
                scope.cancel()
                return
            self._h11.receive_data(data)


def _reason(status: int) -> bytes:
    return HTTPStatus(status).phrase.encode()


def _too_large(limit: int) -> InvalidRequest:
    return InvalidRequest(
        f"payload too large: a message may hold at most {limit} bytes (server.max_message_bytes)"
    )
