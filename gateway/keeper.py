"""The keeper: one task holding one MCP client session open, whatever the transport.

`SessionKeeper` is what `StdioUpstream` and `HttpUpstream` share. Its `serve` task
opens the transport a subclass provides (`_open_transport`), runs the official SDK's
`Client` over it (which negotiates the protocol version: `server/discover` for
2026-07-28, else the `initialize` handshake), walks `tools/list` to its last page,
re-lists when the server says the list changed, and reconnects with exponential
back-off when the connection ends. `call_tool` may be called from any task in the same
Trio run while the upstream is ready: the SDK correlates requests by id, so callers
only share the session, never its context managers. A transport that offers
`DirectRequests` (stdio does) carries tool calls itself, stamped and checked exactly as
the session would (see `direct_requests.py` for why); the session keeps the rest.

Resource handling: the transport, the SDK session and every helper task are opened and
closed by the `serve` task and nothing else (exiting one task's context managers from
another is what breaks the SDK's `ClientSessionGroup`). Cancelling `serve` closes
everything; in-flight calls then fail with `UpstreamUnreachable`.

Error handling: nothing escapes `serve` but cancellation. A failed connection is a
state (`BACKING_OFF` with `last_error`), and a configuration that can never work is
`FAILED`. `call_tool` raises only `UpstreamUnreachable`, never wire errors.

This module does not know how bytes reach the server, nor what the tools are used for.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import logging
import math
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from types import TracebackType, UnionType
from typing import Any, ClassVar, NoReturn, Protocol, Self, TypeVar, get_args

import anyio
import mcp_types as types
import trio
from mcp.client import Client, ClientSession, IncomingMessage
from mcp.client.subscriptions import SubscriptionLost, ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types import methods as mcp_methods
from mcp_types.version import KNOWN_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ValidationError

from conduit.core.errors import UpstreamUnreachable
from conduit.core.version import VERSION
from conduit.gateway.asks import CallAsks
from conduit.gateway.direct_requests import ConnectionClosed, DirectRequests
from conduit.gateway.model import UpstreamState, UpstreamStatus
from conduit.gateway.settings import HttpUpstreamSettings, StdioUpstreamSettings
from conduit.gateway.upstream import CallObserver, RawTool, StateListener

__all__ = [
    "MAX_MESSAGE_BYTES",
    "Misconfigured",
    "RateLimit",
    "ReadStream",
    "ReadStreamWrapper",
    "ReconnectBackoff",
    "SessionKeeper",
    "TransportStreams",
    "WriteStream",
    "answer_too_large",
]

log = logging.getLogger("conduit.gateway.upstream")

CLIENT_INFO = types.Implementation(name="conduit", version=VERSION)

# Back-off between connection attempts: fast enough that a crash costs a program
# little, doubling so a server that cannot start does not burn a core, capped so a
# recovered server is noticed within half a minute.
INITIAL_BACKOFF_S = 0.1
MAX_BACKOFF_S = 30.0
# A session that stayed up this long was not part of a crash loop: start over at 0.1 s.
HEALTHY_AFTER_S = 60.0
# A server whose cursors never end cannot hang the listing: 1000 pages is far more
# than any real server has tools.
MAX_TOOL_PAGES = 1000
# How long leaving a session may take (an HTTP DELETE to a server that stopped
# answering); stdio servers are stopped by their own shielded, bounded sequence.
CLOSE_TIMEOUT_S = 5.0
# Error texts end up in `upstreams/list` and logs; an upstream controls part of them.
MAX_ERROR_CHARS = 500
# The largest JSON-RPC message read from a server, whatever the transport (a stdio
# line, an SSE event, an HTTP body): tool results can be big (a file, a page), but
# one this long is a runaway. It is not held whole: it fails the request it answers.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# The `data` key that marks an `answer_too_large` error.
_TOO_LARGE_KEY = "conduitAnswerTooLarge"
# How long a relayed log message may wait on the client it goes to: the connection's
# message loop waits meanwhile, and must not for a client that stopped reading.
_RELAY_S = 1.0


_T_co = TypeVar("_T_co", covariant=True)
_T_contra = TypeVar("_T_contra", contravariant=True)


class ReadStream(Protocol[_T_co]):
    """What a transport's read stream offers: anyio's memory streams, and the SDK's own
    transports' streams, have this shape (the SDK declares it, but not publicly)."""

    async def receive(self) -> _T_co: ...
    async def aclose(self) -> None: ...
    def __aiter__(self) -> ReadStream[_T_co]: ...
    async def __anext__(self) -> _T_co: ...
    async def __aenter__(self) -> Self: ...
    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None: ...


