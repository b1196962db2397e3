"""One client connection: its stream, its auth state and its in-flight requests.

Requests on a connection run concurrently (one task each, at most
`max_in_flight_per_connection` at a time) and are answered by id, possibly out of order.
Past that cap, an authenticated peer's requests are held in tasks of their own, which
start in order as slots free, and the reader reads on: a notification to the daemon
(`notifications/...`, such as a cancellation) on a line of its own is served by the
reader at once, without a slot, and a held request cancelled that way is answered so
and never run. Once as many are held as may run, the connection stops reading until
one starts; except while the daemon waits for the peer's answer to a question of its
own (`ask`), which may be behind them, and one of the slots may be the call waiting for
it: then it reads on and refuses requests beyond those as overloaded (a refused
notification, as ever, unanswered). An answer is taken as it is read, in a batch too.

A reply is written by the task that made it when nothing else is being written or
waiting to be (the common, one-request-at-a-time case: no hand-off to another task);
every other message goes to the writer task, which coalesces whatever is ready into a
single send. Either way the messages of one task reach the peer in the order it sent
them, and no line is left half written by a task cancelled while writing it (a
streamed notification's timeout, say): only the writer writes what its sender may stop
waiting for.

```
Connection.run
├── writer (outbox → stream)
├── watcher: closes the connection at its deadlines (`ConnectionLimits`), if it has any
└── streams: tasks that outlive their request (event subscriptions), `start_stream`
    └── requests: reader + one task per request
```

A connection knows its stream, where its requests go (`RequestDispatch`: the daemon's
dispatcher), how tokens are checked, and its `ConnectionLimits`; nothing else of the
daemon. It parses and frames messages, and writes every reply; it runs no method.

Deadlines: a connection accepted from a listener must authenticate within
`ConnectionLimits.auth_s` of connecting, and may be closed once idle (nothing in flight,
nothing received) for `ConnectionLimits.idle_s`. Requests only note the time and count
themselves; the one watcher task per connection sleeps until the next deadline and
looks again, so no request pays for a timer. A connection closed for either reason is
told why first, in one error line with a null id, if that can be written at once.

Resource handling: `run` owns the stream and closes it before returning. When the peer
half-closes, in-flight requests still finish and are answered, then the streams are
cancelled; when the peer is gone entirely, everything is cancelled, and so are the
executions its requests started. A sandbox's connection is the exception: its requests
are its program's tool calls, which go on after a worker that exited as it answered,
within the daemon's room for them (`left_requests`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import trio

from conduit.core.errors import (
    InvalidRequest,
    Overloaded,
    ParseError,
    RequestCancelled,
    RpcError,
    Unauthenticated,
)
from conduit.core.framing import LineReader, Oversize
from conduit.core.left_calls import LeftCalls
from conduit.core.protocol import (
    Request,
    decode,
    encode,
    error_reply,
    is_response,
    parse_request,
    request_id,
    result_reply,
    unreadable_id,
)
from conduit.daemon.client_asks import AskTable
from conduit.daemon.left_requests import LeftRequests
from conduit.daemon.sessions import NamedSessions

if TYPE_CHECKING:
    from conduit.daemon.auth import PeerCredentials, Principal

__all__ = ["Connection", "ConnectionLimits", "RequestDispatch"]

log = logging.getLogger("conduit.connection")

# Replies waiting for the writer; past this many, or this many bytes of them (one
# message always fits), request tasks wait (back-pressure on a client that stops
# reading) instead of the daemon buffering without bound: 256 results of a megabyte
# each would have been held for a client reading none of them.
_OUTBOX_SIZE = 256
_OUTBOX_BYTES = 16 * 1024 * 1024
# A batch larger than this is a mistake or an attack, not a workload.
_MAX_BATCH = 1000
# How long the line saying why a connection is closed may take to write: a peer that
# does not read must not hold its slot any longer for it.
_FAREWELL_S = 1.0


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What one connection may hold, and when it is closed for doing nothing."""

    # The longest line read; a longer one is refused and discarded.
    max_message_bytes: int
    # Requests running at once; past this as many again are held, then reading stops.
    max_in_flight: int
    # Invalid tokens in a row before the connection is closed.
    max_auth_failures: int
    auth_s: float | None = None  # from connecting to a valid token; None: never
    idle_s: float | None = None  # nothing in flight and nothing received; None: never


