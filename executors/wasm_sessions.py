"""A Wasmtime session's sandbox: one instance kept from step to step on a runner held.

A session takes a runner (`wasm_runners`) for its whole life and hands it one piece
of work, `SessionSandbox.serve`, which keeps the runner's instance and runs the
session's steps in it, one at a time, as they arrive in its mailbox. Between steps the
thread blocks on the mailbox: an idle session spends no CPU and holds no CPU slot
(`wasm_slots`), only its thread and its store. The guest keeps what a program defines
because every step runs in the same instance (see the guests' `session` requests).

What a step runs is the executor's (`WasmExecutor._step_work`): the same path as a
fresh execution's, short of closing the store. After a step the instance cannot go on
from (a trap: a timeout, a stop, the memory cap), the executor hands `reset`: the
thread closes the instance and makes a fresh one ahead of the next step. A step whose
guest outlives it (blocked in a WASI call, or its run cancelled) takes the runner with
it: the work returns False when the guest comes back, and the runner retires, as after
a fresh execution; the session then takes another runner for its next step.

`close` ends the loop once the step in hand (if any) is done: the thread closes the
store (and with it the scratch directory), and the runner goes back to the pool.
`closed` is set once it has.

`WasmSession` is the Trio side handed to the daemon (`ExecutorSession`): which runner
and sandbox the session holds, the step under way, and the one-step-at-a-time lock;
the executor does the rest (`WasmExecutor._run_step`, `_close_session`).

The session's working directory is its instance's scratch directory: it lasts as long
as the instance, so across steps, and a reset starts an empty one. `files/put`, `get`
and `list` run in the session's thread too (`SessionSandbox.on_files`), between steps
and under the same lock, on that directory (`workdir`, never through a link).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import trio

from conduit.core.errors import SandboxCrashed
from conduit.core.files import FileData
from conduit.executors import thread_priority, workdir
from conduit.executors.base import (
    FileInfo,
    FilesRefused,
    Job,
    Limits,
    Outcome,
    SessionSpec,
    ToolBridge,
)
from conduit.executors.wasm_instances import MIB, Instance, Instances
from conduit.executors.wasm_runners import Runner

__all__ = ["SessionSandbox", "Step", "WasmSession"]

log = logging.getLogger(__name__)

# A step, run in the session's runner thread: given the instance the session keeps
# (None if it has none), the instance to keep from then on and whether the runner may
# go on (not if the step's guest outlived it).
Step = Callable[[Instance | None], tuple[Instance | None, bool]]
T = TypeVar("T")


class _Reset:
    """The mailbox's word for "drop the instance; make a fresh one"."""


_RESET = _Reset()


class SessionSandbox:
    """A session's instance and the loop that runs its steps (`serve`, a runner's work).

    `hand`, `reset` and `close` may be called from any thread; `serve` runs in the
    runner's. Making or closing an instance that fails is logged: the next step makes
    its own instance, and reports the failure as a fresh execution would.
    """

    def __init__(self, instances: Instances) -> None:
        self.instances = instances
        self._mailbox: queue.SimpleQueue[Step | _Reset | None] = queue.SimpleQueue()
        self._token = trio.lowlevel.current_trio_token()
        self.closed = trio.Event()

    def hand(self, step: Step) -> None:
        self._mailbox.put(step)

    def reset(self) -> None:
        self._mailbox.put(_RESET)

    def close(self) -> None:
        self._mailbox.put(None)

    async def on_files(self, work: Callable[[Path | None], T]) -> T:
        """`work(directory)` in the session's thread, between steps: on its instance's
        working directory (an instance is made if it has none; None if none could be).
        Raises what `work` raises; `SandboxCrashed` if the session closed first."""
        done = trio.Event()
        outcome: list[Any] = []

        def step(instance: Instance | None) -> tuple[Instance | None, bool]:
            if instance is None:
                instance = self.instances.standby()
            directory = (
                None if instance is None or instance.scratch is None else instance.scratch.path
            )
            try:
                outcome.append((True, work(directory)))
            except Exception as exc:
                outcome.append((False, exc))
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(done.set)
            return instance, True

        self.hand(step)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_when, done, nursery.cancel_scope)
            nursery.start_soon(_cancel_when, self.closed, nursery.cancel_scope)
        if not outcome:
            raise SandboxCrashed("the session was closed")
        ok, value = outcome[0]
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]

    def serve(self, instance: Instance | None) -> bool:
        """The runner's work: run steps in `instance` until closed; whether the runner
        may go on (False after a step whose guest outlived it)."""
        try:
            while True:
                message = self._mailbox.get()
                if message is None:
                    return True
                thread_priority.foreground()
                if isinstance(message, _Reset):
                    _close(instance)
                    instance = self.instances.standby()
                    continue
                instance, go_on = message(instance)
                if not go_on:
                    return False
        finally:
            _close(instance)
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self.closed.set)