class WriteStream(Protocol[_T_contra]):
    """What a transport's write stream offers (as `ReadStream`)."""

    async def send(self, item: _T_contra, /) -> None: ...
    async def aclose(self) -> None: ...
    async def __aenter__(self) -> Self: ...
    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None: ...


# The streams of one connection, as the SDK's `Client` takes them from a transport: on
# the read side an `Exception` stands for a line that was not JSON-RPC.
TransportStreams = tuple[ReadStream[SessionMessage | Exception], WriteStream[SessionMessage]]


def answer_too_large(size_bytes: int | None, max_bytes: int) -> types.ErrorData:
    """The error a transport answers a request with in place of a response it would not
    read, being longer than `max_bytes`: the request fails at once and the connection
    goes on. `size_bytes` is None when the transport stopped reading at the cap
    without learning the whole size. `call_tool` knows it by its `data`."""
    limit = f"the {max_bytes} bytes ({max_bytes / 2**20:g} MiB) the daemon reads from an upstream"
    if size_bytes is None:
        message = f"the answer was more than {limit}; it was dropped, the rest unread"
        sizes = {"maxBytes": max_bytes}
    else:
        message = f"the answer was {size_bytes} bytes, more than {limit}; it was dropped unread"
        sizes = {"sizeBytes": size_bytes, "maxBytes": max_bytes}
    return types.ErrorData(code=types.INTERNAL_ERROR, message=message, data={_TOO_LARGE_KEY: sizes})


def _is_too_large(exc: MCPError) -> bool:
    return isinstance(exc.data, dict) and _TOO_LARGE_KEY in exc.data


class Misconfigured(Exception):
    """Retrying cannot help (a missing executable, say): the configuration must change."""


class _SessionLost(Exception):
    """The connection ended or never came up; the message says how."""


@dataclass
class ReconnectBackoff:
    """Delays between connection attempts: doubling from `initial_s` up to `max_s`.

    A session that was up for at least `healthy_after_s` resets the sequence.
    """

    initial_s: float = INITIAL_BACKOFF_S
    max_s: float = MAX_BACKOFF_S
    healthy_after_s: float = HEALTHY_AFTER_S
    _next_s: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self._next_s = self.initial_s

    def next_delay(self, up_for_s: float) -> float:
        """The delay before the next attempt, after a session that was up `up_for_s`."""
        if up_for_s >= self.healthy_after_s:
            self._next_s = self.initial_s
        delay = self._next_s
        self._next_s = min(self._next_s * 2, self.max_s)
        return delay


@dataclass
class RateLimit:
    """A token bucket for log lines an upstream can cause: a burst, then a steady rate.

    `allow()` says whether to log one more line; lines refused are counted, and the
    count is handed back (`take_suppressed`) once logging resumes.
    """

    burst: int = 100
    per_s: float = 10.0
    _tokens: float = field(init=False, default=0.0)
    _stamp: float = field(init=False, default=-math.inf)
    _suppressed: int = field(init=False, default=0)

    def allow(self) -> bool:
        now = trio.current_time()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.per_s)
        self._stamp = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        self._suppressed += 1
        return False

    def take_suppressed(self) -> int:
        count, self._suppressed = self._suppressed, 0
        return count


class _Wrapping:
    """A stream around `_inner`: closing it closes the inner one, as a block or not."""

    _inner: Any

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class ReadStreamWrapper(_Wrapping):
    """A transport's read stream seen through `receive`, which a subclass defines:
    iterated, and asked for its `last_context`, as the SDK's dispatcher does."""

    @property
    def last_context(self) -> Any:
        # The dispatcher runs handlers in the sender's contextvars when the stream has them.
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        raise NotImplementedError

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None


class _WatchedStream(ReadStreamWrapper):
    """The transport's read stream, unchanged, except that its end sets `ended`.

    The end of the read stream is the one signal every transport gives when the
    connection dies (a stdio server exited, an HTTP transport gave up); the SDK's
    dispatcher sees it too and fails the in-flight requests.
    """

    def __init__(self, inner: ReadStream[Any], ended: Callable[[str], None]) -> None:
        self._inner = inner
        self._ended = ended

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._ended("the connection closed")
            raise


