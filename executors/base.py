"""The executor interface: what a runtime is handed and what it gives back.

An executor knows how to run one program in a fresh sandbox. It knows nothing about
sockets, tokens or JSON-RPC: everything it may reach of the daemon comes through the
`ToolBridge` it is handed with the job. A failing program is not an exception: it is an
`Outcome` whose `status` says what happened, with whatever output was produced.

Exceptions an executor may raise are the `ExecutorError` family (`RuntimeMissing`,
`SandboxCrashed`) for faults of the runtime itself, never of the program.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import trio

from conduit.core.files import FileData
from conduit.core.results import Status
from conduit.executors.output import OutputHook
from conduit.executors.syntax_memo import SyntaxMemo

__all__ = [
    "CallbackAddress",
    "ErrorInfo",
    "Executor",
    "ExecutorInfo",
    "ExecutorSession",
    "FileInfo",
    "FilesRefused",
    "Job",
    "Limits",
    "Outcome",
    "SessionSpec",
    "Status",
    "ToolBridge",
    "python_request",
]


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits for one execution, already capped by the daemon's maxima."""

    timeout_ms: int = 10_000
    memory_mb: int = 128
    output_bytes: int = 1_048_576
    output_lines: int = 10_000
    tool_calls: int = 100
    result_bytes: int = 1_048_576
    # What the program's working directory may hold, input files included.
    disk_mb: int = 64


class StopSignal:
    """The daemon asking an executor to stop a program: set once, on the Trio thread.

    An executor checks it, or has it call back while it waits for something else
    (`calling`): no task to watch it, and waking a waiting task with an event is far
    cheaper for Trio than cancelling the scope it waits in, which the wasm executors
    did per execution.
    """

    __slots__ = ("_callbacks", "_set")

    def __init__(self) -> None:
        self._set = False
        self._callbacks: list[Callable[[], None]] = []

    def __repr__(self) -> str:
        return f"<StopSignal {'set' if self.is_set() else 'clear'}>"

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def is_set(self) -> bool:
        return self._set

    def calling(self, callback: Callable[[], None]) -> contextlib.AbstractContextManager[None]:
        """Have `callback` called when the signal is set during the block (at once if
        it is set already); it runs synchronously, in `set`'s caller."""
        return _Calling(self, callback)

    def _watch(self, callback: Callable[[], None]) -> None:
        if self._set:
            callback()
        else:
            self._callbacks.append(callback)

    def _forget(self, callback: Callable[[], None]) -> None:
        with contextlib.suppress(ValueError):
            self._callbacks.remove(callback)


class _Calling:
    """`StopSignal.calling`'s block, entered once per execution on the event loop: a
    plain class, at half the cost of a generator-based one (0.7 against 1.3 µs)."""

    __slots__ = ("_callback", "_signal")

    def __init__(self, signal: StopSignal, callback: Callable[[], None]) -> None:
        self._signal = signal
        self._callback = callback

    def __enter__(self) -> None:
        self._signal._watch(self._callback)

    def __exit__(self, *exc_info: object) -> None:
        self._signal._forget(self._callback)


