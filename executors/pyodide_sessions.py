"""Pyodide sessions: one interpreter kept from one step to the next.

A session holds a worker process of its own (`pyodide_host.PyodideHost`), taken from
the pool for keeps when its first step comes (a session never stepped holds none): its
steps run one after another in that process's one interpreter, in one Python scope,
so what a step defines (variables, functions, imports, files) is there for the next.
No other program ever runs in that process, and it is killed with the session, so
nothing of a session reaches a fresh execution or another session.

Each step is a program like any other (`PyodideExecutor.run_on`): its own timeout,
output limits, stop signal and CPU limit; a step that had to be stopped (a timeout, a
limit, the stop signal) or crashed kills the process, as a fresh program's does, since
Deno cannot stop code running in a Web Worker otherwise. The step then reports
`session_reset` and the next step takes a fresh interpreter. So does a step that ran
out of memory: the process's data limit counts from what it held before the session's
first step (`pyodide_host.Kept`), so the session's `memory_mb` bounds all its steps
together, and an interpreter that hit it is not trusted with more. A program's own
exception leaves the session as it was.

The session's working directory is its interpreter's (`shims/pyodide_files.js`):
kept from step to step, empty again after a reset. Between steps the daemon may
place, read and list its files (`put_files`, `get_file`, `list_files`): each is a
message to the session's process, answered by its interpreter, which walks paths
name by name and never follows a link. Files put before the first step take the
session's process then, so its first step finds them.

`SessionRegistry` bounds how many sessions an executor holds: each may hold a process
(~0.25 GB) beyond the pool's, so past the bound opening one is `Overloaded` rather
than a squeeze on fresh executions. An idle session runs no task and its process may
use almost no CPU (`PyodideHost.rest`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import trio

from conduit.core import b64
from conduit.core.errors import Overloaded, SandboxCrashed
from conduit.core.files import FileData
from conduit.executors import outcomes
from conduit.executors.base import (
    FileInfo,
    FilesRefused,
    Job,
    Outcome,
    SessionSpec,
    Status,
    ToolBridge,
)
from conduit.executors.pyodide_files import MIB, on_the_wire, stored_files
from conduit.executors.pyodide_host import DATA_SLACK_BYTES, Kept, PyodideHost

__all__ = ["PyodideSession", "SessionRegistry", "StepRunner"]

# A file operation is a copy in memory; past this the interpreter is not answering.
FILE_OP_TIMEOUT_S = 30.0
# Listing's share of an answer beyond the files' bytes.
LISTING_BYTES = 16 * MIB


class StepRunner(Protocol):
    """What a session needs of its executor: the run path fresh programs take too."""

    async def host_for(self, job: Job, *, keep: bool) -> tuple[PyodideHost, float]:
        """A host with a fresh interpreter ready, and how long `job` waited for it."""
        ...

    async def run_on(
        self, host: PyodideHost, job: Job, bridge: ToolBridge, kept: Kept | None
    ) -> tuple[Outcome, bool]:
        """Run `job` on `host`; its outcome, and whether the host may go on."""
        ...


class SessionRegistry:
    """The sessions one executor holds, at most `limit` of them."""

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"a session limit cannot be negative, not {limit}")
        self._limit = limit
        self._open: set[PyodideSession] = set()

    def open(self, spec: SessionSpec, runner: StepRunner) -> PyodideSession:
        """A new session; raises Overloaded if `limit` are open already."""
        if len(self._open) >= self._limit:
            raise Overloaded(
                f"the pyodide executor holds {self._limit} sessions, its most; close one "
                "or retry later"
            )
        session = PyodideSession(spec, runner, self._open.discard)
        self._open.add(session)
        return session

    def statistics(self) -> dict[str, Any]:
        """Open sessions, the worker processes they hold, and the bound."""
        holding = sum(1 for session in self._open if session.holds_process)
        return {"open": len(self._open), "processes": holding, "max": self._limit}


class PyodideSession:
    """One session's interpreter, kept across steps (see the module).

    Runs one step at a time; `aclose` may come at any moment, also during a step,
    which then ends as a crash.
    """

    def __init__(
        self,
        spec: SessionSpec,
        runner: StepRunner,
        on_close: Callable[[PyodideSession], None],
    ) -> None:
        self.spec = spec
        self._runner = runner
        self._on_close = on_close
        self._host: PyodideHost | None = None
        self._kept: Kept | None = None
        self._stepping = trio.Lock()
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "holding" if self._host else "idle"
        return f"<PyodideSession {self.spec.session_id} [{state}]>"

    @property
    def holds_process(self) -> bool:
        return self._host is not None

    async def run(self, job: Job, bridge: ToolBridge) -> Outcome:
        """Run `job` as the session's next step, under the session's memory limit.

        Raises as `PyodideExecutor.run`, and SandboxCrashed once the session is closed.
        """
        job = dataclasses.replace(
            job, limits=dataclasses.replace(job.limits, memory_mb=self.spec.memory_mb)
        )
        async with self._stepping:
            self._check_open()
            if self._host is not None and not self._host.alive:
                self._drop()
                return _ended_between_steps()
            waited_s = 0.0
            if self._host is None:
                waited_s = await self._take(job)
            outcome = await self._step(job, bridge)
        outcome.queue_s += waited_s
        return outcome

    async def _take(self, job: Job) -> float:
        host, waited_s = await self._runner.host_for(job, keep=True)
        if self._closed:  # while it waited
            host.kill()
            self._check_open()
        try:
            self._kept = Kept(host.data_bytes())
        except ProcessLookupError:
            self._kept = Kept(0)  # the step finds it gone, and says so
        self._host = host
        return waited_s

    async def _step(self, job: Job, bridge: ToolBridge) -> Outcome:
        """The step on the session's host; the host is dropped after a step it cannot
        go on from."""
        host = self._host
        assert host is not None
        going_on = False
        try:
            outcome, going_on = await self._runner.run_on(host, job, bridge, self._kept)
            going_on = going_on and outcome.status is not Status.MEMORY_LIMIT and host.rest()
        finally:
            if not going_on:
                self._drop()
        outcome.session_reset = not going_on
        return outcome

    async def put_files(self, files: Sequence[FileData], disk_bytes: int) -> None:
        """Place `files` in the working directory (see `ExecutorSession.put_files`);
        before the first step, this takes the session's process."""
        operation = {"op": "put", "files": on_the_wire(files), "disk_bytes": disk_bytes}
        async with self._stepping:
            self._check_open()
            if self._host is None:
                await self._take(Job("files", self.spec.language, ""))
            answer = await self._file_op(operation)
        if answer.get("ok") is not True:
            raise FilesRefused(str(answer.get("refused") or "the files could not be placed"))

    async def get_file(self, path: str) -> bytes | None:
        """The regular file at `path` in the working directory, or None."""
        async with self._stepping:
            self._check_open()
            if self._host is None:
                return None
            answer = await self._file_op({"op": "get", "path": path})
            encoded = answer.get("base64")
            if not isinstance(encoded, str):
                return None
            try:
                return b64.decode(encoded)
            except ValueError:  # the interpreter runs the program: its answer may be forged
                self._drop()
                raise SandboxCrashed(_FORGED_FILE) from None

    async def list_files(self) -> list[FileInfo]:
        """Every regular file in the working directory, in path order."""
        async with self._stepping:
            self._check_open()
            if self._host is None:
                return []
            answer = await self._file_op({"op": "list"})
        return stored_files(answer.get("files"))

    async def _file_op(self, operation: dict[str, Any]) -> dict[str, Any]:
        """`operation` answered by the session's interpreter, between steps. Raises
        SandboxCrashed if it is gone or does not answer (the next step starts afresh)."""
        host = self._host
        assert host is not None
        if not host.alive:
            raise SandboxCrashed(_ENDED_BETWEEN_STEPS)  # the next step says so too
        max_bytes = (self.spec.memory_mb * MIB + DATA_SLACK_BYTES) * 4 // 3 + LISTING_BYTES
        answer = await host.file_op(operation, FILE_OP_TIMEOUT_S, max_bytes)
        if answer is None or not host.rest():
            host.kill()  # the next step finds it gone, and reports the reset
            raise SandboxCrashed(
                "the session's interpreter did not answer a file operation; the next step "
                "starts afresh"
            )
        return answer

    def _drop(self) -> None:
        """Kill the session's process, if it holds one; the next step takes another."""
        host, self._host, self._kept = self._host, None, None
        if host is not None:
            host.kill()

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxCrashed(f"the session {self.spec.session_id} is closed")

    async def aclose(self) -> None:
        """Kill the session's process (its task in the pool's nursery reaps it and
        deletes its files) and leave the registry. Idempotent; it never awaits, so
        cancellation cannot leave the process behind. A step running meanwhile ends
        as a crash."""
        if not self._closed:
            self._closed = True
            self._on_close(self)
            self._drop()


_ENDED_BETWEEN_STEPS = (
    "the session's interpreter ended between steps (its process was killed, or code a "
    "step left running used up its CPU time)"
)
_FORGED_FILE = (
    "the session's interpreter answered a file read with data that is not base64; it was "
    "reset and the next step starts afresh"
)


def _ended_between_steps() -> Outcome:
    return outcomes.failed(
        Outcome(Status.CRASHED, session_reset=True),
        Status.CRASHED,
        "Crashed",
        f"{_ENDED_BETWEEN_STEPS}; this step did not run, and the next starts afresh",
    )
