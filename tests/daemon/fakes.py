"""Stand-ins for the daemon's parts, for unit tests that start no daemon and no executor.

`FakeDispatch` is what a `Connection` hands its requests to; `Lines` is a peer speaking
NDJSON over the other end of an in-memory stream; `FakeExecutor` sits behind the
executor seam (`executors/base.py`) and runs whatever script a test gives it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import trio
import trio.testing

from conduit.core.errors import MethodNotFound
from conduit.core.files import FileData
from conduit.core.left_calls import LeftCalls
from conduit.daemon.auth import Principal
from conduit.daemon.config import LimitsConfig, PolicyConfig, SessionsConfig
from conduit.daemon.connection import Connection, ConnectionLimits
from conduit.daemon.events import BusEvent, EventBus
from conduit.daemon.executions import Executions
from conduit.daemon.limits import Admission, RateLimiter
from conduit.daemon.policy import Policy
from conduit.daemon.sessions import Sessions
from conduit.executors.base import (
    CallbackAddress,
    ExecutorInfo,
    FileInfo,
    FilesRefused,
    Job,
    Outcome,
    SessionSpec,
    Status,
    ToolBridge,
)
from conduit.executors.registry import ExecutorRegistry
from conduit.executors.syntax_memo import SyntaxMemo

# Generous: these tests run beside a CPU hog; a hang still fails.
WAIT_S = 30
TOKEN = "unit-test-token-0123456789"
OWNER = Principal("owner", "master", frozenset({"execute", "executions", "tools", "admin"}))
ALICE = Principal("alice", "client", frozenset({"execute", "executions", "tools"}))
BOB = Principal("bob", "client", frozenset({"execute", "executions", "tools"}))
LIMITS = ConnectionLimits(max_message_bytes=4096, max_in_flight=8, max_auth_failures=3)

Handler = Callable[[dict[str, Any], Connection, Principal | None], Awaitable[Any]]


async def _ping(params: dict[str, Any], peer: Connection, principal: Principal | None) -> Any:
    return {}


async def _login(params: dict[str, Any], peer: Connection, principal: Principal | None) -> Any:
    return {"principal": peer.login(params["token"]).describe()}


async def _whoami(params: dict[str, Any], peer: Connection, principal: Principal | None) -> Any:
    return {"principal": principal.name if principal else None}


class FakeDispatch:
    """A connection's `RequestDispatch` with a few methods of its own; records every call."""

    def __init__(self, **handlers: Handler) -> None:
        self.handlers: dict[str, Handler] = {
            "ping": _ping,
            "auth/login": _login,
            "auth/whoami": _whoami,
        }
        self.handlers.update({name.replace("__", "/"): h for name, h in handlers.items()})
        self.calls: list[tuple[str, Any]] = []
        self.refusals: list[tuple[str | None, int]] = []

    async def dispatch(
        self,
        name: str,
        raw_params: dict[str, Any],
        *,
        principal: Principal | None,
        peer: Connection,
        request_id: Any,
    ) -> Any:
        self.calls.append((name, request_id))
        handler = self.handlers.get(name)
        if handler is None:
            raise MethodNotFound(f"method not found: {name!r}", {"method": name})
        return await handler(raw_params, peer, principal)

    def refused(self, name: str | None, error: Any) -> None:
        self.refusals.append((name, error.code))


def known_token(token: str) -> Principal | None:
    return OWNER if token == TOKEN else None


def open_connection(
    nursery: trio.Nursery,
    dispatch: FakeDispatch | None = None,
    limits: ConnectionLimits = LIMITS,
    *,
    principal: Principal | None = OWNER,
    lockstep: bool = False,
    transport: str = "unix",
    left_calls: LeftCalls | None = None,
) -> tuple[Lines, Connection, FakeDispatch]:
    """Serve one connection over an in-memory stream in `nursery`: (peer, it, dispatch).

    `lockstep` makes every write wait until the peer reads it, as a socket whose buffers
    are full would.
    """
    dispatch = dispatch or FakeDispatch()
    pair = trio.testing.lockstep_stream_pair if lockstep else trio.testing.memory_stream_pair
    ours, theirs = pair()
    connection = Connection(
        theirs,
        dispatch,
        limits,
        transport=transport,
        authenticate=known_token,
        principal=principal,
        left_calls=left_calls,
    )
    peer = Lines(ours, theirs)

    async def serve() -> None:
        await connection.run()
        peer.ended.set()

    nursery.start_soon(serve)
    return peer, connection, dispatch


class Lines:
    """The peer's end: NDJSON lines out, JSON lines in."""

    def __init__(self, stream: trio.abc.Stream, far_end: trio.abc.Stream) -> None:
        self.stream = stream
        self._far_end = far_end
        self._buffer = b""
        # Set once the connection's `run` has returned.
        self.ended = trio.Event()

    async def reset(self) -> None:
        """Go away as a reset socket does: the connection's next read fails."""
        receiving = getattr(self._far_end, "receive_stream", None)
        if isinstance(receiving, trio.testing.MemoryReceiveStream):
            receiving.close()
        await self.stream.aclose()

    async def send_line(self, line: bytes | str) -> None:
        data = line.encode() if isinstance(line, str) else line
        await self.stream.send_all(data + b"\n")

    async def send(self, message: Any) -> None:
        await self.send_line(json.dumps(message))

    async def request(self, ident: Any, method: str, params: Any = None, **extra: Any) -> Any:
        message = {"jsonrpc": "2.0", "id": ident, "method": method, **extra}
        if params is not None:
            message["params"] = params
        await self.send(message)
        return await self.recv()

    async def raw(self) -> bytes:
        """The next line as sent, without its newline; fails after WAIT_S."""
        with trio.fail_after(WAIT_S):
            while b"\n" not in self._buffer:
                chunk = await self.stream.receive_some(65536)
                if not chunk:
                    raise EOFError("the connection closed")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    async def recv(self) -> Any:
        return json.loads(await self.raw())

    async def until_closed(self, within_s: float = WAIT_S) -> list[Any]:
        """Every line left until the connection closes its end."""
        with trio.fail_after(within_s):
            while chunk := await self.stream.receive_some(65536):
                self._buffer += chunk
        lines, self._buffer = self._buffer, b""
        return [json.loads(line) for line in lines.splitlines()]


