"""`AsyncClient`: the daemon's API for async programs, many calls at once on one connection.

It is written against anyio, so it runs under asyncio (`asyncio.run`) and under Trio
(`trio.run`) alike; it imports neither itself.

```
AsyncClient (async with)                 owns a task group
└── _Connection.run                      one per connection; a new one after a drop
    ├── reader: lines → replies to waiting callers by id, notifications to the Router
    └── writer: one task sends every request, so a caller that gives up mid-send
                never leaves half a line on the wire
```

Resource handling: the task group opens in `__aenter__` (which also connects, so a wrong
address or token fails there) and is cancelled in `__aexit__`, closing the connection.
Calls made after that raise `RuntimeError`.

Reconnects: when the connection drops, calls in flight fail with `ConnectionLost`
(streams and subscriptions too) and the next call opens a new connection, retrying with
`Backoff`, and logs in again. A lost call is never resent unless it only reads
(`calls.IDEMPOTENT_METHODS`, resent once): `execute` is not idempotent, and a lost one
may have run. Subscriptions are not renewed: subscribe again.

Timeouts: each call waits at most `timeout_s` (the client's default unless given; for
`execute`, at least the execution's own time limit plus queueing) and then raises
`Timeout`, leaving the connection usable: the late reply is dropped, and an abandoned
`execute` is cancelled on the daemon.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from types import EllipsisType, TracebackType
from typing import Any, Self, TypeVar

import anyio
import anyio.abc

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

__all__ = ["AsyncClient", "AsyncRun", "AsyncSession", "AsyncSubscription", "open_client"]

log = logging.getLogger("conduit.client")

T = TypeVar("T")

# 64 KiB reads, as the daemon's own framing uses: few syscalls, bounded memory per read.
_READ_BYTES = 65_536
# Events one subscription may have waiting, as the daemon allows its subscribers: past
# this the reader is too slow, and the subscription ends with SubscriptionDropped.
SUBSCRIPTION_BUFFER = 1024

Connector = Callable[[], Awaitable[anyio.abc.ByteStream]]
# What a closed connection's streams raise when written to or read from.
_BROKEN = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)
TimeoutArg = float | None | EllipsisType


class _Waiter:
    """One caller waiting for one reply."""

    __slots__ = ("_error", "_event", "_reply")

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._reply: Reply | None = None
        self._error: ConnectionLost | None = None

    @property
    def done(self) -> bool:
        return self._event.is_set()

    def set(self, reply: Reply) -> None:
        self._reply = reply
        self._event.set()

    def fail(self, error: ConnectionLost) -> None:
        self._error = error
        self._event.set()

    async def wait(self) -> Reply:
        await self._event.wait()
        if self._error is not None:
            raise ConnectionLost(*self._error.args)
        assert self._reply is not None
        return self._reply


class _Queue:
    """A `routing.Sink` that one task reads with `get`; nothing here ever blocks a put.

    A deque and an event rather than a memory stream: the reader may simply stop
    reading (a caller gives up), and nothing then needs closing.
    """

    def __init__(self, size: float) -> None:
        self._items: deque[Any] = deque()
        self._size = size
        self._closed = False
        self._error: BaseException | None = None
        self._ready = anyio.Event()

    def put(self, item: Any) -> bool:
        if self._closed:
            return True  # it was already ended: nothing to do
        if len(self._items) >= self._size:
            return False
        self._items.append(item)
        self._ready.set()
        return True

    def close(self, error: BaseException | None = None) -> None:
        if error is not None and self._error is None and not self._closed:
            self._error = error
        self._closed = True
        self._ready.set()

    async def get(self) -> Any:
        """The next item; `anyio.EndOfStream` after the last, or the closing error."""
        while not self._items:
            if self._closed:
                if self._error is not None:
                    raise type(self._error)(*self._error.args)
                raise anyio.EndOfStream
            self._ready = anyio.Event()
            await self._ready.wait()
        return self._items.popleft()


class _Connection:
    """One stream to the daemon: its reader, its writer, its waiting callers."""

    def __init__(self, stream: anyio.abc.ByteStream, max_message_bytes: int) -> None:
        self._stream = stream
        self._max_message_bytes = max_message_bytes
        self.router = Router()
        self._waiters: dict[int, _Waiter] = {}
        # Unbounded: callers never wait to enqueue; each holds at most one line here.
        self._outbox = _Queue(math.inf)
        self._scope = anyio.CancelScope()
        self.lost: ConnectionLost | None = None
        # Held by a streaming execute until its execution id is known (routing.py).
        self.stream_gate = anyio.Semaphore(1)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Read and write until the stream ends, breaks or `close()`; closes the stream.

        Never raises but cancellation: a failure ends the connection and is what every
        waiting caller then raises (`ConnectionLost`).
        """
        try:
            with self._scope:
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self._write_loop)
                    task_status.started()
                    await self._read_loop()
                    tasks.cancel_scope.cancel()
        finally:
            self._lose(ConnectionLost("the connection was closed by the client"))
            with anyio.CancelScope(shield=True):
                await self._stream.aclose()

    def close(self) -> None:
        self._scope.cancel()

    def request(self, ident: int, call: Call[Any]) -> _Waiter:
        """Send `call` as request `ident` (without waiting); its reply arrives in the waiter.

        Raises `ConnectionLost` if the connection is already gone.
        """
        waiter = _Waiter()
        self._waiters[ident] = waiter
        try:
            self.send_nowait(encode_request(ident, call.method, call.params))
        except ConnectionLost:
            del self._waiters[ident]
            raise
        return waiter

    def send_nowait(self, line: bytes) -> None:
        if self.lost is not None:
            raise ConnectionLost(*self.lost.args)
        self._outbox.put(line)

    def forget(self, ident: int) -> None:
        """Nobody waits for `ident` any more: drop its reply and notifications."""
        self._waiters.pop(ident, None)
        self.router.forget(ident)

    async def _read_loop(self) -> None:
        buffer = LineBuffer(self._max_message_bytes)
        try:
            while True:
                data = await self._stream.receive(_READ_BYTES)
                for line in buffer.feed(data):
                    self._dispatch(line)
        except anyio.EndOfStream:
            self._lose(ConnectionLost("the daemon closed the connection"))
        except ConnectionLost as exc:
            self._lose(exc)
        except _BROKEN as exc:
            self._lose(ConnectionLost(f"the connection to the daemon broke: {exc}"))

    async def _write_loop(self) -> None:
        try:
            while True:
                await self._stream.send(await self._outbox.get())
        except anyio.EndOfStream:
            pass  # the connection was lost; the reader says how
        except _BROKEN as exc:
            self._lose(ConnectionLost(f"the connection to the daemon broke: {exc}"))
            self._scope.cancel()

    def _dispatch(self, line: bytes) -> None:
        message = classify(line)
        if isinstance(message, Reply):
            self.router.reply(message)
            waiter = self._waiters.pop(message.id, None)
            if waiter is not None:
                waiter.set(message)
            elif message.id is None:
                log.warning(
                    "the daemon answered a request it could not read",
                    extra={"error": message.message.get("error")},
                )
        elif isinstance(message, Notification):
            self.router.notify(message)

    def _lose(self, error: ConnectionLost) -> None:
        if self.lost is not None:
            return
        self.lost = error
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            waiter.fail(error)
        self.router.close_all(error)
        self._outbox.close()