# The `_meta` keys the session puts on every request it sends once the version is
# negotiated (2026-07-28; none before); others, a trace context say, are per request.
STAMP_KEYS = frozenset(
    {
        types.PROTOCOL_VERSION_META_KEY,
        types.CLIENT_INFO_META_KEY,
        types.CLIENT_CAPABILITIES_META_KEY,
        types.LOG_LEVEL_META_KEY,
    }
)


class _StampedWrites(_Wrapping):
    """The transport's write stream, unchanged, except that it keeps the session's stamp
    from each `tools/list` request the session writes (`connection.call_meta`).

    `DirectRequests` put that stamp on their tool calls, taken from what the session
    itself wrote, so the two cannot differ.
    """

    def __init__(self, inner: WriteStream[SessionMessage], connection: _Connection) -> None:
        self._inner = inner
        self._connection = connection

    async def send(self, item: SessionMessage, /) -> None:
        message = item.message
        if isinstance(message, types.JSONRPCRequest) and message.method == "tools/list":
            meta = (message.params or {}).get("_meta") or {}
            stamp = {key: value for key, value in meta.items() if key in STAMP_KEYS}
            self._connection.call_meta = stamp or None
        await self._inner.send(item)


@dataclass
class _Connection:
    """One connection: what `call_tool` talks to, and how `serve` learns it ended.

    Created before the SDK client so the transport can report its end at any time.
    """

    client: Client | None = None
    lost: trio.Event = field(default_factory=trio.Event)
    lost_reason: str = ""
    relist: trio.Event = field(default_factory=trio.Event)
    # Set once ready, for transports that carry tool calls themselves: the requests
    # and the negotiated version.
    direct: DirectRequests | None = None
    # The `_meta` the session stamps on each request, as its last `tools/list` carried
    # it (see `_StampedWrites`).
    call_meta: dict[str, Any] | None = None
    version: str = ""

    @property
    def session(self) -> ClientSession:
        assert self.client is not None, "the client is set before the connection is used"
        return self.client.session

    def mark_lost(self, reason: str) -> None:
        if not self.lost.is_set():
            self.lost_reason = reason
            self.lost.set()
        # Direct calls in flight fail now, after `lost` is set, as the session's do.
        if self.direct is not None:
            self.direct.close()