# ---- executions --------------------------------------------------------------------


Script = Callable[[Job, ToolBridge], Awaitable[Outcome]]


async def _echo(job: Job, bridge: ToolBridge) -> Outcome:
    return Outcome(Status.OK, result=job.inputs, stdout="out\n", exit_code=0)


class FakeExecutor:
    """An `Executor` that runs `script(job, bridge)` instead of a program; `name` and
    `languages` say which executor it stands in for, `lacks` what that one lacks."""

    unavailable_reason: str | None = None

    def __init__(
        self,
        script: Script = _echo,
        *,
        name: str = "fake",
        languages: frozenset[str] = frozenset({"python"}),
        lacks: Callable[[str, SyntaxMemo, str], str | None] | None = None,
    ) -> None:
        self.script = script
        self.name = name
        self.languages = languages
        self.lacks = lacks
        self.jobs: list[Job] = []
        self.sandboxes: list[FakeSandbox] = []

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep_forever()

    async def run(self, job: Job, bridge: ToolBridge) -> Outcome:
        self.jobs.append(job)
        return await self.script(job, bridge)

    async def open_session(self, spec: SessionSpec) -> FakeSandbox:
        sandbox = FakeSandbox(spec, self.script)
        self.sandboxes.append(sandbox)
        return sandbox

    def info(self) -> ExecutorInfo:
        return ExecutorInfo(self.name, tuple(sorted(self.languages)), available=True)


class FakeSandbox:
    """A session's sandbox that runs the executor's script for each step; records the
    steps, whether two ever overlapped, and whether it was closed."""

    def __init__(self, spec: SessionSpec, script: Script) -> None:
        self.spec = spec
        self.script = script
        self.jobs: list[Job] = []
        self.running = 0
        self.overlapped = False
        self.closed = False
        self.files: dict[str, bytes] = {}

    async def run(self, job: Job, bridge: ToolBridge) -> Outcome:
        assert not self.closed, "a step ran in a closed sandbox"
        self.jobs.append(job)
        self.running += 1
        self.overlapped |= self.running > 1
        try:
            return await self.script(job, bridge)
        finally:
            self.running -= 1

    async def put_files(self, files: Sequence[FileData], disk_bytes: int) -> None:
        merged = {**self.files, **{file.path: file.data for file in files}}
        if sum(map(len, merged.values())) > disk_bytes:
            raise FilesRefused("the files would take more than limits.disk_mb")
        self.files = merged

    async def get_file(self, path: str) -> bytes | None:
        return self.files.get(path)

    async def list_files(self) -> list[FileInfo]:
        return [FileInfo(path, len(data)) for path, data in sorted(self.files.items())]

    async def aclose(self) -> None:
        self.closed = True


class FakeBridge:
    """A session that answers no tool call; records whether it is still open."""

    callback: CallbackAddress | None = None

    def __init__(self, execution_id: str, patterns: tuple[tuple[str, ...], ...]) -> None:
        self.execution_id = execution_id
        self.patterns = patterns
        self.open = True

    @property
    def session_token(self) -> str:
        return "session-" + self.execution_id

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        raise MethodNotFound(f"method not found: {method!r}")


class ExecutionsFixture:
    """`Executions` over a `FakeExecutor` (the default for Python), with the events it
    publishes kept in order. `others` join the registry, `defaults` name each language's
    default among them; `policy` is checked before anything runs."""

    def __init__(
        self,
        executor: FakeExecutor,
        *,
        capacity: int = 4,
        queue_size: int = 4,
        queue_timeout_s: float = 30.0,
        limits: LimitsConfig | None = None,
        sessions: SessionsConfig | None = None,
        policy: PolicyConfig | None = None,
        others: Sequence[FakeExecutor] = (),
        defaults: Mapping[str, str] | None = None,
    ) -> None:
        self.executor = executor
        self.events: list[BusEvent] = []
        self.bridges: list[FakeBridge] = []
        bus = EventBus()
        bus.add_sink(self.events.append)
        self.admission = Admission(capacity, queue_size, queue_timeout_s)
        self.executions = Executions(
            limits or LimitsConfig(),
            Policy(policy or PolicyConfig()),
            registry=ExecutorRegistry(
                [executor, *others], {"python": executor.name, **(defaults or {})}
            ),
            admission=self.admission,
            rate_limiter=RateLimiter(0, 1),
            events=bus,
            open_bridge=self.open_bridge,
        )
        self.sessions = Sessions(
            sessions or SessionsConfig(),
            registry=self.executions.registry,
            events=bus,
            limits_for=self.executions.limits_for,
            queue_timeout_s=queue_timeout_s,
        )

    @contextmanager
    def open_bridge(
        self, execution_id: str, patterns: tuple[tuple[str, ...], ...], owner: str | None = None
    ) -> Iterator[FakeBridge]:
        bridge = FakeBridge(execution_id, patterns)
        self.bridges.append(bridge)
        try:
            yield bridge
        finally:
            bridge.open = False

    def types(self) -> list[str]:
        return [str(event.type) for event in self.events]