@dataclass(frozen=True, slots=True)
class Job:
    """One program to run. `code` is the program as the client meant it (fences removed).

    `stop` is set when the daemon wants the program stopped early (cancelled, or a
    limit the daemon enforces, such as tool calls): the executor then kills the
    sandbox and returns `Status.CANCELLED` with the output so far, rather than
    raising. The daemon overrides the status with the reason it stopped it.

    `on_output`, when set, is awaited with each piece of output the program writes,
    in the order it was written (across stdout and stderr as far as the runtime can
    tell), while it runs; guests then flush each line as it is printed. It is the
    hook's business to bound its waiting (see `OutputCapture`). When it is None the
    executor does no work for streaming at all.

    `syntax` is the request's parse of the program, made by whoever read it before
    the executor (the registry, the policy): an executor that parses the program
    `take`s it from there.
    """

    execution_id: str
    language: str
    code: str
    limits: Limits = field(default_factory=Limits)
    inputs: Any = None
    stop: StopSignal = field(default_factory=StopSignal, compare=False)
    on_output: OutputHook | None = field(default=None, compare=False)
    # Who the program runs for: what executors charge per-principal budgets to.
    principal: str | None = None
    # How long, in all, the executor may hold the program back waiting for a CPU slot
    # or a sandbox: queueing, which `limits.timeout_ms` does not count.
    queue_timeout_s: float = 30.0
    # Placed in the program's working directory before it runs (paths already checked,
    # their total within `limits.disk_mb`).
    files: tuple[FileData, ...] = ()
    syntax: SyntaxMemo = field(default_factory=SyntaxMemo, compare=False, repr=False)
    # Set when the daemon would rather run the program elsewhere once it has computed
    # this long (CPU seconds) with nothing of it seen outside the sandbox: the executor
    # may then stop it and answer `Outcome.moved`.
    move_after_cpu_s: float | None = None


def python_request(job: Job) -> dict[str, Any]:
    """The request the Python program runner takes (`shims/python_program.py`).

    `live_output` asks it to flush every line as it is printed, for a job whose output
    is streamed; otherwise stdout is flushed when the program ends.
    """
    request = {"code": job.code, "inputs": job.inputs, "timeout_ms": job.limits.timeout_ms}
    if job.on_output is not None:
        request["live_output"] = True
    return request


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """Why a program failed, in the program's own terms."""

    type: str
    message: str
    traceback: str = ""


@dataclass(slots=True)
class Outcome:
    """What came of an execution. Partial output is kept whatever the status."""

    status: Status
    result: Any = None
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    error: ErrorInfo | None = None
    truncated_stdout: bool = False
    truncated_stderr: bool = False
    tool_calls: int = 0
    memory_peak_bytes: int | None = None
    # Time the executor held the program back waiting for a CPU slot or a sandbox
    # (reported in `queue_ms`, apart from the program's own time).
    queue_s: float = 0.0
    # A session's step only: whether its sandbox could not go on after this step (a
    # trapped instance, a killed process), so the next step starts afresh.
    session_reset: bool = False
    # What the program left under `out/` in its working directory (regular files only,
    # paths relative to `out/`), for the result.
    files: list[FileData] = field(default_factory=list)
    # Tool calls a subprocess sandbox wrote to the daemon before it answered, which the
    # daemon reads before the execution's session ends (a call read after is refused).
    calls_written: int = 0
    # The program was stopped unseen, to be run again from the start elsewhere
    # (`Job.move_after_cpu_s`): nothing else of this outcome counts.
    moved: bool = False


@dataclass(frozen=True, slots=True)
class CallbackAddress:
    """Where a subprocess sandbox connects back to the daemon (one of the two is set)."""

    unix_path: str | None = None
    tcp_host: str | None = None
    tcp_port: int | None = None
    # The longest line the daemon reads there: a call longer is refused by the sandbox's
    # own SDK (the daemon could answer it only with a reply no call is waiting for).
    max_message_bytes: int | None = None


@runtime_checkable
class ToolBridge(Protocol):
    """The sandbox's only way back into the daemon, scoped to one execution.

    `session_token` authenticates the sandbox as its own least-privileged client;
    `request` sends a JSON-RPC call through the daemon's one dispatcher as that client
    (in-process executors such as Wasmtime use it directly; subprocess sandboxes connect
    to `callback` and present the token instead). A bridge may mint the token only when
    it is first read, so an executor that never hands one out should not read it.
    """

    callback: CallbackAddress | None

    @property
    def session_token(self) -> str: ...

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        """Dispatch `method` as the sandbox; its result, or the `RpcError` a client gets."""
        ...


@dataclass(frozen=True, slots=True)
class FileInfo:
    """A file in a working directory: its path there, and its size."""

    path: str
    size: int


class FilesRefused(Exception):
    """Files that cannot be placed as asked; the message names the path and why."""