class AsyncClient:
    """The daemon's API for async code, under asyncio or Trio. Use
    `async with AsyncClient(...) as client:`.

    Connects to `tcp` (`HOST:PORT`) if given, else `unix_path`, else `CONDUIT_SOCKET`,
    else the daemon's default socket. With a `token` (default `CONDUIT_TOKEN`; `""` for
    none) the connection logs in with it; without one, a Unix connection relies on
    peer credentials. `connector`, if given, opens the stream instead (custom transports,
    tests). Every call may run concurrently with others on the one connection.
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
        connector: Connector | None = None,
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
        self._connection: _Connection | None = None
        self._connect_lock = anyio.Lock()
        self._tasks: anyio.abc.TaskGroup | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._closed = False

    def __repr__(self) -> str:
        state = "connected" if self.is_connected else "disconnected"
        state = "closed" if self._closed else state
        return f"<AsyncClient {self.endpoint} {state}>"

    @property
    def is_connected(self) -> bool:
        """Whether a connection is open now, as far as the client has seen; the next
        call opens one if not."""
        return not self._closed and self._connection is not None and self._connection.lost is None

    # ---- lifecycle -------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._stack is not None or self._closed:
            raise RuntimeError("an AsyncClient can be entered once; make a new one")
        self._stack = contextlib.AsyncExitStack()
        self._tasks = await self._stack.enter_async_context(anyio.create_task_group())
        try:
            await self._connected()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection and stop the client's tasks; idempotent."""
        self._closed = True
        stack, self._stack = self._stack, None
        if stack is None:
            return
        assert self._tasks is not None
        self._tasks.cancel_scope.cancel()
        # The body's own exception is not handed to the task group: it would come back
        # wrapped in an ExceptionGroup. Our tasks raise nothing but cancellation.
        await stack.aclose()

    # ---- the API -----------------------------------------------------------------------

    async def call(
        self,
        method: str,
        params: Mapping[str, Any] | None = None,
        *,
        timeout_s: TimeoutArg = ...,
    ) -> Any:
        """Call any method and return its raw result; raises the `RpcError` for its code.

        `timeout_s`: seconds to wait (None: no limit); left out, the client's default.
        """
        return await self._run(calls.raw(method, params), timeout_s)

    async def ping(self, *, timeout_s: TimeoutArg = ...) -> None:
        await self._run(calls.ping(), timeout_s)

    async def whoami(self, *, timeout_s: TimeoutArg = ...) -> dict[str, Any] | None:
        """Who this connection is authenticated as (`name`, `kind`, `scopes`), or None."""
        return await self._run(calls.whoami(), timeout_s)

    async def execute(
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
        """Run `code` in a fresh sandbox and return how it ended.

        A failing program is a result with a non-ok status (`result.raise_for_status()`
        turns it into `ProgramFailed`); request faults raise their `RpcError`
        (`InvalidParams`, `Overloaded`, `ExecutorUnavailable`, ...). Never resent after
        a lost connection (`ConnectionLost`): it may have run.
        """
        call = calls.execute(
            code,
            language=language,
            executor=executor,
            limits=limits,
            allowed_tools=allowed_tools,
            inputs=inputs,
            files=files,
        )
        return await self._run(call, timeout_s)

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
    ) -> AsyncRun:
        """Run `code`, receiving its output while it runs:

        ```
        async with client.stream(code) as run:
            async for chunk in run:      # OutputChunk, in order
                ...
        run.result                       # ExecutionResult, once the iteration ends
        ```

        Leaving the block before the end cancels the execution. `timeout_s` bounds the
        whole run.
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
        return AsyncRun(self, call, self._timeout(call, timeout_s))

    async def cancel(self, execution_id: str, *, timeout_s: TimeoutArg = ...) -> str:
        """Stop a running execution (its `execute` answers `cancelled`); `NotFound` if none."""
        return await self._run(calls.cancel(execution_id=execution_id), timeout_s)

    async def tools(self, *, timeout_s: TimeoutArg = ...) -> list[Tool]:
        """The tools this caller may call, built-in execution tools included."""
        return await self._run(calls.list_tools(), timeout_s)

    async def tool_schema(self, name: str, *, timeout_s: TimeoutArg = ...) -> ToolSchema:
        """One tool's schemas, by id (`echo__add`) or SDK path (`echo.add`); `NotFound`."""
        return await self._run(calls.tool_schema(name), timeout_s)

    async def sdk(
        self,
        language: str = "python",
        *,
        allowed_tools: Iterable[str] | None = None,
        namespace: str | None = None,
        timeout_s: TimeoutArg = ...,
    ) -> str:
        """The `tools.*` SDK declarations a program in `language` sees, as text."""
        call = calls.sdk(language, allowed_tools=allowed_tools, namespace=namespace)
        return await self._run(call, timeout_s)

    async def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        timeout_s: TimeoutArg = ...,
    ) -> ToolResult:
        """Call one tool directly; a tool's own failure is a result with `is_error`."""
        return await self._run(calls.call_tool(name, arguments), timeout_s)

    @contextlib.asynccontextmanager
    async def session(
        self,
        language: str = "python",
        *,
        executor: str | None = None,
        limits: Mapping[str, int] | None = None,
        idle_timeout_s: float | None = None,
        timeout_s: TimeoutArg = ...,
    ) -> AsyncIterator[AsyncSession]:
        """A session for the block: each `execute` on it runs where the last one left
        its variables, functions, imports and files. Closed when the block exits.

        ```
        async with client.session("python") as session:
            await session.execute("x = 1")
            (await session.execute("x + 1")).result      # 2
        ```
        """
        session = await self.open_session(
            language,
            executor=executor,
            limits=limits,
            idle_timeout_s=idle_timeout_s,
            timeout_s=timeout_s,
        )
        try:
            yield session
        finally:
            with anyio.CancelScope(shield=True):
                await session.aclose()

    async def open_session(
        self,
        language: str = "python",
        *,
        executor: str | None = None,
        limits: Mapping[str, int] | None = None,
        idle_timeout_s: float | None = None,
        name: str | None = None,
        timeout_s: TimeoutArg = ...,
    ) -> AsyncSession:
        """A session that lasts until closed or idle past its timeout (the daemon's
        default is 10 minutes); with `name`, the session of yours by that name if it
        lives (`info.created` is False), from any connection."""
        call = calls.create_session(
            language, executor=executor, limits=limits, idle_timeout_s=idle_timeout_s, name=name
        )
        return AsyncSession(self, await self._run(call, timeout_s))

    async def sessions(self, *, timeout_s: TimeoutArg = ...) -> list[SessionInfo]:
        """Your live sessions, oldest first."""
        return await self._run(calls.list_sessions(), timeout_s)

    def subscribe(
        self, types: Iterable[str] | None = None, *, timeout_s: TimeoutArg = ...
    ) -> AsyncSubscription:
        """Events of `types` (all if None) as they happen:

        ```
        async with client.subscribe(["execution.finished"]) as events:
            async for event in events:   # Event
                ...
        ```

        Ends with `SubscriptionDropped` if the reader falls behind, `ConnectionLost` if
        the connection drops (subscriptions are not renewed). `timeout_s` bounds the
        subscribe request, not the wait for events.
        """
        call = calls.subscribe(types)
        return AsyncSubscription(self, call, types, self._timeout(call, timeout_s))

    # ---- machinery ---------------------------------------------------------------------

    def _timeout(self, call: Call[Any], timeout_s: TimeoutArg) -> float | None:
        given = timeout_s is not ...
        explicit = None if timeout_s is ... else timeout_s
        return effective_timeout_s(call, explicit, self.timeout_s, given=given)

    async def _run(self, call: Call[T], timeout_s: TimeoutArg) -> T:
        timeout = self._timeout(call, timeout_s)
        with anyio.move_on_after(timeout):
            return call.parse(reply_value(await self._send_with_retry(call)))
        raise Timeout.after(call.method, timeout)

    async def _send_with_retry(self, call: Call[Any]) -> Reply:
        attempts = 2 if call.idempotent else 1
        for attempt in range(1, attempts + 1):
            connection = await self._connected()
            try:
                return await self._exchange(connection, call)
            except ConnectionLost:
                if attempt == attempts:
                    raise
                log.info("connection lost; resending a read", extra={"method": call.method})
        raise AssertionError("unreachable")

    async def _exchange(
        self, connection: _Connection, call: Call[Any], ident: int | None = None
    ) -> Reply:
        """Send `call` (as request `ident`, or a fresh id) and wait for its reply."""
        ident = next(self._ids) if ident is None else ident
        waiter = connection.request(ident, call)
        try:
            return await waiter.wait()
        finally:
            connection.forget(ident)
            if not waiter.done and call.method == "execute":
                _cancel_abandoned(connection, ident, next(self._ids))

    async def _connected(self) -> _Connection:
        """The live connection, opening one (with back-off, and logging in) if needed."""
        if self._closed or self._tasks is None:
            raise RuntimeError("this AsyncClient is not open: use `async with AsyncClient(...)`")
        connection = self._connection
        if connection is not None and connection.lost is None:
            return connection
        async with self._connect_lock:
            connection = self._connection
            if connection is None or connection.lost is not None:
                connection = self._connection = await self._open()
        return connection

    async def _open(self) -> _Connection:
        assert self._tasks is not None
        delays = self._backoff.delays()
        while True:
            try:
                return await self._open_once(self._tasks)
            except TransportError as exc:
                delay = next(delays, None)
                if delay is None:
                    attempts = self._backoff.attempts
                    raise ConnectionFailed.after(self.endpoint.address, attempts, exc) from exc
                log.info("connecting failed; retrying", extra={"error": str(exc)})
                await anyio.sleep(delay)

    async def _open_once(self, tasks: anyio.abc.TaskGroup) -> _Connection:
        try:
            with anyio.fail_after(self._connect_timeout_s):
                stream = await self._open_stream()
        except TimeoutError:
            raise ConnectionFailed(f"no answer within {self._connect_timeout_s:g} s") from None
        except OSError as exc:
            raise ConnectionFailed(exc.strerror or str(exc)) from None
        connection = _Connection(stream, self._max_message_bytes)
        await tasks.start(connection.run)
        if self._login is not None:
            try:
                with anyio.move_on_after(self._connect_timeout_s):
                    await self._log_in(connection, self._login)
                    return connection
            except BaseException:
                connection.close()
                raise
            connection.close()
            raise ConnectionFailed("the daemon did not answer auth/login")
        return connection

    async def _log_in(self, connection: _Connection, login: LoginToken) -> None:
        """Present `login` (a fallback only if not let in already); raises its `RpcError`."""
        if login.fallback:
            check = calls.authenticated()
            if check.parse(reply_value(await self._exchange(connection, check))):
                return
        reply_value(await self._exchange(connection, calls.login(login.token)))

    async def _open_stream(self) -> anyio.abc.ByteStream:
        if self._connector is not None:
            return await self._connector()
        if self.endpoint.tcp is not None:
            return await anyio.connect_tcp(*self.endpoint.tcp)
        return await anyio.connect_unix(str(self.endpoint.unix_path))


