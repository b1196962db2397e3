"""`Client`: the daemon's API for plain synchronous code, on a plain socket.

The same surface as `AsyncClient`, blocking, one call at a time. It is not thread-safe:
use one `Client` per thread, or `AsyncClient` for many calls at once on one connection.

While a call waits for its reply, notifications that arrive are routed as the async
client routes them (`routing.Router`): output to a running `stream`, events to open
subscriptions, kept until they are read.

Reconnects: before each request the client drains what the socket holds without
blocking, so a connection the daemon closed since the last call (a restart) is noticed
and replaced, with `Backoff` and a fresh login, before anything is sent on it. A call
whose connection drops while it waits raises `ConnectionLost`; only reads
(`calls.IDEMPOTENT_METHODS`) are resent, once.

Timeouts: as `AsyncClient`. A timed-out call leaves the connection usable (its late
reply is skipped); a timed-out `execute` is cancelled on the daemon.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import EllipsisType, TracebackType
from typing import Any, NoReturn, Self, TypeVar

from conduit.client import calls
from conduit.client.calls import Call, effective_timeout_s
from conduit.client.endpoint import (
    CONNECT_TIMEOUT_S,
    DEFAULT_BACKOFF,
    DEFAULT_TIMEOUT_S,
    Backoff,
    Endpoint,
    LoginToken,
    resolve_token,
)
from conduit.client.errors import (
    ConnectionFailed,
    ConnectionLost,
    NotFound,
    Timeout,
    TransportError,
)
from conduit.client.results import (
    Event,
    ExecutionResult,
    OutputChunk,
    SessionInfo,
    Tool,
    ToolResult,
    ToolSchema,
)
from conduit.client.routing import Router
from conduit.client.sessions import SessionHandle
from conduit.client.wire import (
    MAX_MESSAGE_BYTES,
    LineBuffer,
    Notification,
    Reply,
    classify,
    encode_request,
    reply_value,
)

__all__ = ["Client", "Run", "Session", "Subscription"]

log = logging.getLogger("conduit.client")

T = TypeVar("T")

# As the async client: 64 KiB reads, and the daemon's own bound on a subscriber's backlog.
_READ_BYTES = 65_536
SUBSCRIPTION_BUFFER = 1024

SocketConnector = Callable[[], socket.socket]
TimeoutArg = float | None | EllipsisType


class _DequeSink:
    """A `routing.Sink` on a deque, read by whoever pumps the connection."""

    def __init__(self, size: float) -> None:
        self.items: deque[Any] = deque()
        self._size = size
        self.closed = False
        self.error: BaseException | None = None

    def put(self, item: Any) -> bool:
        if self.closed:
            return True
        if len(self.items) >= self._size:
            return False
        self.items.append(item)
        return True

    def close(self, error: BaseException | None = None) -> None:
        if error is not None and self.error is None and not self.closed:
            self.error = error
        self.closed = True


class _SocketConnection:
    """One socket to the daemon: framing, replies by id, notifications to the router."""

    def __init__(self, sock: socket.socket, max_message_bytes: int) -> None:
        self._sock = sock
        self._buffer = LineBuffer(max_message_bytes)
        self.router = Router()
        self._expected: set[int] = set()
        self._replies: dict[int, Reply] = {}
        self.lost: ConnectionLost | None = None

    def close(self) -> None:
        self._lose(ConnectionLost("the connection was closed by the client"))

    def expect(self, ident: int) -> None:
        self._expected.add(ident)

    def forget(self, ident: int) -> None:
        self._expected.discard(ident)
        self._replies.pop(ident, None)
        self.router.forget(ident)

    def take_reply(self, ident: int) -> Reply | None:
        return self._replies.pop(ident, None)

    def send(self, line: bytes, deadline: _Deadline, method: str) -> None:
        """Send one line whole, or lose the connection: half a line would corrupt it."""
        self._check()
        remaining = deadline.remaining_s()
        if remaining == 0:
            raise deadline.timed_out(method)
        sent = False
        try:
            self._sock.settimeout(remaining)
            self._sock.sendall(line)
            sent = True
        except OSError as exc:
            error = ConnectionLost(f"the connection to the daemon broke: {exc}")
            self._lose(error)
            raise error from None
        finally:
            if not sent and self.lost is None:
                self._lose(ConnectionLost("a request was interrupted while being sent"))

    def send_quietly(self, line: bytes) -> None:
        """Best effort, for a cancel nobody waits on."""
        with contextlib.suppress(ConnectionLost):
            self.send(line, _Deadline.after(_QUIET_SEND_S), "executions/cancel")

    def wait_reply(self, ident: int, deadline: _Deadline, method: str) -> Reply:
        """Read until request `ident` is answered; `Timeout` at `deadline`."""
        while (reply := self._replies.pop(ident, None)) is None:
            self.pump(deadline, method)
        return reply

    def pump(self, deadline: _Deadline, method: str) -> None:
        """Read what arrives (waiting until `deadline`) and route it.

        Raises `Timeout` if nothing arrived in time, `ConnectionLost` if the connection
        is (or goes) away.
        """
        self._check()
        remaining = deadline.remaining_s()
        if remaining == 0:
            raise deadline.timed_out(method)
        try:
            self._sock.settimeout(remaining)
            data = self._sock.recv(_READ_BYTES)
        except TimeoutError:
            raise deadline.timed_out(method) from None
        except OSError as exc:
            error = ConnectionLost(f"the connection to the daemon broke: {exc}")
            self._lose(error)
            raise error from None
        self._receive(data)
        self._check()

    def drain_nowait(self) -> None:
        """Route whatever the socket already holds; notice a connection the daemon closed."""
        if self.lost is not None:
            return
        try:
            self._sock.settimeout(0.0)
            while True:
                data = self._sock.recv(_READ_BYTES)
                self._receive(data)
                if not data:
                    return
        except (BlockingIOError, ConnectionLost):
            return
        except OSError as exc:
            self._lose(ConnectionLost(f"the connection to the daemon broke: {exc}"))

    def _receive(self, data: bytes) -> None:
        if not data:
            self._lose(ConnectionLost("the daemon closed the connection"))
            return
        try:
            lines = self._buffer.feed(data)
        except ConnectionLost as exc:
            self._lose(exc)
            raise
        for line in lines:
            self._dispatch(line)

    def _dispatch(self, line: bytes) -> None:
        message = classify(line)
        if isinstance(message, Reply):
            self.router.reply(message)
            if message.id in self._expected:
                self._expected.discard(message.id)
                self._replies[message.id] = message
            elif message.id is None and len(self._expected) == 1:
                # The daemon could not read a request of ours; with one call at a time
                # it can only be the one being waited for.
                self._replies[self._expected.pop()] = message
        elif isinstance(message, Notification):
            self.router.notify(message)

    def _check(self) -> None:
        if self.lost is not None:
            raise ConnectionLost(*self.lost.args)

    def _lose(self, error: ConnectionLost) -> None:
        if self.lost is not None:
            return
        self.lost = error
        self.router.close_all(error)
        with contextlib.suppress(OSError):
            self._sock.close()


# How long a best-effort cancel may take to send: it is a few dozen bytes on a local socket.
_QUIET_SEND_S = 1.0


@dataclass(frozen=True, slots=True)
class _Deadline:
    """When a wait ends (`at`, on the monotonic clock; None: never) and the span it was
    given, for the `Timeout` message."""

    at: float | None
    span_s: float | None

    @classmethod
    def after(cls, span_s: float | None) -> _Deadline:
        return cls(None if span_s is None else time.monotonic() + span_s, span_s)

    def remaining_s(self) -> float | None:
        return None if self.at is None else max(0.0, self.at - time.monotonic())

    def timed_out(self, method: str) -> Timeout:
        return Timeout.after(method, self.span_s)


class Client:
    """The daemon's API for blocking code. `with Client(...) as client:` connects and
    closes; without `with`, the first call connects and `close()` closes.

    Where to connect, the token, timeouts and back-off are as for `AsyncClient`;
    `connector`, if given, returns a connected socket instead.
    """

    def __init__(
        self,
        *,
        unix_path: str | None = None,
        tcp: str | None = None,
        token: str | LoginToken | None = None,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        backoff: Backoff = DEFAULT_BACKOFF,
        connector: SocketConnector | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self.endpoint = Endpoint.resolve(unix_path=unix_path, tcp=tcp)
        self._login = resolve_token(token)
        self.timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._backoff = backoff
        self._connector = connector
        self._max_message_bytes = max_message_bytes
        self._ids = itertools.count(1)
        self._connection: _SocketConnection | None = None
        self._closed = False

    def __repr__(self) -> str:
        state = "connected" if self.is_connected else "disconnected"
        state = "closed" if self._closed else state
        return f"<Client {self.endpoint} {state}>"

    @property
    def is_connected(self) -> bool:
        """Whether a connection is open now, as far as the client has seen; the next
        call opens one if not."""
        return not self._closed and self._connection is not None and self._connection.lost is None

    # ---- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self.connect()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def connect(self) -> Self:
        """Connect (and log in) now rather than on the first call; returns the client.

        Raises `ConnectionFailed` after the back-off's attempts, `Unauthenticated` for a
        token the daemon refuses.
        """
        self._connected()
        return self

    def close(self) -> None:
        """Close the connection; idempotent. A closed client cannot be used again."""
        self._closed = True
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    # ---- the API -----------------------------------------------------------------------

    def call(
        self, method: str, params: Mapping[str, Any] | None = None, *, timeout_s: TimeoutArg = ...
    ) -> Any:
        """Call any method and return its raw result; raises the `RpcError` for its code."""
        return self._run(calls.raw(method, params), timeout_s)

    def ping(self, *, timeout_s: TimeoutArg = ...) -> None:
        self._run(calls.ping(), timeout_s)

    def whoami(self, *, timeout_s: TimeoutArg = ...) -> dict[str, Any] | None:
        """Who this connection is authenticated as (`name`, `kind`, `scopes`), or None."""
        return self._run(calls.whoami(), timeout_s)

    def execute(
        self,
        code: str,
        *,
        language: str = "python",
        executor: str | None = None,
        limits: Mapping[str, int] | None = None,
        allowed_tools: Iterable[str] | None = None,
        inputs: Any = None,
        files: Mapping[str, bytes | str] | None = None,
        timeout_s: TimeoutArg = ...,
    ) -> ExecutionResult:
        """Run `code` in a fresh sandbox and return how it ended; see `AsyncClient.execute`."""
        call = calls.execute(
            code,
            language=language,
            executor=executor,
            limits=limits,
            allowed_tools=allowed_tools,
            inputs=inputs,
            files=files,
        )
        return self._run(call, timeout_s)

    def stream(
        self,
        code: str,
        *,
        language: str = "python",
        executor: str | None = None,
        limits: Mapping[str, int] | None = None,
        allowed_tools: Iterable[str] | None = None,
        inputs: Any = None,
        files: Mapping[str, bytes | str] | None = None,
        timeout_s: TimeoutArg = ...,
    ) -> Run:
        """Run `code`, receiving its output while it runs:

        ```
        run = client.stream(code)
        for chunk in run:        # OutputChunk, in order
            ...
        run.result               # ExecutionResult
        ```

        `with client.stream(code) as run:` also cancels the execution if the block is
        left before the end. `timeout_s` bounds the whole run.
        """
        call = calls.execute(
            code,
            language=language,
            executor=executor,
            limits=limits,
            allowed_tools=allowed_tools,
            inputs=inputs,
            stream=True,
            files=files,
        )
        return Run(self, call, self._timeout(call, timeout_s))

    def cancel(self, execution_id: str, *, timeout_s: TimeoutArg = ...) -> str:
        """Stop a running execution (its `execute` answers `cancelled`); `NotFound` if none."""
        return self._run(calls.cancel(execution_id=execution_id), timeout_s)

    def tools(self, *, timeout_s: TimeoutArg = ...) -> list[Tool]:
        """The tools this caller may call, built-in execution tools included."""
        return self._run(calls.list_tools(), timeout_s)

    def tool_schema(self, name: str, *, timeout_s: TimeoutArg = ...) -> ToolSchema:
        """One tool's schemas, by id (`echo__add`) or SDK path (`echo.add`); `NotFound`."""
        return self._run(calls.tool_schema(name), timeout_s)

    def sdk(
        self,
        language: str = "python",
        *,
        allowed_tools: Iterable[str] | None = None,
        namespace: str | None = None,
        timeout_s: TimeoutArg = ...,
    ) -> str:
        """The `tools.*` SDK declarations a program in `language` sees, as text."""
        call = calls.sdk(language, allowed_tools=allowed_tools, namespace=namespace)
        return self._run(call, timeout_s)

    def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        timeout_s: TimeoutArg = ...,
    ) -> ToolResult:
        """Call one tool directly; a tool's own failure is a result with `is_error`."""
        return self._run(calls.call_tool(name, arguments), timeout_s)

    @contextlib.contextmanager
    def session(
        self,
        language: str = "python",
        *,
        executor: str | None = None,
        limits: Mapping[str, int] | None = None,
        idle_timeout_s: float | None = None,
        timeout_s: TimeoutArg = ...,
    ) -> Iterator[Session]:
        """A session for the block, closed when it exits; see `AsyncClient.session`."""
        session = self.open_session(
            language,
            executor=executor,
            limits=limits,
            idle_timeout_s=idle_timeout_s,
            timeout_s=timeout_s,
        )
        try:
            yield session
        finally:
            session.close()

    def open_session(
        self,
        language: str = "python",
        *,
        executor: str | None = None,
        limits: Mapping[str, int] | None = None,
        idle_timeout_s: float | None = None,
        name: str | None = None,
        timeout_s: TimeoutArg = ...,
    ) -> Session:
        """A session that lasts until closed or idle; see `AsyncClient.open_session`."""
        call = calls.create_session(
            language, executor=executor, limits=limits, idle_timeout_s=idle_timeout_s, name=name
        )
        return Session(self, self._run(call, timeout_s))

    def sessions(self, *, timeout_s: TimeoutArg = ...) -> list[SessionInfo]:
        """Your live sessions, oldest first."""
        return self._run(calls.list_sessions(), timeout_s)

    def subscribe(
        self,
        types: Iterable[str] | None = None,
        *,
        timeout_s: TimeoutArg = ...,
        event_timeout_s: float | None = None,
    ) -> Subscription:
        """Events of `types` (all if None): `with client.subscribe(types) as events:
        for event in events: ...`. Each wait for an event is bounded by
        `event_timeout_s` (None: none), raising `Timeout`. Ends with `SubscriptionDropped`
        or `ConnectionLost` as in `AsyncClient.subscribe`.
        """
        call = calls.subscribe(types)
        return Subscription(self, call, types, self._timeout(call, timeout_s), event_timeout_s)

    # ---- machinery ---------------------------------------------------------------------

    def _timeout(self, call: Call[Any], timeout_s: TimeoutArg) -> float | None:
        given = timeout_s is not ...
        explicit = None if timeout_s is ... else timeout_s
        return effective_timeout_s(call, explicit, self.timeout_s, given=given)

    def _run(self, call: Call[T], timeout_s: TimeoutArg) -> T:
        deadline = _Deadline.after(self._timeout(call, timeout_s))
        attempts = 2 if call.idempotent else 1
        for attempt in range(1, attempts + 1):
            connection = self._connected()
            try:
                reply = self._exchange(connection, call, deadline)
            except ConnectionLost:
                if attempt == attempts:
                    raise
                log.info("connection lost; resending a read", extra={"method": call.method})
                continue
            return call.parse(reply_value(reply))
        raise AssertionError("unreachable")

    def _exchange(
        self,
        connection: _SocketConnection,
        call: Call[Any],
        deadline: _Deadline,
        ident: int | None = None,
    ) -> Reply:
        ident = next(self._ids) if ident is None else ident
        connection.expect(ident)
        answered = False
        try:
            connection.send(encode_request(ident, call.method, call.params), deadline, call.method)
            reply = connection.wait_reply(ident, deadline, call.method)
            answered = True
            return reply
        finally:
            connection.forget(ident)
            if not answered and call.method == "execute":
                _cancel_abandoned(connection, ident, next(self._ids))

    def _connected(self) -> _SocketConnection:
        """The live connection, opening one (with back-off, and logging in) if needed."""
        if self._closed:
            raise RuntimeError("this Client is closed; make a new one")
        connection = self._connection
        if connection is not None:
            connection.drain_nowait()
            if connection.lost is None:
                return connection
        delays = self._backoff.delays()
        while True:
            try:
                self._connection = self._open_once()
                return self._connection
            except TransportError as exc:
                delay = next(delays, None)
                if delay is None:
                    attempts = self._backoff.attempts
                    raise ConnectionFailed.after(self.endpoint.address, attempts, exc) from exc
                log.info("connecting failed; retrying", extra={"error": str(exc)})
                time.sleep(delay)

    def _open_once(self) -> _SocketConnection:
        try:
            sock = self._open_socket()
        except TimeoutError:
            raise ConnectionFailed(f"no answer within {self._connect_timeout_s:g} s") from None
        except OSError as exc:
            raise ConnectionFailed(exc.strerror or str(exc)) from None
        connection = _SocketConnection(sock, self._max_message_bytes)
        if self._login is not None:
            try:
                self._log_in(connection, self._login, _Deadline.after(self._connect_timeout_s))
            except Timeout:
                connection.close()
                raise ConnectionFailed("the daemon did not answer auth/login") from None
            except BaseException:
                connection.close()
                raise
        return connection

    def _log_in(
        self, connection: _SocketConnection, login: LoginToken, deadline: _Deadline
    ) -> None:
        """Present `login` (a fallback only if not let in already); raises its `RpcError`."""
        if login.fallback:
            check = calls.authenticated()
            if check.parse(reply_value(self._exchange(connection, check, deadline))):
                return
        reply_value(self._exchange(connection, calls.login(login.token), deadline))

    def _open_socket(self) -> socket.socket:
        if self._connector is not None:
            return self._connector()
        if self.endpoint.tcp is not None:
            return socket.create_connection(self.endpoint.tcp, timeout=self._connect_timeout_s)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self._connect_timeout_s)
            sock.connect(str(self.endpoint.unix_path))
        except BaseException:
            sock.close()
            raise
        return sock