class SessionKeeper(abc.ABC):
    """An `Upstream` over one SDK client session, reconnected with back-off.

    Subclasses provide `transport` (its name in status) and `_open_transport`, and may
    refine `_explain` (how a lost connection is described).
    """

    transport: ClassVar[str]
    # `call_tool` bounds every call by its `timeout_s` (see `Upstream`).
    enforces_timeout: ClassVar[bool] = True
    # `call_tool` takes a `CallObserver` (see `Upstream`).
    relays_notifications: ClassVar[bool] = True

    def __init__(self, settings: StdioUpstreamSettings | HttpUpstreamSettings) -> None:
        self.name = settings.name
        # Its tools' ids are their own names (see the settings).
        self.bare_names = settings.bare_names
        self._settings = settings
        self._state = UpstreamState.STARTING
        self._tools: list[RawTool] = []
        self._last_error: str | None = None
        self._restarts = 0
        self._protocol_version: str | None = None
        self._server_info: dict[str, Any] | None = None
        self._connection: _Connection | None = None
        # Set (and replaced) on every change, for `wait_until`.
        self._changed = trio.Event()
        self._serving = False
        self._garbage_log = RateLimit()
        # The first line this connection attempt got that was not JSON-RPC.
        self._garbage: str | None = None
        # When the current session became ready (None: it has not).
        self._ready_since: float | None = None
        self._state_listeners: list[StateListener] = []
        # Calls in flight, each with its observer (None: it wants nothing relayed).
        self._observers: dict[int, CallObserver | None] = {}
        self._next_call = 0
        # The call the server's log messages go to, and its connection (`_relay_log`).
        self._solo: tuple[int, _Connection] | None = None
        # A connection on which a call was given up (cancelled, timed out): the server
        # may still be working on it, and logging about it, for as long as it lives.
        self._abandoned_on: _Connection | None = None
        # Requests passed on to a call's client (`_relay_ask`), ended with the call, and
        # each call's deadline, which stands still while they wait.
        self._asks = CallAsks()
        self._deadlines: dict[int, trio.CancelScope] = {}

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name!r} [{self._state.value} | "
            f"{len(self._tools)} tools, {self._restarts} restarts]>"
        )

    # -- the Upstream protocol ------------------------------------------------------

    def status(self) -> UpstreamStatus:
        """A snapshot for `upstreams/list`."""
        return UpstreamStatus(
            name=self.name,
            transport=self.transport,
            state=self._state,
            tools=len(self._tools),
            last_error=self._last_error,
            restarts=self._restarts,
            protocol_version=self._protocol_version,
            server_info=self._server_info,
        )

    async def serve(
        self,
        on_tools: Callable[[list[RawTool]], None],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Keep a session to the server open until cancelled, reconnecting as needed.

        Calls `task_status.started()` once the first attempt has ended, whether the
        upstream became ready or not, and `on_tools` with the whole tool list each time
        it is fetched. Returns only when cancelled (or at once for a disabled upstream);
        the transport, session and helper tasks are all closed before it does.
        """
        if self._serving:
            raise RuntimeError(f"upstream {self.name!r} is already being served")
        self._serving = True
        started = _Once(task_status.started)
        try:
            if not self._settings.enabled:
                self._set_state(UpstreamState.CLOSED)
                started()
                return
            await self._keep_connected(on_tools, started)
        finally:
            self._connection = None
            self._serving = False
            self._set_state(UpstreamState.CLOSED)

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        timeout_s: float,
        observer: CallObserver | None = None,
    ) -> dict[str, Any]:
        """Call tool `name` and return its `CallToolResult` as JSON (wire field names).

        Raises `UpstreamUnreachable` when the upstream is not ready, when no answer
        comes within `timeout_s`, when the connection ends mid-call, or when the
        server answers a JSON-RPC error or something that is not a tool result. A
        tool that fails is a result with `isError: true`, not an exception.
        """
        connection = self._connection
        if connection is None:
            raise UpstreamUnreachable(self._not_ready_message())
        if connection.lost.is_set():
            raise UpstreamUnreachable(
                f"upstream {self.name!r} lost its connection ({connection.lost_reason}); "
                "it is being reconnected"
            )
        with (
            trio.move_on_after(timeout_s) as deadline,
            self._observing(observer, connection, deadline),
        ):
            try:
                progress = observer.progress if observer is not None else None
                # The SDK session matches progress to its request; direct calls do not.
                if connection.direct is not None and progress is None:
                    result = await _call_direct(connection, name, arguments)
                else:
                    request = types.CallToolRequest(
                        params=types.CallToolRequestParams(name=name, arguments=arguments)
                    )
                    result = await connection.session.send_request(
                        request, types.CallToolResult, progress_callback=progress
                    )
            except MCPError as exc:
                raise UpstreamUnreachable(self._call_error(name, connection, exc)) from None
            except ValidationError as exc:
                raise UpstreamUnreachable(
                    f"upstream {self.name!r} answered tools/call {name!r} with something that "
                    f"is not a tool result: {_first_line(exc)}"
                ) from None
        if deadline.cancelled_caught:
            raise UpstreamUnreachable(
                f"upstream {self.name!r} did not answer tools/call {name!r} within "
                f"{timeout_s:g} s; the call was cancelled (raise its timeout if the tool is slow)"
            )
        return result.model_dump(by_alias=True, mode="json", exclude_none=True)

    @contextlib.contextmanager
    def _observing(
        self, observer: CallObserver | None, connection: _Connection, deadline: trio.CancelScope
    ) -> Iterator[None]:
        """Count a call in flight, with what it wants relayed, while the block runs.

        A log message carries no hint of its request (not on stdio), so the call that
        hears them is the solo one: it started with no other call in flight on a
        connection where no call was ever given up, and none has started since. Any
        other message might be about another caller's call, and is dropped."""
        key, self._next_call = self._next_call, self._next_call + 1
        solo = not self._observers and self._abandoned_on is not connection
        self._solo = (key, connection) if solo else None
        self._observers[key] = observer
        self._deadlines[key] = deadline
        try:
            yield
        except trio.Cancelled:
            self._abandoned_on = connection
            raise
        finally:
            del self._observers[key]
            del self._deadlines[key]
            if self._solo is not None and self._solo[0] == key:
                self._solo = None
            self._asks.end(key)

    async def _relay_log(
        self, connection: _Connection, params: types.LoggingMessageNotificationParams
    ) -> None:
        """A server's log message, to the solo call (`_observing`) if there is one."""
        if self._solo is None or self._solo[1] is not connection:
            return
        observer = self._observers[self._solo[0]]
        if observer is not None and observer.log is not None:
            with trio.move_on_after(_RELAY_S):
                await observer.log(str(params.level), params.logger, params.data)

    async def _relay_ask(
        self, connection: _Connection, method: str, context: object, params: BaseModel
    ) -> BaseModel:
        """A server's request of its client (the SDK's sampling or elicitation
        callback): passed on to the solo call's client (`_observing`), whose answer is
        returned, or refused with an `ErrorData` the server gets as a JSON-RPC error."""
        solo = self._solo
        observer = self._observers.get(solo[0]) if solo and solo[1] is connection else None
        if solo is None or observer is None or observer.ask is None:
            return types.ErrorData(
                code=types.INVALID_REQUEST,
                message=f"Conduit has no client to pass {method} to: only a call made "
                "alone, by an MCP client that answers it, can ask its client",
            )
        key = solo[0]
        return await self._asks.relay(key, observer, self._deadlines.get(key), method, params)

    def watch_state(self, listener: StateListener) -> None:
        """Call `listener(self.status())` after every change of state (`ReportsState`).

        Called from the `serve` task; a listener that raises is logged and ignored.
        """
        self._state_listeners.append(listener)

    # -- for the gateway and tests ------------------------------------------------

    async def wait_until(self, predicate: Callable[[UpstreamStatus], bool]) -> UpstreamStatus:
        """Block until `predicate(self.status())` holds; return that status.

        Checked after every change of state, tool list or error, so a state held
        across a checkpoint is seen. Callers bound the wait (`trio.fail_after`).
        """
        while not predicate(status := self.status()):
            await self._changed.wait()
        return status

    # -- subclass hooks -------------------------------------------------------------

    @abc.abstractmethod
    def _open_transport(
        self, ended: Callable[[str], None]
    ) -> AbstractAsyncContextManager[TransportStreams]:
        """The streams of one connection; exiting closes it (within bounded time).

        The end of the read stream ends the connection; a transport that learns of the
        end some other way (an HTTP 404 for the session) calls `ended(reason)`.
        """

    def _explain(self, exc: BaseException) -> str:
        """One line saying why a connection attempt or session ended."""
        return _describe(exc)

    def _direct_requests(self) -> DirectRequests | None:
        """The current connection's `DirectRequests`, for a transport that has them;
        None (the default) sends tool calls through the SDK session."""
        return None

    # -- the keeper loop ------------------------------------------------------------

    async def _keep_connected(
        self, on_tools: Callable[[list[RawTool]], None], started: Callable[[], None]
    ) -> NoReturn:
        backoff = ReconnectBackoff()
        while True:
            self._ready_since = None
            self._garbage = None
            try:
                await self._run_session(on_tools, started)
            except Misconfigured as exc:
                self._fail(str(exc))
                started()
                await trio.sleep_forever()
            except Exception as exc:
                error = self._explain(exc)
                if self._garbage:  # most likely the cause, so it goes first
                    error = f"{self._garbage}; {error}"
                error = _bounded(error)
                log.warning("upstream %s: %s", self.name, error, extra={"upstream": self.name})
                log.debug("upstream %s ended", self.name, exc_info=exc)
            except BaseExceptionGroup as group:
                raise _cancellation_alone(group, self.name) from None
            since = self._ready_since
            up_for = 0.0 if since is None else trio.current_time() - since
            self._set_state(UpstreamState.BACKING_OFF, error=error)
            started()
            await trio.sleep(backoff.next_delay(up_for))
            self._restarts += 1
            self._set_state(UpstreamState.STARTING, error=self._last_error)

    async def _run_session(
        self, on_tools: Callable[[list[RawTool]], None], started: Callable[[], None]
    ) -> NoReturn:
        """Connect, list, serve until the connection is lost; always raises.

        One cancel scope bounds the setup (`list_timeout_s`) and later the close
        (`CLOSE_TIMEOUT_S`); in between, while ready, the session is unbounded.
        """
        timeout_s = self._settings.list_timeout_s
        connection = _Connection()
        with trio.CancelScope(deadline=trio.current_time() + timeout_s) as scope:
            async with self._connect(connection), trio.open_nursery() as nursery:
                # Subscribe before listing, so no change falls between the two.
                if self._wants_listen(connection.session):
                    await nursery.start(self._listen_for_changes, connection)
                tools = await self._list_tools(connection.session)
                scope.deadline = math.inf
                self._become_ready(connection, tools, on_tools)
                started()
                nursery.start_soon(self._refresh_on_change, connection, on_tools)
                try:
                    await connection.lost.wait()
                finally:
                    self._connection = None
                    scope.deadline = trio.current_time() + CLOSE_TIMEOUT_S
                nursery.cancel_scope.cancel()
        if scope.cancelled_caught and self._ready_since is None:
            raise _SessionLost(
                f"no working session within {timeout_s:g} s (handshake and tools/list); "
                "check that the server speaks MCP on this transport, or raise list_timeout_s"
            )
        raise _SessionLost(connection.lost_reason or "the connection closed")

    @asynccontextmanager
    async def _connect(self, connection: _Connection) -> AsyncIterator[None]:
        """Open the transport and the SDK client over it, negotiating the version."""
        asks: dict[str, Any] = {}
        if self._settings.ask_clients:  # declared only then: see the setting
            asks = {
                "sampling_callback": functools.partial(
                    self._relay_ask, connection, "sampling/createMessage"
                ),
                "elicitation_callback": functools.partial(
                    self._relay_ask, connection, "elicitation/create"
                ),
            }
        client = Client(
            self._watched(connection),
            mode="legacy" if self._settings.handshake == "initialize" else "auto",
            cache=None,  # every listing must come from the server, not a TTL cache
            message_handler=self._on_message(connection),
            client_info=CLIENT_INFO,
            **asks,
        )
        async with client:
            connection.client = client
            yield

    @asynccontextmanager
    async def _watched(self, connection: _Connection) -> AsyncIterator[TransportStreams]:
        ended = connection.mark_lost
        async with self._open_transport(ended) as (read_stream, write_stream):
            yield _WatchedStream(read_stream, ended), _StampedWrites(write_stream, connection)

    def _become_ready(
        self,
        connection: _Connection,
        tools: list[RawTool],
        on_tools: Callable[[list[RawTool]], None],
    ) -> None:
        client = connection.client
        assert client is not None
        self._protocol_version = client.protocol_version
        connection.direct = self._direct_requests()
        if connection.direct is not None:
            connection.version = client.protocol_version
        info = client.server_info
        self._server_info = info.model_dump(mode="json", exclude_none=True) if info else None
        self._tools = tools
        self._connection = connection
        self._ready_since = trio.current_time()
        self._set_state(UpstreamState.READY, error=None)
        log.info(
            "upstream %s ready: %d tools, protocol %s",
            self.name,
            len(tools),
            self._protocol_version,
            extra={"upstream": self.name},
        )
        on_tools(list(tools))

    async def _list_tools(self, session: ClientSession) -> list[RawTool]:
        """Every tool the server offers, following `nextCursor` to the last page."""
        tools: list[RawTool] = []
        cursor: str | None = None
        seen: set[str] = set()
        for _ in range(MAX_TOOL_PAGES):
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params)
            tools += [
                tool.model_dump(by_alias=True, mode="json", exclude_none=True)
                for tool in page.tools
            ]
            cursor = page.next_cursor
            if cursor is None:
                return tools
            if cursor in seen:
                raise _SessionLost(f"tools/list repeated the cursor {cursor[:80]!r}")
            seen.add(cursor)
        raise _SessionLost(f"tools/list did not end within {MAX_TOOL_PAGES} pages")

    async def _refresh_on_change(
        self, connection: _Connection, on_tools: Callable[[list[RawTool]], None]
    ) -> None:
        """Re-list each time the server says its tools changed (bursts coalesce), and
        at least every `schema_ttl_s` for servers that never say (0: only on change)."""
        ttl_s = self._settings.schema_ttl_s or math.inf
        while True:
            with trio.move_on_after(ttl_s):
                await connection.relist.wait()
            connection.relist = trio.Event()
            timeout_s = self._settings.list_timeout_s
            # The old list stays when this fails; calls to tools that went away fail upstream.
            with trio.move_on_after(timeout_s) as scope:
                try:
                    tools = await self._list_tools(connection.session)
                except (MCPError, ValidationError, _SessionLost) as exc:
                    self._set_error(f"re-listing tools failed: {_describe(exc)}")
                    continue
            if scope.cancelled_caught:
                self._set_error(f"re-listing tools took longer than {timeout_s:g} s")
                continue
            self._tools = tools
            self._set_error(None)
            on_tools(list(tools))

    def _wants_listen(self, session: ClientSession) -> bool:
        # On 2026-07-28 change notifications come only on a subscriptions/listen
        # stream; earlier versions send them spontaneously (see `_on_message`).
        if session.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return False
        capabilities = session.server_capabilities
        return bool(capabilities and capabilities.tools and capabilities.tools.list_changed)

    async def _listen_for_changes(
        self, connection: _Connection, *, task_status: trio.TaskStatus[None]
    ) -> None:
        """Hold a `subscriptions/listen` stream; started once the server acknowledged it.

        Its end means the connection ended: the spec has no replay, and a client whose
        stream drops re-listens and refetches, which is what reconnecting does.
        """
        started = _Once(task_status.started)
        assert connection.client is not None
        try:
            async with connection.client.listen(tools_list_changed=True) as subscription:
                started()
                async for event in subscription:
                    if isinstance(event, ToolsListChanged):
                        connection.relist.set()
            connection.mark_lost("the server closed its subscriptions/listen stream")
        except SubscriptionLost:
            connection.mark_lost("the server dropped its subscriptions/listen stream")
        except MCPError as exc:
            # A server may refuse to listen; it just never tells us about changes.
            log.info(
                "upstream %s refused subscriptions/listen: %s",
                self.name,
                _describe(exc),
                extra={"upstream": self.name},
            )
        started()

    def _on_message(self, connection: _Connection) -> Callable[[IncomingMessage], Any]:
        async def handle(message: IncomingMessage) -> None:
            if isinstance(message, Exception):
                self._note_garbage(message)
            elif isinstance(message, types.ToolListChangedNotification):
                connection.relist.set()
            elif isinstance(message, types.LoggingMessageNotification):
                await self._relay_log(connection, message.params)
            await trio.lowlevel.checkpoint()

        return handle

    def _note_garbage(self, exc: Exception) -> None:
        error = _bounded(f"the server wrote something that is not JSON-RPC ({exc})")
        self._garbage = self._garbage or error
        self._set_error(error)
        if self._garbage_log.allow():
            suppressed = self._garbage_log.take_suppressed()
            log.warning(
                "upstream %s: %s%s",
                self.name,
                error,
                f" ({suppressed} more suppressed)" if suppressed else "",
                extra={"upstream": self.name},
            )

    # -- state ----------------------------------------------------------------------

    def _set_state(self, state: UpstreamState, *, error: str | None = None) -> None:
        changed = state is not self._state
        self._state = state
        self._last_error = error if error is None else _bounded(error)
        self._changed.set()
        self._changed = trio.Event()
        if changed and self._state_listeners:
            status = self.status()
            for listener in self._state_listeners:
                try:
                    listener(status)
                except Exception:  # a watcher's fault must not stop the upstream
                    log.exception("upstream %s: a state listener failed", self.name)

    def _set_error(self, error: str | None) -> None:
        self._set_state(self._state, error=error)

    def _fail(self, error: str) -> None:
        log.error("upstream %s: %s", self.name, error, extra={"upstream": self.name})
        self._set_state(UpstreamState.FAILED, error=error)

    def _not_ready_message(self) -> str:
        why = f": {self._last_error}" if self._last_error else ""
        return f"upstream {self.name!r} is not connected ({self._state.value}){why}"

    def _call_error(self, tool: str, connection: _Connection, exc: MCPError) -> str:
        if _is_too_large(exc):
            return _bounded(
                f"upstream {self.name!r} answered tools/call {tool!r} with too much: "
                f"{exc.message}; other calls go on (ask the tool for less: a smaller page "
                "or range)"
            )
        if connection.lost.is_set():
            return (
                f"upstream {self.name!r} closed the connection during tools/call {tool!r} "
                f"({connection.lost_reason or exc.message}); it is being reconnected"
            )
        if exc.code == types.CONNECTION_CLOSED:
            # The SDK's HTTP transport gave up on this call's stream alone (an SSE event
            # past `MAX_MESSAGE_BYTES`, a stream that ended early): the session is up.
            return _bounded(
                f"upstream {self.name!r} gave no answer to tools/call {tool!r} "
                f"({exc.message}); other calls go on"
            )
        return _bounded(
            f"upstream {self.name!r} answered tools/call {tool!r} with error {exc.code}: "
            f"{exc.message}"
        )


