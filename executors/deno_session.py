"""A Deno session: one worker process of its own, running the session's steps in turn.

Each step is a module imported into the same V8 isolate, so what a step leaves on
`globalThis` the next one finds; `js_session.rewrite_step` makes a step's top-level
declarations such globals. A step runs as a one-shot job would (`DenoExecutor._step`):
its own timeout, output and result limits, stop signal and tool token. The process's
V8 heap is the session's `memory_mb`, for everything its steps hold together.

A step after which the worker cannot go on (killed for a timeout, a stop or a limit;
dead of memory or `Deno.exit`) reports `session_reset`, and the next step starts a
fresh worker. So does a step that found its worker dead when it came (killed between
steps by its CPU backstop, say): it ran afresh, and what the session held is gone.
A cancelled step leaves the worker in an unknown state, so it is killed too, and the
next step reports the reset.

Everything in the worker belongs to the session's one owner: a step reaches what
earlier steps left, by design, and a timer or promise of one step may still run (and
call tools, under the running step's token) in a later one; an error it throws
between steps is the next step's stderr.

The worker's working directory is the session's: files a step writes, or
`put_files` places between steps, are there for the next step, and go with the
worker (a reset starts with an empty directory). The daemon reads and writes it
host-side (`workdir`), never through a link the programs made.

The executor bounds how many sessions are open at once (`SessionSlots`): each holds a
process, which unlike the warm pool's is not freed when a program ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import trio

from conduit.core.errors import Overloaded, SandboxCrashed
from conduit.core.files import FileData
from conduit.executors import workdir
from conduit.executors.base import (
    ErrorInfo,
    FileInfo,
    Job,
    Outcome,
    SessionSpec,
    Status,
    ToolBridge,
)

__all__ = ["DEFAULT_MAX_SESSIONS", "DenoSession", "SessionHost", "SessionSlots", "SessionWorker"]

# Each open session holds a Deno process (~40 MB idle, up to its heap cap).
DEFAULT_MAX_SESSIONS = 16

# The most `get_file` reads: past any working directory's limit (the daemon's
# largest limits.disk_mb), so only a sparse file claiming more is refused.
READ_MAX_BYTES = 1 << 31


@dataclass(slots=True)
class SessionSlots:
    """How many sessions an executor holds, under its cap, and the nursery their
    workers run in (the executor's `serve`, which outlives any one request)."""

    limit: int
    held: int = 0
    nursery: trio.Nursery | None = None

    def take(self) -> None:
        """Hold one more session; `Overloaded` if the cap is reached."""
        if self.held >= self.limit:
            raise Overloaded(f"the deno executor holds its maximum of {self.limit} sessions")
        self.held += 1

    def give_back(self) -> None:
        self.held -= 1


class SessionWorker(Protocol):
    """What a session needs of its worker process (a `deno.DenoWorker`)."""

    @property
    def alive(self) -> bool:
        """Whether it may still take a step: neither killed nor exited."""
        ...

    @property
    def workdir(self) -> Path:
        """Its working directory, which lives as long as it does."""
        ...

    async def aclose(self) -> None:
        """Kill it; idempotent, and done in full even when cancelled."""
        ...


class SessionHost(Protocol):
    """What a session needs of its executor (a `deno.DenoExecutor`)."""

    async def start_session_worker(self, heap_mb: int) -> SessionWorker:
        """A fresh worker for a session's steps, with a V8 heap of `heap_mb`."""
        ...

    async def run_step(self, worker: SessionWorker, job: Job, bridge: ToolBridge) -> Outcome | None:
        """Run `job` on `worker` as a step; None if the worker died before taking it."""
        ...

    def rest(self, worker: SessionWorker) -> None:
        """`worker` is between steps: what its program left running (a timer that
        computes) may use only a little CPU before the system ends it."""
        ...


class DenoSession:
    """One session's sandbox (an `ExecutorSession`); see the module docstring."""

    def __init__(
        self, host: SessionHost, spec: SessionSpec, worker: SessionWorker, slots: SessionSlots
    ) -> None:
        self.spec = spec
        self._host = host
        self._worker: SessionWorker | None = worker
        self._slots = slots
        self._closed = False
        # The worker was lost in a way no outcome has said (a step cancelled or failed
        # half-way, a death between steps): the next step does.
        self._lost = False
        self._lock = trio.Lock()  # one step at a time, whoever calls

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<DenoSession {self.spec.session_id} ({state})>"

    async def run(self, job: Job, bridge: ToolBridge) -> Outcome:
        """Run `job` as the session's next step (see the module docstring)."""
        async with self._lock:
            self._check_open()
            starting_s = await self._ensure_worker()
            reset, self._lost = self._lost, False
            outcome = await self._step(job, bridge)
            if outcome is None:  # it died as the step came: once more, afresh
                reset = True
                starting_s += await self._start()
                outcome = await self._step(job, bridge)
            if outcome is None:
                outcome = Outcome(
                    Status.CRASHED,
                    error=ErrorInfo("Crashed", "the Deno sandbox died before it took the step"),
                )
            outcome.queue_s += starting_s
            outcome.session_reset = reset or self._worker is None
            return outcome

    async def put_files(self, files: Sequence[FileData], disk_bytes: int) -> None:
        """Place `files` in the worker's directory (a fresh worker's, if the last one
        is gone); `FilesRefused` naming the path, or past `disk_bytes` in all."""
        async with self._lock:
            self._check_open()
            await self._ensure_worker()
            assert self._worker is not None
            root = self._worker.workdir
            await trio.to_thread.run_sync(workdir.put, root, files, disk_bytes)

    async def get_file(self, path: str) -> bytes | None:
        async with self._lock:
            if self._worker is None:
                return None
            return await trio.to_thread.run_sync(_read, self._worker.workdir, path)

    async def list_files(self) -> list[FileInfo]:
        async with self._lock:
            if self._worker is None:
                return []
            return await trio.to_thread.run_sync(_list, self._worker.workdir)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxCrashed(f"session {self.spec.session_id} is closed")

    async def _ensure_worker(self) -> float:
        """A live worker for the session, started afresh if there is none (dropped
        after a step that said so) or it died idle, which the next step reports
        (`_lost`); the seconds starting took."""
        if self._worker is not None and self._worker.alive:
            return 0.0
        if self._worker is not None:
            self._lost = True
        return await self._start()

    async def _start(self) -> float:
        """Replace the worker with a fresh one; the seconds that took (queueing)."""
        began = trio.current_time()
        await self._drop()
        worker = await self._host.start_session_worker(self.spec.memory_mb)
        if self._closed:  # closed while the worker started
            await worker.aclose()
            raise SandboxCrashed(f"session {self.spec.session_id} is closed")
        self._worker = worker
        return trio.current_time() - began

    async def _step(self, job: Job, bridge: ToolBridge) -> Outcome | None:
        """Run the step; the worker is dropped unless it can take another."""
        worker = self._worker
        assert worker is not None
        try:
            outcome = await self._host.run_step(worker, job, bridge)
        except BaseException:
            self._lost = True
            await self._drop()  # cancelled, or failed, half-way: its state is unknown
            raise
        if worker.alive:
            self._host.rest(worker)
        else:
            await self._drop()
        return outcome

    async def _drop(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            await worker.aclose()

    async def aclose(self) -> None:
        """Kill the worker and give back the session's slot; idempotent, never raises,
        and done in full even when cancelled."""
        if self._closed:
            return
        self._closed = True
        self._slots.give_back()
        await self._drop()


def _read(directory: Path, path: str) -> bytes | None:
    try:
        return workdir.read(directory, path, READ_MAX_BYTES)
    except OSError:  # larger than any working directory may hold: a sparse file
        return None


def _list(directory: Path) -> list[FileInfo]:
    return [FileInfo(entry.path, entry.size) for entry in workdir.regular_files(directory)]