class Session(SessionHandle):
    """A session's steps, blocking (`Client.session`); see `AsyncSession`."""

    client: Client

    def execute(
        self,
        code: str,
        *,
        limits: Mapping[str, int] | None = None,
        allowed_tools: Iterable[str] | None = None,
        inputs: Any = None,
        files: Mapping[str, bytes | str] | None = None,
        timeout_s: TimeoutArg = ...,
    ) -> ExecutionResult:
        """Run `code` as the session's next step; see `AsyncSession.execute`."""
        call = self._step(code, limits, allowed_tools, inputs, files, stream=False)
        return self.client._run(call, timeout_s)

    def stream(
        self,
        code: str,
        *,
        limits: Mapping[str, int] | None = None,
        allowed_tools: Iterable[str] | None = None,
        inputs: Any = None,
        files: Mapping[str, bytes | str] | None = None,
        timeout_s: TimeoutArg = ...,
    ) -> Run:
        """Run `code` as the session's next step, its output while it runs; see
        `Client.stream`."""
        call = self._step(code, limits, allowed_tools, inputs, files, stream=True)
        return Run(self.client, call, self.client._timeout(call, timeout_s))

    def close(self) -> None:
        """End the session on the daemon; see `AsyncSession.aclose`."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(NotFound, ConnectionLost, Timeout):
            self.client._run(calls.close_session(self.session_id), ...)


class Run:
    """One streaming execution, blocking: iterate its output, then read `result`."""

    def __init__(self, client: Client, call: Call[ExecutionResult], timeout: float | None) -> None:
        self._client = client
        self._call = call
        self._timeout = timeout
        self._deadline = _Deadline.after(timeout)
        self._abandoned = False
        self._connection: _SocketConnection | None = None
        self._sink = _DequeSink(float("inf"))
        self._ident: int | None = None
        self._result: ExecutionResult | None = None
        self.execution_id: str | None = None

    def __repr__(self) -> str:
        state = self._result.status if self._result else "running"
        return f"<Run {self.execution_id or 'starting'} {state}>"

    @property
    def result(self) -> ExecutionResult:
        """How the execution ended; only once the output has been read to the end."""
        if self._result is None:
            raise RuntimeError("the run has not finished: iterate it, or call run.wait()")
        return self._result

    def __enter__(self) -> Self:
        self._start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._result is None:
            self._abandon()

    def __iter__(self) -> Iterator[OutputChunk]:
        return self

    def __next__(self) -> OutputChunk:
        if self._result is not None:
            raise StopIteration
        if self._abandoned:
            raise RuntimeError("this run was abandoned (timed out, cancelled or lost)")
        if self._connection is None:
            self._start()
        connection, ident = self._connection, self._ident
        assert connection is not None
        assert ident is not None
        try:
            while not self._sink.items:
                if self._sink.closed:
                    self._finish(connection, ident)
                connection.pump(self._deadline, "execute")
        except (Timeout, ConnectionLost):
            self._abandon()
            raise
        chunk: OutputChunk = self._sink.items.popleft()
        self.execution_id = chunk.execution_id
        return chunk

    def wait(self) -> ExecutionResult:
        """Read (and discard) the rest of the output; return the result."""
        for _ in self:
            pass
        return self.result

    def _start(self) -> None:
        self._deadline = _Deadline.after(self._timeout)
        connection = self._client._connected()
        if connection.router.unbound_streams and not connection.router.names_requests:
            # Output could not be told apart (routing.py); the async client queues
            # streams instead, which needs a second task to read the first.
            raise RuntimeError(
                "another stream on this Client has not started printing yet: read it to "
                "the end first, or use AsyncClient to run several at once"
            )
        self._connection = connection
        ident = self._ident = next(self._client._ids)
        connection.expect(ident)
        connection.router.expect_output(ident, self._sink)
        line = encode_request(ident, self._call.method, self._call.params)
        connection.send(line, self._deadline, "execute")

    def _finish(self, connection: _SocketConnection, ident: int) -> NoReturn:
        """Set `result` from the reply and end the iteration (or raise the reply's error)."""
        if self._sink.error is not None:
            raise self._sink.error
        reply = connection.take_reply(ident)
        connection.forget(ident)
        if reply is None:
            raise ConnectionLost("the output ended without the execution's result")
        self._result = self._call.parse(reply_value(reply))
        self.execution_id = self._result.execution_id
        raise StopIteration

    def _abandon(self) -> None:
        connection, ident = self._connection, self._ident
        if connection is None or ident is None or self._result is not None:
            return
        self._abandoned = True
        connection.forget(ident)
        _cancel_abandoned(connection, ident, next(self._client._ids))


class Subscription:
    """Events from one `events/subscribe`, blocking; see `Client.subscribe`."""

    def __init__(
        self,
        client: Client,
        call: Call[str],
        types: Iterable[str] | None,
        timeout: float | None,
        event_timeout_s: float | None,
    ) -> None:
        self._client = client
        self._call = call
        self._types = list(types) if types is not None else None
        self._timeout = timeout
        self._event_timeout_s = event_timeout_s
        self._sink = _DequeSink(SUBSCRIPTION_BUFFER)
        self._connection: _SocketConnection | None = None
        self.id: str | None = None

    def __repr__(self) -> str:
        return f"<Subscription {self.id or 'pending'} types={self._types}>"

    def __enter__(self) -> Self:
        self._open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        if self._connection is None:
            self._open()
        connection = self._connection
        assert connection is not None
        deadline = _Deadline.after(self._event_timeout_s)
        while not self._sink.items:
            if self._sink.closed:
                if self._sink.error is not None:
                    raise self._sink.error
                raise StopIteration
            connection.pump(deadline, "events/subscribe")
        event: Event = self._sink.items.popleft()
        return event

    def close(self) -> None:
        """Stop routing events here (the daemon is not told; its events are dropped)."""
        if self._connection is not None and self.id is not None:
            self._connection.router.unsubscribe(self.id)
        self._sink.close()

    def _open(self) -> None:
        client = self._client
        connection = self._connection = client._connected()
        ident = next(client._ids)
        connection.router.expect_events(ident, self._sink, self._types)
        reply = client._exchange(connection, self._call, _Deadline.after(self._timeout), ident)
        self.id = self._call.parse(reply_value(reply))


def _cancel_abandoned(connection: _SocketConnection, execute_id: int, ident: int) -> None:
    """Ask the daemon to stop the execution request `execute_id` started; its answer is
    skipped as a reply nobody waits for."""
    if connection.lost is None:
        cancel = calls.cancel(request_id=execute_id)
        connection.send_quietly(encode_request(ident, cancel.method, cancel.params))