async def _call_direct(
    connection: _Connection, name: str, arguments: dict[str, Any]
) -> types.CallToolResult:
    """`tools/call` through the transport's `DirectRequests`: the request the session
    would send, its result checked as `ClientSession.send_request` checks it.

    Raises `MCPError` and `ValidationError` as `send_request` does.
    """
    assert connection.direct is not None
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if connection.call_meta is not None:
        params["_meta"] = connection.call_meta
    try:
        raw = await connection.direct.request("tools/call", params)
    except ConnectionClosed:
        # A write that found the server gone: the session hears of it a moment later,
        # from its read stream, and calls after this one must not wait for that.
        connection.mark_lost("the connection closed")
        raise
    _floor_ttl(raw)
    version = connection.version
    with contextlib.suppress(KeyError):  # no row for this version: nothing to check
        mcp_methods.validate_server_result("tools/call", version, raw)
    if not (foreign := _later_revision_fields("tools/call", version)).isdisjoint(raw):
        raw = {key: value for key, value in raw.items() if key not in foreign}
    return types.CallToolResult.model_validate(raw, by_name=False)


def _floor_ttl(raw: dict[str, Any]) -> None:
    """A negative `ttlMs` becomes 0 (2026-07-28: a client should treat it so), rather
    than fail the result's validation; as the session does."""
    ttl = raw.get("ttlMs")
    if isinstance(ttl, int | float) and not isinstance(ttl, bool) and ttl < 0:
        raw["ttlMs"] = 0