class RequestDispatch(Protocol):
    """Where a connection's requests go: the daemon's `Dispatcher`."""

    async def dispatch(
        self,
        name: str,
        raw_params: dict[str, Any],
        *,
        principal: Principal | None,
        peer: Connection,
        request_id: Any,
    ) -> Any:
        """Run one method; the result is JSON-ready. Raises only `RpcError`."""
        ...

    def refused(self, name: str | None, error: RpcError) -> None:
        """Note a message answered with `error` before it was dispatched."""
        ...


def _expires(limits: ConnectionLimits) -> bool:
    """Whether a connection under `limits` can be closed for doing nothing."""
    return limits.auth_s is not None or limits.idle_s is not None


def _tells(message: Any) -> bool:
    """Whether `message` is a notification to the daemon (`notifications/...`): told,
    not asked, and served at once, even while every slot is taken."""
    return (
        isinstance(message, dict)
        and "id" not in message
        and isinstance(method := message.get("method"), str)
        and method.startswith("notifications/")
    )


def _held_id(message: Any) -> Any:
    """The id a held `message` can be cancelled by: a single request's, a string or an
    integer, as MCP's ids are (a batch, or a notification, has none)."""
    ident = message.get("id") if isinstance(message, dict) else None
    return ident if _cancellable(ident) else None


def _cancellable(ident: Any) -> bool:
    return isinstance(ident, (str, int)) and not isinstance(ident, bool)


class _Watched(trio.abc.ReceiveStream):
    """The connection's receiving side, noting when bytes last arrived."""

    def __init__(self, connection: Connection, stream: trio.abc.ReceiveStream) -> None:
        self._connection = connection
        self._stream = stream

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        data = await self._stream.receive_some(max_bytes)
        self._connection._last_seen = trio.current_time()
        return data

    async def aclose(self) -> None:
        await self._stream.aclose()