class AsyncSession(SessionHandle):
    """A session's steps, through the client that opened it (`AsyncClient.session`)."""

    client: AsyncClient

    async def execute(
        self,
        code: str,
        *,
        limits: Mapping[str, int] | None = None,
        allowed_tools: Iterable[str] | None = None,
        inputs: Any = None,
        files: Mapping[str, bytes | str] | None = None,
        timeout_s: TimeoutArg = ...,
    ) -> ExecutionResult:
        """Run `code` as the session's next step; see `AsyncClient.execute`.
        `result.session_reset` says whether the session had to start afresh after it."""
        call = self._step(code, limits, allowed_tools, inputs, files, stream=False)
        return await self.client._run(call, timeout_s)

    def stream(
        self,
        code: str,
        *,
        limits: Mapping[str, int] | None = None,
        allowed_tools: Iterable[str] | None = None,
        inputs: Any = None,
        files: Mapping[str, bytes | str] | None = None,
        timeout_s: TimeoutArg = ...,
    ) -> AsyncRun:
        """Run `code` as the session's next step, its output while it runs; see
        `AsyncClient.stream`."""
        call = self._step(code, limits, allowed_tools, inputs, files, stream=True)
        return AsyncRun(self.client, call, self.client._timeout(call, timeout_s))

    async def aclose(self) -> None:
        """End the session on the daemon. Idempotent; one already ended, or a
        connection gone, is no error (the daemon ends it when idle)."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(NotFound, ConnectionLost, Timeout):
            await self.client._run(calls.close_session(self.session_id), ...)


class AsyncRun:
    """One streaming execution: iterate its output, then read `result`.

    Use as `async with client.stream(...) as run`; see `AsyncClient.stream`.
    """

    def __init__(
        self, client: AsyncClient, call: Call[ExecutionResult], timeout: float | None
    ) -> None:
        self._client = client
        self._call = call
        self._deadline = math.inf if timeout is None else anyio.current_time() + timeout
        self._timeout = timeout
        self._connection: _Connection | None = None
        self._sink = _Queue(math.inf)
        self._waiter: _Waiter | None = None
        self._ident: int | None = None
        self._result: ExecutionResult | None = None
        self._release_gate: Callable[[], None] = lambda: None
        self.execution_id: str | None = None

    def __repr__(self) -> str:
        state = self._result.status if self._result else "running"
        return f"<AsyncRun {self.execution_id or 'starting'} {state}>"

    @property
    def result(self) -> ExecutionResult:
        """How the execution ended; only once the output has been read to the end."""
        if self._result is None:
            raise RuntimeError("the run has not finished: iterate it, or `await run.wait()`")
        return self._result

    async def __aenter__(self) -> Self:
        with anyio.CancelScope(deadline=self._deadline):
            await self._start()
            return self
        self._abandon()
        raise Timeout.after("execute", self._timeout)

    async def __aexit__(self, *exc_info: object) -> None:
        if self._result is None:
            self._abandon()

    def __aiter__(self) -> AsyncIterator[OutputChunk]:
        return self

    async def __anext__(self) -> OutputChunk:
        if self._waiter is None:
            raise RuntimeError("use the run inside `async with client.stream(...) as run`")
        if self._result is not None:
            raise StopAsyncIteration
        with anyio.CancelScope(deadline=self._deadline):
            try:
                chunk: OutputChunk = await self._sink.get()
            except anyio.EndOfStream:
                reply = await self._waiter.wait()
                self._result = self._call.parse(reply_value(reply))
                self.execution_id = self._result.execution_id
                raise StopAsyncIteration from None
            self.execution_id = chunk.execution_id
            return chunk
        self._abandon()
        raise Timeout.after("execute", self._timeout)

    async def wait(self) -> ExecutionResult:
        """Read (and discard) the rest of the output; return the result."""
        async for _ in self:
            pass
        return self.result

    async def _start(self) -> None:
        client = self._client
        connection = self._connection = await client._connected()
        if not connection.router.names_requests:
            await connection.stream_gate.acquire()
            self._release_gate = _once(connection.stream_gate.release)
        ident = self._ident = next(client._ids)
        connection.router.expect_output(ident, self._sink, on_bound=self._release_gate)
        try:
            self._waiter = connection.request(ident, self._call)
        except ConnectionLost:
            self._release_gate()
            raise

    def _abandon(self) -> None:
        """Stop caring about this run: cancel it on the daemon, route nothing more to it."""
        self._release_gate()
        connection, ident = self._connection, self._ident
        if connection is None or ident is None:
            return
        connection.forget(ident)
        if self._waiter is not None and not self._waiter.done:
            _cancel_abandoned(connection, ident, next(self._client._ids))


class AsyncSubscription:
    """Events from one `events/subscribe`; see `AsyncClient.subscribe`."""

    def __init__(
        self,
        client: AsyncClient,
        call: Call[str],
        types: Iterable[str] | None,
        timeout: float | None,
    ) -> None:
        self._client = client
        self._call = call
        self._types = list(types) if types is not None else None
        self._timeout = timeout
        self._sink = _Queue(SUBSCRIPTION_BUFFER)
        self._connection: _Connection | None = None
        self.id: str | None = None

    def __repr__(self) -> str:
        return f"<AsyncSubscription {self.id or 'pending'} types={self._types}>"

    async def __aenter__(self) -> Self:
        await self._open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        if self._connection is None:
            await self._open()
        try:
            return await self._sink.get()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    def close(self) -> None:
        """Stop routing events here (the daemon is not told; its events are dropped)."""
        if self._connection is not None and self.id is not None:
            self._connection.router.unsubscribe(self.id)
        self._sink.close()

    async def _open(self) -> None:
        client = self._client
        with anyio.move_on_after(self._timeout):
            connection = self._connection = await client._connected()
            ident = next(client._ids)
            connection.router.expect_events(ident, self._sink, self._types)
            reply = await client._exchange(connection, self._call, ident)
            self.id = self._call.parse(reply_value(reply))
            return
        raise Timeout.after(self._call.method, self._timeout)


def _cancel_abandoned(connection: _Connection, execute_id: int, ident: int) -> None:
    """Ask the daemon to stop the execution request `execute_id` started; the answer is
    not awaited (it is dropped as a reply nobody waits for)."""
    cancel = calls.cancel(request_id=execute_id)
    with contextlib.suppress(ConnectionLost):
        connection.send_nowait(encode_request(ident, cancel.method, cancel.params))


def _once(action: Callable[[], None]) -> Callable[[], None]:
    done = False

    def run() -> None:
        nonlocal done
        if not done:
            done = True
            action()

    return run


@contextlib.asynccontextmanager
async def open_client(**options: Any) -> AsyncIterator[AsyncClient]:
    """`async with open_client(unix_path=...) as client:`; the same as `AsyncClient(...)`."""
    async with AsyncClient(**options) as client:
        yield client