@functools.cache
def _later_revision_fields(method: str, version: str) -> frozenset[str]:
    """The result fields of `method` that a revision after `version` declares and
    `version` does not (none at the newest revision, or for an unknown one).

    The result types carry every revision's fields, so such a field in an answer on
    an older session is outside the negotiated contract yet would be held to the later
    revision's constraints: the session drops them before parsing, and so do we.
    """
    current = mcp_methods.SERVER_RESULTS.get((method, version))
    if current is None or version not in KNOWN_PROTOCOL_VERSIONS:
        return frozenset()
    later: set[str] = set()
    for revision in KNOWN_PROTOCOL_VERSIONS[KNOWN_PROTOCOL_VERSIONS.index(version) + 1 :]:
        row = mcp_methods.SERVER_RESULTS.get((method, revision))
        if row is not None:
            later |= _wire_fields(row)
    return frozenset(later) - _wire_fields(current)


def _wire_fields(result: type[BaseModel] | UnionType) -> frozenset[str]:
    """The top-level wire names a result type declares (its members', for a union)."""
    members = get_args(result) if isinstance(result, UnionType) else (result,)
    return frozenset(
        field.alias or name
        for model in members
        if isinstance(model, type) and issubclass(model, BaseModel)
        for name, field in model.model_fields.items()
    )