class Connection:
    """Serves one accepted stream until the peer leaves or the daemon cancels it."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        dispatcher: RequestDispatch,
        limits: ConnectionLimits,
        *,
        transport: str,
        authenticate: Callable[[str], Principal | None],
        principal: Principal | None = None,
        peer: PeerCredentials | None = None,
        on_authenticated: Callable[[], None] | None = None,
        left_calls: LeftCalls | None = None,
    ) -> None:
        """`authenticate` says who a token stands for here (None: nobody); `principal`
        is who the peer already is, if known without a token (its Unix uid, or
        `conduit mcp`'s stdio, the user who started it). `on_authenticated` is called
        once, when a connection that started without a principal first presents a
        valid token. With `left_calls` (a sandbox's connection), requests go on within
        its room once the peer is gone, rather than being cancelled (`LeftRequests`)."""
        self._stream = stream
        self._dispatcher = dispatcher
        self._limits = limits
        self._authenticate = authenticate
        self.transport = transport
        self.peer = peer
        self.principal: Principal | None = principal
        # Set by `initialize`: this peer is an MCP client, and hears MCP notifications.
        self.mcp_session = False
        # Set by `logging/setLevel`: the least severe MCP log level this peer hears.
        self.log_level: str | None = None
        # Set by `initialize`: the requests this MCP client answers (`ask`).
        self.answers: dict[str, frozenset[str]] = {}
        self._asks = AskTable()
        # Whether any valid token (or the peer's uid) has been seen on this connection:
        # a sandbox's presents its session token with every request, never logging in.
        self.authenticated = self.principal is not None
        self._on_authenticated = on_authenticated
        self._opened_at = self._last_seen = trio.current_time()
        # Requests and streams running now: while any is, the connection is not idle.
        self._busy = 0
        self._watch_scope = trio.CancelScope()
        self._failures = 0
        self._slots = trio.Semaphore(limits.max_in_flight)
        # Requests read while every slot is taken, waiting for one (see `_start`), and
        # the scopes of their waits by request id (a batch's have none).
        self._held = 0
        self._held_by_id: dict[Any, list[trio.CancelScope]] = {}
        # What a reader waiting for a slot waits on (None while none does): set when a
        # slot frees or a question goes to the peer, so it looks again.
        self._room: trio.Event | None = None
        self._left = None if left_calls is None else LeftRequests(left_calls)
        self._outbox_send, self._outbox = trio.open_memory_channel[bytes](_OUTBOX_SIZE)
        # Held by whoever is writing to the stream: the writer task, a task writing its
        # own reply (`_reply`), or the farewell of a connection being closed.
        self._writing = trio.Lock()
        # Messages handed to the writer and not yet written, and their bytes; set (and
        # replaced) each time the writer has written some.
        self._queued = 0
        self._queued_bytes = 0
        self._written = trio.Event()
        self._reader_scope = trio.CancelScope()
        self._scope = trio.CancelScope()
        self._streams: trio.Nursery | None = None
        # What this connection is subscribed to, by subscription id (events/subscribe).
        self.subscriptions: dict[str, trio.CancelScope] = {}
        # The sessions its MCP tool calls named (see `methods/sessions.py`).
        self.named_sessions = NamedSessions()
        self._at_close: list[Callable[[], Awaitable[object]]] = []

    def __repr__(self) -> str:
        who = self.principal.name if self.principal else "anonymous"
        return f"<Connection {self.transport} {who}>"

    async def run(self) -> None:
        """Serve until the peer closes or the daemon cancels; always closes the stream."""
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._write_loop)
                    if _expires(self._limits):
                        nursery.start_soon(self._watch)
                    async with trio.open_nursery() as streams:
                        self._streams = streams
                        async with trio.open_nursery() as requests:
                            with self._reader_scope:
                                await self._read_loop(requests)
                        self._streams = None
                        streams.cancel_scope.cancel()
                    self._watch_scope.cancel()
                    self._outbox_send.close()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            with trio.CancelScope(shield=True):
                try:
                    await self._stream.aclose()
                finally:
                    await self._run_at_close()

    def at_close(self, callback: Callable[[], Awaitable[object]]) -> None:
        """Await `callback()` once the connection has closed (shielded); what it
        raises is logged, never propagated."""
        self._at_close.append(callback)

    async def _run_at_close(self) -> None:
        callbacks, self._at_close = self._at_close, []
        for callback in callbacks:
            try:
                await callback()
            except Exception:
                log.exception("a connection's closing work failed")

    def stop_reading(self) -> None:
        """Read no more requests; answer those in flight, then close (for draining)."""
        self._reader_scope.cancel()

    async def notify(self, method: str, params: dict[str, Any], *, request_id: Any = None) -> None:
        """Send a server-to-client notification on this connection (`request_id`, the
        request it belongs to, matters only to transports with a stream per request).

        Waits while the outbox is full (the client is not reading); returns at once,
        sending nothing, once the connection is closing.
        """
        await self._send({"jsonrpc": "2.0", "method": method, "params": params})

    async def ask(
        self, method: str, params: dict[str, Any], *, request_id: Any = None
    ) -> dict[str, Any]:
        """Send a server-to-client request and return the client's result (see
        `AskTable.ask`, which says what it raises); `request_id` as for `notify`."""
        # The answer comes on this stream: a reader waiting for a slot reads on.
        self._changed()
        return await self._asks.ask(self._send, method, params)

    def start_stream(self, stream: Callable[[], Awaitable[object]]) -> None:
        """Run `stream()` in a task of this connection's, beside its requests.

        It runs until it returns, or is cancelled when the connection stops serving
        requests (the peer closed or half-closed, and its requests are answered).
        Raises `RuntimeError` once the connection has stopped serving requests.
        """
        if self._streams is None:
            raise RuntimeError("this connection no longer serves requests")
        self._streams.start_soon(self._run_busy, stream)

    async def _run_busy(self, work: Callable[[], Awaitable[object]]) -> None:
        self._busy += 1
        try:
            await work()
        finally:
            self._busy -= 1
            self._last_seen = trio.current_time()

    def notify_nowait(self, method: str, params: dict[str, Any]) -> bool:
        """Queue a notification without waiting; False if it was dropped.

        For notifications sent from synchronous code. One is dropped only when the
        peer has stopped reading (its outbox is full) or is gone.
        """
        line = encode({"jsonrpc": "2.0", "method": method, "params": params}) + b"\n"
        if not self._fits(line):
            return False
        try:
            self._outbox_send.send_nowait(line)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        # Counted as `_send` counts, or the writer's count of what it has written takes
        # the count below zero, and a reply would go ahead of a message still queued.
        self._queued += 1
        self._queued_bytes += len(line)
        return True

    def login(self, token: str) -> Principal:
        """Authenticate the connection with `token`; raises `Unauthenticated`."""
        principal = self.authenticate(token)
        self.principal: Principal | None = principal
        return principal

    def authenticate(self, token: str) -> Principal:
        """The principal for `token`, counting failures; too many close the connection."""
        principal = self._authenticate(token)
        if principal is not None:
            self._failures = 0
            if not self.authenticated:
                self.authenticated = True
                if self._on_authenticated is not None:
                    self._on_authenticated()
            return principal
        self._failures += 1
        limit = self._limits.max_auth_failures
        if self._failures >= limit:
            self._reader_scope.cancel()
            raise Unauthenticated(
                f"unauthenticated: the token is not valid; {limit} failures in a row, "
                "closing the connection"
            )
        raise Unauthenticated(
            "unauthenticated: the token is not valid; check CONDUIT_TOKEN or the "
            "master token file named in the daemon's log"
        )

    async def _read_loop(self, requests: trio.Nursery) -> None:
        try:
            await self._read_requests(requests)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            # The peer is gone entirely (reset): nobody will read our answers.
            self._peer_gone()
        else:
            if self._left is not None:
                # A sandbox's worker never half-closes: it has exited (as it answered),
                # and its calls still running are calls left behind from now.
                self._peer_gone()
        finally:
            # Nothing more is read, so no answer to a request of ours can come.
            self._asks.close("its connection is no longer read (it closed, or is draining)")

    async def _read_requests(self, requests: trio.Nursery) -> None:
        max_bytes = self._limits.max_message_bytes
        # Closed on the way out: cancelled at one of this loop's own checkpoints, the
        # reader's generator would be left for the garbage collector to finalise.
        reader = LineReader(_Watched(self, self._stream), max_bytes)
        async with contextlib.aclosing(reader.__aiter__()) as lines:
            async for line in lines:
                if isinstance(line, Oversize):
                    await self._refuse(
                        None,
                        InvalidRequest(
                            f"message too large: a line may hold at most {max_bytes} "
                            "bytes; the line was discarded"
                        ),
                    )
                    continue
                try:
                    message = decode(line)  # type: ignore[arg-type]
                except ParseError as exc:
                    await self._refuse(unreadable_id(line), exc)  # type: ignore[arg-type]
                    continue
                await self._start(message, requests, len(line))  # type: ignore[arg-type]

    async def _start(self, message: Any, requests: trio.Nursery, size: int) -> None:
        """Start the task answering `message`, once one of the connection's slots is free.

        While none is, a request is held in a task of its own (`_hold`) and the reader
        reads on, up to as many held as may run; a notification to the daemon
        (`notifications/...`, such as a cancellation) is served at once, without a slot.
        A response (the client's answer to an `ask`) is handed over instead, as are
        those in a batch; nothing answers a response, so one that answers nothing of
        ours is dropped."""
        message = self._take_answers(message)
        if message is None:
            return
        while True:
            if not self._held:  # held requests take the slots first, in turn
                try:  # a free slot, the usual case, is taken without a checkpoint
                    self._slots.acquire_nowait()
                    break
                except trio.WouldBlock:
                    pass
            if _tells(message):  # served here, one at a time: a flood is read no faster
                await self._tell(message, size)
                return
            # Held only for a peer that has shown a token: one that has not may hold
            # no more than its slots.
            if self.authenticated and self._held < self._limits.max_in_flight:
                await self._hold(message, requests, size)
                return
            if len(self._asks):  # the peer's answer may come next: never stop reading
                await self._refuse_held(message)
                return
            self._room = room = trio.Event()
            try:
                await room.wait()
            except trio.Cancelled:  # reading stops (draining): what was read still runs
                self._spawn_held(message, requests, size)
                raise
        self._busy += 1
        requests.start_soon(self._serve_message, message, size)
        # After the spawn rather than before it: the request's task starts in the next
        # scheduler pass instead of the one after, and requests read in one chunk still
        # start in the order they came, one pass apart.
        await trio.lowlevel.checkpoint()

    def _take_answers(self, message: Any) -> Any:
        """`message` without the responses in it, handed to the questions they answer;
        None if nothing else is left."""
        if is_response(message):
            self._asks.answer(message)
            return None
        if isinstance(message, list) and 0 < len(message) <= _MAX_BATCH:
            answers = [item for item in message if is_response(item)]
            for answer in answers:
                self._asks.answer(answer)
            if answers:
                return [item for item in message if not is_response(item)] or None
        return message

    async def _hold(self, message: Any, requests: trio.Nursery, size: int) -> None:
        """Hold `message` until a slot frees, in a task of its own (the reader reads on)."""
        self._spawn_held(message, requests, size)
        # Each held task first runs a scheduler pass after the one before it, so they
        # queue for the slots in the order they came (the lot is FIFO; a pass is not).
        await trio.lowlevel.checkpoint()

    async def _refuse_held(self, message: Any) -> None:
        """Refuse `message` as overloaded: as many requests wait as may run, and the
        daemon waits for the peer's answer, which may be behind it."""
        error = Overloaded(
            f"overloaded: {self._held} requests already wait for a slot on this "
            "connection while the daemon waits for its answer; send the answer, "
            "or fewer requests at once"
        )
        refusal = self._refusals(message, error)
        if refusal is not None:
            await self._send(refusal)

    def _spawn_held(self, message: Any, requests: trio.Nursery, size: int) -> None:
        self._held += 1
        self._busy += 1
        # Cancellable from now, not from when its task first runs: a cancel read next
        # may be served before that.
        waiting = trio.CancelScope()
        ident = _held_id(message)
        if ident is not None:
            self._held_by_id.setdefault(ident, []).append(waiting)
        requests.start_soon(self._serve_held, message, size, ident, waiting)

    async def _serve_held(
        self, message: Any, size: int, ident: Any, waiting: trio.CancelScope
    ) -> None:
        served = False
        try:
            if await self._turn(ident, waiting):
                served = True
            else:  # `cancel_request`: answered, never run
                message = None  # not kept while the answer waits for room
                # Counted as held until it has that room: a peer that reads nothing is
                # read no further by cancelling what it sends.
                await self._send(self._refusal(ident, RequestCancelled()))
        finally:
            self._held -= 1
            if not served:
                self._busy -= 1
            self._changed()
        if served:
            await self._serve_message(message, size)

    async def _turn(self, ident: Any, waiting: trio.CancelScope) -> bool:
        """Wait in `waiting` for a slot; False, holding none, if it was cancelled."""
        try:
            with waiting:
                await self._slots.acquire()
        finally:
            if ident is not None:
                self._unlist(ident, waiting)
        if waiting.cancel_called and not waiting.cancelled_caught:
            self._slots.release()  # the slot came as it was cancelled
        return not waiting.cancel_called

    def _unlist(self, ident: Any, waiting: trio.CancelScope) -> None:
        scopes = self._held_by_id[ident]
        scopes.remove(waiting)
        if not scopes:
            del self._held_by_id[ident]

    def cancel_request(self, request_id: Any) -> bool:
        """Cancel the held request of this id, not yet started (`notifications/cancelled`):
        it is answered as cancelled, and never run. False if no request of this id waits."""
        scopes = self._held_by_id.get(request_id) if _cancellable(request_id) else None
        for waiting in scopes or ():
            waiting.cancel()
        return bool(scopes)

    def _refusals(self, message: Any, error: RpcError) -> Any:
        """The reply refusing `message` unrun: an error for each request it holds, none
        for a notification (each is counted as refused)."""
        items = message if isinstance(message, list) else [message]
        replies = [
            reply
            for item in items
            if (reply := self._refusal(request_id(item), error))
            and not (isinstance(item, dict) and "id" not in item)  # a notification
        ]
        if isinstance(message, list):
            return replies or None
        return replies[0] if replies else None

    def _changed(self) -> None:
        room, self._room = self._room, None
        if room is not None:
            room.set()

    async def _tell(self, message: Any, size: int) -> None:
        """Serve a notification to the daemon read while every slot is taken, in the
        reader; a refusal goes through the writer (the reader may be cancelled, and a
        line once begun must be written whole). So a `notifications/...` method must
        never wait on this peer: only the reader could read its answer."""
        self._busy += 1
        try:
            reply = await self._answer(message, size)
            if reply is not None:
                await self._send(reply)
        finally:
            self._busy -= 1
            self._last_seen = trio.current_time()

    async def _serve_message(self, message: Any, size: int) -> None:
        try:
            if isinstance(message, list):
                reply = await self._answer_batch(message, size)
            else:
                reply = await self._answer(message, size)
            if reply is not None:
                await self._reply(reply)
        finally:
            self._busy -= 1
            self._last_seen = trio.current_time()
            self._slots.release()
            self._changed()

    async def _answer_batch(
        self, batch: list[Any], size: int
    ) -> list[dict[str, Any]] | dict[str, Any] | None:
        if not batch:
            return self._refusal(None, InvalidRequest("invalid request: empty batch"))
        if len(batch) > _MAX_BATCH:
            return self._refusal(
                None, InvalidRequest(f"invalid request: a batch may hold {_MAX_BATCH} calls")
            )
        replies: list[dict[str, Any] | None] = [None] * len(batch)

        async def answer(index: int, message: Any) -> None:
            replies[index] = await self._answer(message, size)

        async with trio.open_nursery() as nursery:
            for index, message in enumerate(batch):
                nursery.start_soon(answer, index, message)
        answered = [reply for reply in replies if reply is not None]
        return answered or None

    async def _answer(self, message: Any, size: int) -> dict[str, Any] | None:
        """The reply to one message of `size` bytes (that of its batch, in one)."""
        if is_response(message):  # in a batch: an answer to an `ask`
            self._asks.answer(message)
            return None
        try:
            request = parse_request(message)
        except InvalidRequest as exc:
            return self._refusal(request_id(message), exc)
        try:
            principal = self._principal_for(request)
            if self._left is None or principal is None:
                result = await self._dispatch(request, principal)
            else:
                owner = principal.owner or principal.name
                with self._left.running(owner, size) as scope:
                    result = await self._dispatch(request, principal)
                if scope.cancelled_caught:  # its peer is gone, and there was no room
                    return None
        except RpcError as exc:
            return None if request.is_notification else error_reply(request.id, exc)
        return None if request.is_notification else result_reply(request.id, result)

    async def _dispatch(self, request: Request, principal: Principal | None) -> Any:
        return await self._dispatcher.dispatch(
            request.method,
            request.params,
            principal=principal,
            peer=self,
            request_id=request.id,
        )

    def _principal_for(self, request: Request) -> Principal | None:
        """Who makes `request`: its bearer token's principal, if it has one, else the
        connection's. A token that stands for nobody is refused here, before dispatch,
        and counted as such."""
        if request.bearer_token is None:
            return self.principal
        try:
            return self.authenticate(request.bearer_token)
        except Unauthenticated as exc:
            self._dispatcher.refused(request.method, exc)
            raise

    def _refusal(self, ident: Any, error: RpcError) -> dict[str, Any]:
        """The reply to a message refused before it named a method, counted as such."""
        self._dispatcher.refused(None, error)
        return error_reply(ident, error)

    async def _refuse(self, ident: Any, error: RpcError) -> None:
        # Through the writer: the reader, which refuses, is cancelled when the
        # connection stops reading and goes on answering.
        await self._send(self._refusal(ident, error))

    async def _reply(self, message: Any) -> None:
        """Write a reply, here if nothing else is being written or waits to be (the
        common, one-request-at-a-time case: no hand-off to another task), else through
        the writer; in order either way.

        Written here only because nothing cancels a request's task while its
        connection goes on: a line, once begun, must be written whole, or every later
        message would be unreadable to the peer. Whatever may stop waiting for its
        message (a timeout) sends it with `_send`.
        """
        if self._queued == 0 and not (self._left is not None and self._left.gone):
            try:
                self._writing.acquire_nowait()
            except trio.WouldBlock:
                pass
            else:
                try:
                    await self._stream.send_all(encode(message) + b"\n")
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self._peer_gone()  # as in `_write_loop`
                finally:
                    self._writing.release()
                return
        await self._send(message)

    async def _send(self, message: Any) -> None:
        """Queue `message` for the writer, which writes it whole, in order. Waits while
        the queue is full (the peer is not reading); a caller that stops waiting then
        has sent nothing, and never half a line."""
        if self._left is not None and self._left.gone:
            return  # nobody reads it
        data = encode(message) + b"\n"
        while not self._fits(data):
            if self._outbox_send.statistics().open_receive_channels == 0:
                return  # the writer is gone with the peer: nobody is left to tell
            await self._written.wait()
        self._queued += 1
        self._queued_bytes += len(data)
        try:
            await self._outbox_send.send(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            # A closed outbox means the writer is gone with the peer: nobody is left to tell.
            self._unqueue(1, len(data))
        except BaseException:  # cancelled before the writer took it
            self._unqueue(1, len(data))
            raise

    def _fits(self, data: bytes) -> bool:
        """Whether `data` may join the writer's queue now: it is empty, or `data` keeps
        its bytes within `_OUTBOX_BYTES` (its count the channel bounds)."""
        return self._queued_bytes == 0 or self._queued_bytes + len(data) <= _OUTBOX_BYTES

    def _unqueue(self, count: int, size: int) -> None:
        self._queued -= count
        self._queued_bytes -= size
        self._written.set()
        self._written = trio.Event()

    async def _write_loop(self) -> None:
        try:
            async for first in self._outbox:
                chunks = [first]
                while True:
                    try:
                        chunks.append(self._outbox.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                async with self._writing:
                    await self._stream.send_all(b"".join(chunks))
                self._unqueue(len(chunks), sum(len(chunk) for chunk in chunks))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            # The peer is gone: nothing we compute can reach it any more. Whoever waits
            # to hand the writer a reply is let go.
            self._outbox.close()
            self._written.set()
            self._peer_gone()

    def _peer_gone(self) -> None:
        """The peer reads nothing more: a client's requests are cancelled with the
        connection; a sandbox's go on within their room (`LeftRequests`), and the
        requests it wrote before it went are still read."""
        if self._left is None:
            self._scope.cancel()
        else:
            self._left.peer_gone()

    # ---- deadlines ---------------------------------------------------------------

    async def _watch(self) -> None:
        """Close the connection at its first deadline that passes; returns if none can."""
        auth_s, idle_s = self._limits.auth_s, self._limits.idle_s
        with self._watch_scope:
            if auth_s is not None and not self.authenticated:
                await trio.sleep_until(self._opened_at + auth_s)
                if not self.authenticated:
                    await self._close_for(
                        Unauthenticated(
                            f"unauthenticated: no valid token within {auth_s:g} s of "
                            "connecting; closing the connection. Send auth/login first"
                        )
                    )
                    return
            if idle_s is not None:
                await self._wait_idle(idle_s)
                await self._close_for(
                    Overloaded(
                        f"idle: nothing sent or in flight for {idle_s:g} s; closing the "
                        "connection (server.idle_timeout_s); connect again when needed"
                    )
                )

    async def _wait_idle(self, idle_s: float) -> None:
        """Return once nothing has run or arrived for `idle_s`; sleeps, never polls."""
        while True:
            now = trio.current_time()
            deadline = now + idle_s if self._busy else self._last_seen + idle_s
            if deadline <= now:
                return
            await trio.sleep_until(deadline)

    async def _close_for(self, error: RpcError) -> None:
        """Tell the peer why, if that can be written at once, then close."""
        log.info("closing connection", extra={"transport": self.transport, "reason": error.message})
        line = encode(error_reply(None, error)) + b"\n"
        with (
            trio.move_on_after(_FAREWELL_S),
            contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
        ):
            async with self._writing:
                await self._stream.send_all(line)
        self._scope.cancel()