def _close(instance: Instance | None) -> None:
    if instance is None:
        return
    try:
        instance.close()
    except Exception:  # the pool slot is Wasmtime's to recover
        log.exception("closing a session's store failed")


class _Host(Protocol):
    """What runs a session's steps and ends it: its `WasmExecutor`."""

    async def _run_step(self, session: WasmSession, job: Job, bridge: ToolBridge) -> Outcome: ...

    async def _close_session(self, session: WasmSession) -> None: ...

    async def _files_sandbox(
        self, session: WasmSession, *, hold: bool
    ) -> SessionSandbox | None: ...


class WasmSession:
    """The daemon's handle on a session of a Wasmtime executor (`ExecutorSession`).

    Holds `runner` and `sandbox` while it has them (both None once a step's guest took
    the runner with it, until the next step takes another), how to stop the step under
    way (`stop_step`, while one runs), and whether it is `closed`. Steps run one at a
    time, in the order called.
    """

    def __init__(self, spec: SessionSpec, host: _Host) -> None:
        self.spec = spec
        self.memory_bytes = spec.memory_mb * MIB
        self.runner: Runner | None = None
        self.sandbox: SessionSandbox | None = None
        self.stop_step: Callable[[], None] | None = None
        self.closed = False
        # What its working directory may hold: the last step's or put's disk_mb, which
        # bounds what `get_file` reads (a sparse file may claim any size).
        self.disk_bytes = Limits().disk_mb * MIB
        self._host = host
        self._steps = trio.StrictFIFOLock()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "held" if self.runner is not None else "idle"
        return f"<WasmSession {self.spec.session_id} {state}>"

    def hold(self, runner: Runner) -> SessionSandbox:
        """Keep `runner` (taken, ready) and its instance for the session's steps."""
        assert runner.instances is not None  # it reported ready
        sandbox = SessionSandbox(runner.instances)
        runner.hand(sandbox.serve)
        self.runner, self.sandbox = runner, sandbox
        return sandbox

    def let_go(self) -> tuple[Runner | None, SessionSandbox | None]:
        """Forget the runner and sandbox held; what they were."""
        held = self.runner, self.sandbox
        self.runner = self.sandbox = None
        return held

    async def run(self, job: Job, bridge: ToolBridge) -> Outcome:
        """Run `job` as the session's next step (see `ExecutorSession.run`).

        A step whose run is cancelled leaves the session's next step a fresh sandbox:
        its guest is stopped, as a fresh execution's. Raises `SandboxCrashed` once the
        session is closed."""
        async with self._steps:
            if self.closed:
                raise SandboxCrashed(f"session {self.spec.session_id} is closed")
            return await self._host._run_step(self, job, bridge)

    async def put_files(self, files: Sequence[FileData], disk_bytes: int) -> None:
        """Place `files` in the working directory (see `ExecutorSession.put_files`)."""
        async with self._steps:
            self.disk_bytes = disk_bytes
            sandbox = await self._host._files_sandbox(self, hold=True)
            assert sandbox is not None  # held
            await sandbox.on_files(functools.partial(_put, files, disk_bytes))

    async def get_file(self, path: str) -> bytes | None:
        """The regular file at `path` in the working directory, or None."""
        async with self._steps:
            sandbox = await self._host._files_sandbox(self, hold=False)
            if sandbox is None:
                return None
            return await sandbox.on_files(functools.partial(_get, path, self.disk_bytes))

    async def list_files(self) -> list[FileInfo]:
        """Every regular file in the working directory, in path order."""
        async with self._steps:
            sandbox = await self._host._files_sandbox(self, hold=False)
            if sandbox is None:
                return []
            return await sandbox.on_files(_list)

    async def aclose(self) -> None:
        """Stop the step under way, if any, and free the store, the runner and the
        scratch directory; idempotent, never raises, and bounded under cancellation."""
        await self._host._close_session(self)


def _put(files: Sequence[FileData], disk_bytes: int, directory: Path | None) -> None:
    if directory is None:
        raise FilesRefused("the session's sandbox could not be made; try again")
    workdir.put(directory, files, disk_bytes)


def _get(path: str, max_bytes: int, directory: Path | None) -> bytes | None:
    if directory is None:
        return None
    try:
        return workdir.read(directory, path, max_bytes)
    except OSError:  # larger than the directory may hold: a sparse file
        return None


def _list(directory: Path | None) -> list[FileInfo]:
    if directory is None:
        return []
    return [FileInfo(entry.path, entry.size) for entry in workdir.regular_files(directory)]


async def _cancel_when(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()