@dataclass
class _Once:
    """Call `fn` the first time only (`task_status.started` may be called once)."""

    fn: Callable[[], Any]
    done: bool = False

    def __call__(self) -> None:
        if not self.done:
            self.done = True
            self.fn()


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def _describe(exc: BaseException) -> str:
    """One bounded line for an exception, looking through exception groups."""
    leaf = next((e for e in _leaves(exc) if not isinstance(e, trio.Cancelled)), exc)
    if isinstance(leaf, _SessionLost | Misconfigured):
        return _bounded(str(leaf))
    if isinstance(leaf, MCPError):
        return _bounded(f"MCP error {leaf.code}: {leaf.message}")
    if isinstance(leaf, ValidationError):
        return _bounded(f"invalid message: {_first_line(leaf)}")
    return _bounded(f"{type(leaf).__name__}: {leaf}" if str(leaf) else type(leaf).__name__)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).splitlines()
    return " ".join(lines[:3]) if lines else type(exc).__name__


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


def _cancellation_alone(group: BaseExceptionGroup, name: str) -> BaseException:
    """What goes on when the session failed just as it was being cancelled (the daemon
    stopping while a connection attempt fails): the cancellation alone. The failure
    is logged; carried along, it would reach the daemon's root nursery as an error."""
    cancelled, failed = group.split(trio.Cancelled)
    if cancelled is None:
        return group
    if failed is not None:
        log.debug("upstream %s failed while cancelled", name, exc_info=failed)
    return cancelled