@dataclass(frozen=True, slots=True)
class SessionSpec:
    """What a session's sandbox is opened with. `memory_mb` bounds what it holds
    across all its steps (a step's own `limits.memory_mb` is not used)."""

    session_id: str
    language: str
    memory_mb: int
    principal: str | None = None


class ExecutorSession(Protocol):
    """One sandbox kept from one execution to the next: what a program defines
    (variables, functions, imports, files) is there for the next step.

    The daemon runs one step at a time in a session. A step that fails in the
    program's own terms leaves the session as it was; a step after which the
    sandbox cannot go on (a trap, a timeout that killed its process, the memory cap)
    reports `Outcome.session_reset`, and the next step runs in a fresh sandbox.
    """

    async def run(self, job: Job, bridge: ToolBridge) -> Outcome:
        """Run `job` as the session's next step; as `Executor.run` otherwise."""
        ...

    async def put_files(self, files: Sequence[FileData], disk_bytes: int) -> None:
        """Place `files` in the session's working directory (replacing any by the same
        path), between steps. Raises `FilesRefused` if a path is taken by a directory
        or a link, or if the directory would then hold more than `disk_bytes`."""
        ...

    async def get_file(self, path: str) -> bytes | None:
        """The bytes of the regular file at `path` in the working directory, or None
        if there is none (a directory, a link or a special file is none)."""
        ...

    async def list_files(self) -> list[FileInfo]:
        """Every regular file in the working directory, in path order."""
        ...

    async def aclose(self) -> None:
        """End the sandbox and free what it holds; idempotent, never raises."""
        ...


@dataclass(frozen=True, slots=True)
class ExecutorInfo:
    """A snapshot for `executors/list` and `conduit doctor`.

    `progress` is what the executor's start-up is building, step by step, with the
    elapsed seconds (`wasm_build.BuildProgress.snapshot`), or None if it builds nothing.
    `packages` are the versions of the packages installed for its programs beyond the
    language's own library, by name (the operator's choice, see `packages`).
    """

    name: str
    languages: tuple[str, ...]
    available: bool
    version: str | None = None
    reason: str | None = None
    pool: dict[str, Any] | None = None
    progress: dict[str, Any] | None = None
    packages: dict[str, str] = field(default_factory=dict)


class Executor(Protocol):
    """A runtime that runs programs in fresh sandboxes.

    `serve` runs the executor's background work (warm pools, tickers) until cancelled,
    calling `task_status.started()` once the executor can take jobs; `run` runs one job.
    """

    name: str
    languages: frozenset[str]

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run background work until cancelled; `started()` once jobs can be taken.

        A runtime that cannot be used is not an error: it is reported by `info()`, and
        `serve` still calls `started()` and waits to be cancelled.
        """
        ...

    async def run(self, job: Job, bridge: ToolBridge) -> Outcome:
        """Run `job` in a fresh sandbox and return how it ended.

        A failing program is an `Outcome` (timeout, memory limit, crash, ...) with its
        output so far, never an exception. When `job.stop` is set the program is stopped
        and reported `CANCELLED`. Raises `RuntimeMissing` if the runtime is unusable and
        `SandboxCrashed` if no sandbox could be started; if cancelled, the sandbox is
        gone before `trio.Cancelled` propagates.
        """
        ...

    async def open_session(self, spec: SessionSpec) -> ExecutorSession:
        """A sandbox of its own for a session, ready for its first step.

        Raises `RuntimeMissing` if the runtime is unusable, `Overloaded` if no sandbox
        can be had now.
        """
        ...

    @property
    def unavailable_reason(self) -> str | None:
        """Why the executor cannot take jobs now, or None when it can.

        Asked once per request, so it only reads a field: `info()` builds the whole
        snapshot (a Deno pool's statistics cost ~16 µs), which a request never needs.
        """
        ...

    def info(self) -> ExecutorInfo:
        """A snapshot of availability, version and pool counters; never blocks."""
        ...
