"""One Pyodide worker process, and the daemon's side of its protocol.

A host is a `deno run shims/pyodide_worker.js` process that compiled Pyodide's
WebAssembly once and runs programs one at a time, each in a fresh interpreter: a Web
Worker restored from the memory snapshot, with no permission, ended after its one
program (the protocol is described in the shim). So the ~0.2 s of making an
interpreter is paid after a program, off the next one's path, and a process is not
started and loaded per program.

What one program could leave for the next, and why it cannot:
- its Python world (modules, globals, files) and its JavaScript world (globals,
  prototypes, timers, promises, finalizers) live in its own Web Worker, which is
  terminated; the next interpreter gets new ones, from bytes the program never held;
- a worker that does not stop when told (a JavaScript loop that never yields keeps a
  terminated Deno worker running, and writing) is caught before the next interpreter
  exists: `recycle` waits for the worker's thread to be gone and for the pipes to be
  empty, or the process is killed;
- a program that timed out, was stopped, hit a limit or crashed takes its process with
  it: `PyodideHost.run` reports it not reusable and the pool kills it;
- the process's own DENO_DIR holds the code cache its interpreters share: Deno caches
  modules there as they load, Pyodide's as the first interpreter loads and, no less, a
  program's own `import("data:...")`; a program after which it has grown takes its
  process with it, so no program finds what another cached (or fills the disk).

Files: a job carries its input files and `limits.disk_mb`; the answer line is followed
by a line of the files the program left under `out/` and whether it hit that limit
(`pyodide_files`), which the interpreter enforces as the program writes.

Limits: the process's CPU and data limits are per program, set before each job and
lifted between jobs (`set_soft_limit`); the wall-clock timeout counts from the moment
the program is handed to its interpreter.

A session's host is its own (`pyodide_sessions`): its steps run one after another in
one interpreter, kept (`Kept`), each under its own timeout and CPU limit as any
program, while the data limit counts from what the host held before the first step,
and stays in force between steps; between them, the host may use almost no CPU.

This module knows nothing of pools, installs or snapshots: `pyodide.py` does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import math
import os
import resource
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from conduit.core import jsontext
from conduit.core.errors import SandboxCrashed
from conduit.executors import outcomes
from conduit.executors.base import ErrorInfo, Job, Limits, Outcome, Status
from conduit.executors.os_sandbox import Contained, Stopper
from conduit.executors.output import READ_CHUNK_BYTES, OutputCapture, StreamName
from conduit.executors.process import (
    cpu_backstop_s,
    cpu_seconds,
    describe_returncode,
    read_vm_data_bytes,
    set_soft_limit,
)
from conduit.executors.pyodide_files import (
    MIB,
    OutFiles,
    files_line_bytes,
    on_the_wire,
    out_files,
)

__all__ = ["READY", "HostBroken", "Kept", "PyodideHost", "set_soft_limit", "worker_threads"]

# Written by the host once its first interpreter is ready, and after each `prepare`.
READY = b"\x1econduit-ready\n"
# Starts the answer line on stdout and the end line on stderr; the job's nonce follows.
RESULT_MARK = b"\x1e"
# 128 bits: a program that prints untrusted data cannot guess it.
NONCE_BYTES = 16
# Deno names each Web Worker's thread "worker-<n>" (its comm, in /proc).
WORKER_THREAD = "worker-"
# A terminated interpreter's thread is gone within milliseconds, even on a loaded
# machine well within this; one still there is running code that ignores termination.
THREAD_EXIT_TIMEOUT_S = 5.0
THREAD_POLL_S = 0.002
# Writable memory a program may use beyond its limit: the interpreter's JavaScript
# heap growth and allocator slack on top of the WebAssembly memory it grows.
DATA_SLACK_BYTES = 64 * MIB
# Between programs the host only makes the next interpreter (~0.2 s of CPU); this
# bounds a host that would spin on its own.
IDLE_CPU_S = 600
# Between a session's steps the host does nothing at all; this much CPU is code a step
# left running (a JavaScript loop in a promise), which then dies with the host.
SESSION_IDLE_CPU_S = 5
# What Deno prints when it dies of memory: V8's fatal heap OOM, a failed Rust allocation.


class HostBroken(SandboxCrashed):
    """The host cannot be trusted with another program; it must be killed."""


def worker_threads(pid: int) -> int:
    """How many Web Worker threads process `pid` runs now.

    Raises `ProcessLookupError` if the process is gone.
    """
    count = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError as exc:
        raise ProcessLookupError(pid) from exc
    for task in tasks:
        comm = f"/proc/{pid}/task/{task}/comm"
        # A thread that ended meanwhile is not counted.
        with contextlib.suppress(OSError), open(comm, encoding="utf-8", errors="replace") as f:
            if f.read().startswith(WORKER_THREAD):
                count += 1
    return count


# What a host's stdin or stdout pipe may hold once a line longer than Linux's default
# 64 KiB crosses it: a job's or a files line of a megabyte or two then crosses in a
# few writes, where it took a wake-up of each side per 64 KiB. Only then: Linux
# charges a pipe's size to the user (fs/pipe-user-pages-soft, 64 MiB by default, past
# which the user's new pipes get a single page), so hosts that never move a long line
# keep the default. Linux caps it at fs/pipe-max-size (1 MiB by default), and a pipe
# that cannot grow keeps its size.
PIPE_BYTES = 1 << 20
# One read of a protocol line: a whole line of the size above, where one exists.
LINE_READ_BYTES = PIPE_BYTES


# The most pipes this process keeps widened at once, across all its hosts: each takes
# PIPE_BYTES of the user's budget, which every process of the user shares, and a pool
# or many sessions widening without bound would leave the user's next pipes (any
# program's, the daemon's own) a single page. Eight take an eighth of the default.
MAX_WIDE_PIPES = 8


class WidePipes:
    """The pipes widened now, by the process at their other end, at most `limit`. A
    pipe stops counting once its process has been reaped: nothing must remember to
    give its place back. Used from Trio's thread only."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._owners: list[trio.Process] = []

    def take_nowait(self, owner: trio.Process) -> bool:
        """Whether one more pipe of `owner` may be widened, counted if so."""
        self._owners = [process for process in self._owners if process.returncode is None]
        if len(self._owners) >= self.limit:
            return False
        self._owners.append(owner)
        return True

    def give_back(self, owner: trio.Process) -> None:
        """One pipe of `owner` counted but not widened after all."""
        with contextlib.suppress(ValueError):
            self._owners.remove(owner)


WIDE_PIPES = WidePipes(MAX_WIDE_PIPES)


def widen_pipe(stream: object, owner: trio.Process) -> bool:
    """Let the pipe under `stream`, `owner`'s stdin or stdout, hold PIPE_BYTES if
    WIDE_PIPES allows; whether it does."""
    fileno = getattr(stream, "fileno", None)
    if fileno is None or not WIDE_PIPES.take_nowait(owner):
        return False
    try:
        fcntl.fcntl(fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:  # past fs/pipe-max-size or the user's budget: it keeps its size
        WIDE_PIPES.give_back(owner)
        return False
    return True


class _Pipe:
    """A host's stdout or stderr: bytes read but not yet used are kept for the next
    reader (the protocol's lines follow the program's output in the same pipe)."""

    def __init__(
        self, stream: trio.abc.ReceiveStream, *, widen_for: trio.Process | None = None
    ) -> None:
        self.stream = stream
        self._kept = b""
        # The process whose pipe is to be widened at its first long line, if any.
        self._narrow_of = widen_for

    async def receive(self, max_bytes: int = READ_CHUNK_BYTES) -> bytes:
        """What was kept, else the next bytes from the pipe (at most `max_bytes`); b""
        at its end."""
        if self._kept:
            data, self._kept = self._kept, b""
            return data
        return bytes(await self.stream.receive_some(max_bytes))

    def keep(self, data: bytes) -> None:
        self._kept = data + self._kept

    def pending_nowait(self) -> bytes:
        """What is kept or already waiting in the pipe, taken, without waiting."""
        data, self._kept = self._kept, b""
        fileno = getattr(self.stream, "fileno", None)
        while fileno is not None:
            try:
                chunk = os.read(fileno(), READ_CHUNK_BYTES)
            except (BlockingIOError, OSError):
                break
            if not chunk:
                break
            data += chunk
        return data

    async def read_until(
        self, marker: bytes, on_data: Callable[[bytes], Awaitable[None]] | None = None
    ) -> bool:
        """Give `on_data` everything before `marker` (none of it when None) and consume
        the marker; False if the pipe ended first. A tail that could begin a marker
        split across reads is held back until the next read tells."""
        held = b""
        while chunk := await self.receive():
            data = held + chunk
            found = data.find(marker)
            if found >= 0:
                self.keep(data[found + len(marker) :])
                if on_data is not None and found:
                    await on_data(data[:found])
                return True
            cut = _possible_marker_start(data, marker)
            held = data[cut:]
            if on_data is not None and cut:
                await on_data(data[:cut])
        if on_data is not None and held:
            await on_data(held)
        return False

    def _widen_once(self) -> None:
        owner, self._narrow_of = self._narrow_of, None
        if owner is not None:
            widen_pipe(self.stream, owner)

    async def read_line(self, max_bytes: int) -> bytes | None:
        """The bytes up to the next newline (consumed, not returned); None if the pipe
        ended first or the line is longer than `max_bytes`."""
        chunks: list[bytes] = []
        size = 0
        while chunk := await self.receive(LINE_READ_BYTES):
            end = chunk.find(b"\n")
            if end >= 0:
                self.keep(chunk[end + 1 :])
                chunks.append(chunk[:end])
                size += end
                return b"".join(chunks) if size <= max_bytes else None
            self._widen_once()
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                return None
        return None


def _possible_marker_start(data: bytes, marker: bytes) -> int:
    """Where a tail of `data` that could begin `marker` starts, or len(data). The
    marker's first byte occurs nowhere else in it, so only the last one matters."""
    start = data.rfind(marker[:1], max(0, len(data) - len(marker) + 1))
    if start >= 0 and marker.startswith(data[start:]):
        return start
    return len(data)


@dataclasses.dataclass(frozen=True, slots=True)
class Kept:
    """A session's step: its interpreter is kept for the next step, and the memory the
    session may add counts from `base_bytes`, what the host held before its first step,
    so its limit holds across all its steps."""

    base_bytes: int


def _tree_bytes(root: Path) -> int:
    """What the files under `root` take, in bytes (0 if it is gone)."""
    total = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir(root):
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False):
                    total += _tree_bytes(Path(entry.path))
                else:
                    total += entry.stat(follow_symlinks=False).st_size
    return total


@dataclasses.dataclass(eq=False)
class PyodideHost(Contained):
    """One started host with an interpreter ready or being made; owned by one task.

    `deno_dir` is its private DENO_DIR; `cache_bytes` what it held when the host last
    became ready.
    """

    process: trio.Process
    stdout: _Pipe
    stderr: _Pipe
    deno_dir: Path
    jobs: int = 0
    cache_bytes: int = 0
    stdin_wide: bool = False
    # Deno's own process, which limits and readings are for: inside an operating-system
    # sandbox, not `process` (bwrap) but its child. None: `process`.
    # Inside the operating-system sandbox: how its runtime is stopped (`Contained`).
    stopper: Stopper | None = None

    @classmethod
    def of(cls, process: trio.Process, deno_dir: Path) -> PyodideHost:
        assert process.stdout is not None
        assert process.stderr is not None
        stdout = _Pipe(process.stdout, widen_for=process)
        return cls(process, stdout, _Pipe(process.stderr), deno_dir)

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    def kill(self) -> None:
        """SIGKILL the host now; its task reaps it."""
        self.kill_process()

    async def aclose(self) -> None:
        """Kill the host and close its pipes. Idempotent; safe when cancelled."""
        self.kill()
        with trio.CancelScope(shield=True):
            for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
                if stream is not None:
                    await stream.aclose()

    async def send(self, message: dict[str, Any]) -> bool:
        """Write one protocol line; False if the host is gone."""
        assert self.process.stdin is not None
        line = jsontext.encode(message) + b"\n"
        if len(line) > READ_CHUNK_BYTES and not self.stdin_wide:
            self.stdin_wide = widen_pipe(self.process.stdin, self.process)
        try:
            await self.process.stdin.send_all(line)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        return True

    async def wait_ready(self, timeout_s: float) -> None:
        """Until the host writes READY, and nothing else; raises HostBroken otherwise."""
        received = b""
        ended = False
        with trio.move_on_after(timeout_s):
            while len(received) < len(READY):
                chunk = await self.stdout.receive()
                if not chunk:
                    ended = True
                    break
                received += chunk
        self.stdout.keep(received[len(READY) :])
        if received[: len(READY)] == READY:
            self.cache_bytes = _tree_bytes(self.deno_dir)
            return
        self.kill()
        stderr = await _read_briefly(self.stderr)
        why = (
            f"it did not become ready within {timeout_s:g} s"
            if not received
            else f"it wrote {received[:200]!r} instead of its ready line"
        )
        if ended:  # it closed its output: it ended, and how says why
            await self._wait_exit()
            code = self.returncode
            how = describe_returncode(code) if code is not None else "its exit not yet seen"
            why = f"it ended ({how}) before its ready line"
        raise HostBroken(f"a Pyodide worker failed to start: {why}; stderr: {stderr!r}")

    # -- one program ------------------------------------------------------------------

    async def run(
        self,
        job: Job,
        program: dict[str, Any],
        session_token: str | None,
        is_out_of_memory: Callable[[ErrorInfo], bool],
        kept: Kept | None = None,
    ) -> tuple[Outcome, bool]:
        """Run `program` (python_program's request) on the ready interpreter, under
        `job`'s limits; its outcome, and whether the host may run another program (with
        `kept`, the session's next step on the same interpreter).

        If cancelled, the caller must kill the host.
        """
        limits = job.limits
        nonce = os.urandom(NONCE_BYTES).hex()
        self.jobs += 1
        capture = OutputCapture(
            max_bytes=limits.output_bytes,
            max_lines=limits.output_lines,
            on_limit=self.kill,
            on_output=job.on_output,
        )
        reading = _JobReading(self, capture, nonce, limits)
        message = {"nonce": nonce, "program": program, "session_token": session_token or ""}
        message["tools"] = session_token is not None
        message["keep"] = kept is not None
        message["files"] = on_the_wire(job.files)
        message["disk_bytes"] = limits.disk_mb * MIB
        try:
            self._limit(limits, kept)
        except ProcessLookupError:
            return _crashed(capture, "the Pyodide worker exited before it took the program"), False
        with job.stop.calling(self.kill), trio.move_on_after(limits.timeout_ms / 1000) as deadline:
            if await self.send({"job": message}):
                await reading.read()
        if deadline.cancelled_caught:
            self.kill()
        reusable = reading.complete and not (
            deadline.cancelled_caught or capture.limit_hit or job.stop.is_set()
        )
        if not reading.complete and not deadline.cancelled_caught:
            await self._wait_exit()
        outcome = reading.outcome(deadline.cancelled_caught, limits, is_out_of_memory)
        if job.stop.is_set() and outcome.status is Status.CRASHED:
            outcome = outcomes.stopped(outcome)
        return outcome, reusable

    def _limit(self, limits: Limits, kept: Kept | None) -> None:
        """This program's CPU and data limits, counted from what the host holds now (a
        session's memory, from what it held before the session's first step)."""
        process = self.limited
        used = cpu_seconds(process.pid)
        cpu_s = math.ceil(used) + cpu_backstop_s(limits.timeout_ms / 1000)
        set_soft_limit(process, resource.RLIMIT_CPU, cpu_s)
        held = self.data_bytes() if kept is None else kept.base_bytes
        data = held + limits.memory_mb * MIB + DATA_SLACK_BYTES
        set_soft_limit(process, resource.RLIMIT_DATA, data)

    def data_bytes(self) -> int:
        """The writable memory the host holds now. Raises `ProcessLookupError` if it
        is gone."""
        held = read_vm_data_bytes(self.limited.pid)
        if held is None:
            raise ProcessLookupError(self.limited.pid)
        return held

    def rest(self) -> bool:
        """Between a session's steps: whether the host can take the next one. Its CPU
        budget shrinks to `SESSION_IDLE_CPU_S`, so an idle session holds no core; a
        host that is gone, or in which a step had Deno cache code (which would grow
        over a session's steps), cannot."""
        try:
            used = cpu_seconds(self.limited.pid)
            set_soft_limit(self.limited, resource.RLIMIT_CPU, math.ceil(used) + SESSION_IDLE_CPU_S)
        except ProcessLookupError:
            return False
        return self.alive and not self._cache_grew()

    async def file_op(
        self, operation: dict[str, Any], timeout_s: float, max_bytes: int
    ) -> dict[str, Any] | None:
        """One operation on a kept interpreter's working directory, between a session's
        steps (see the shim): its answer, or None if the host did not give one within
        `timeout_s` and `max_bytes` (it is then killed: it cannot be trusted with the
        next step)."""
        nonce = os.urandom(NONCE_BYTES).hex()
        answer: Any = None
        with trio.move_on_after(timeout_s):
            if await self.send({"files": {**operation, "nonce": nonce}}):
                answer = await self._read_file_answer(nonce.encode("ascii"), max_bytes)
        if not isinstance(answer, dict):
            self.kill()
            return None
        return answer

    async def _read_file_answer(self, nonce: bytes, max_bytes: int) -> Any:
        stray = bytearray()

        async def keep_stray(data: bytes) -> None:
            stray.extend(data)

        found = await self.stdout.read_until(RESULT_MARK + nonce, keep_stray)
        line = await self.stdout.read_line(max_bytes) if found else None
        if stray or line is None:
            return None
        try:
            return jsontext.loads(line)
        except jsontext.JsonTextError:
            return None

    def _cache_grew(self) -> bool:
        return _tree_bytes(self.deno_dir) != self.cache_bytes

    async def _wait_exit(self) -> None:
        """The host died or was killed: its exit status, waited for briefly."""
        with trio.move_on_after(1.0):
            await self.process.wait()

    # -- between programs -------------------------------------------------------------

    async def recycle(self, start_timeout_s: float) -> None:
        """Make the next interpreter, once nothing of the last one is left.

        Raises HostBroken if the last interpreter's thread lingers, it wrote past its
        end or it had Deno cache code, or if the next one does not start; the host must
        then be killed.
        """
        await self._wait_workers(0)
        self._expect_quiet("after its program ended")
        if self._cache_grew():
            raise HostBroken("a program made the Pyodide worker cache code of its own")
        try:
            set_soft_limit(self.limited, resource.RLIMIT_DATA, resource.RLIM_INFINITY)
            used = cpu_seconds(self.limited.pid)
            set_soft_limit(self.limited, resource.RLIMIT_CPU, math.ceil(used) + IDLE_CPU_S)
        except ProcessLookupError as exc:
            raise HostBroken("the Pyodide worker exited between programs") from exc
        if not await self.send({"prepare": True}):
            raise HostBroken("the Pyodide worker exited between programs")
        await self.wait_ready(start_timeout_s)
        await self._wait_workers(1)
        self._expect_quiet("while it made an interpreter")

    async def _wait_workers(self, expected: int) -> None:
        with trio.move_on_after(THREAD_EXIT_TIMEOUT_S):
            while True:
                try:
                    if worker_threads(self.limited.pid) == expected and self.alive:
                        return
                except ProcessLookupError:
                    break
                await trio.sleep(THREAD_POLL_S)
        raise HostBroken(
            f"the Pyodide worker runs other than {expected} interpreter(s): "
            "a program's code outlived it"
        )

    def _expect_quiet(self, when: str) -> None:
        for name, pipe in (("stdout", self.stdout), ("stderr", self.stderr)):
            stray = pipe.pending_nowait()
            if stray:
                raise HostBroken(f"the Pyodide worker wrote {stray[:80]!r} on {name} {when}")


class _JobReading:
    """Reading one job's output and answer from a host's pipes."""

    def __init__(self, host: PyodideHost, capture: OutputCapture, nonce: str, limits: Limits):
        self._host = host
        self._capture = capture
        self._nonce = nonce.encode("ascii")
        self._max_result = limits.result_bytes
        self._max_files = files_line_bytes(limits)
        self.payload: bytes | None = None
        self.files: OutFiles | None = None
        self.payload_too_large = False
        self._stderr_done = False

    @property
    def complete(self) -> bool:
        """Both pipes reached their end-of-job lines, and the answer and files were read."""
        return self.payload is not None and self.files is not None and self._stderr_done

    async def read(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_stderr)
            await self._read_stdout()

    async def _read_stdout(self) -> None:
        found = await self._host.stdout.read_until(
            RESULT_MARK + self._nonce, self._writer("stdout")
        )
        if found:
            self.payload = await self._host.stdout.read_line(self._max_result)
            if self.payload is None:
                self.payload_too_large = True
                self._host.kill()
            else:
                await self._read_files()
        await self._capture.finish("stdout")

    async def _read_files(self) -> None:
        """The line after the answer: the files the program left, within what its
        limits allow; the host is killed if it sent none."""
        line = await self._host.stdout.read_line(self._max_files)
        self.files = None if line is None else out_files(line)
        if self.files is None:
            self._host.kill()

    async def _read_stderr(self) -> None:
        marker = RESULT_MARK + self._nonce + b"\n"
        self._stderr_done = await self._host.stderr.read_until(marker, self._writer("stderr"))
        await self._capture.finish("stderr")

    def _writer(self, stream: StreamName) -> Callable[[bytes], Awaitable[None]]:
        async def write(data: bytes) -> None:
            # Once read, output is kept even if the reader is cancelled meanwhile.
            with trio.CancelScope(shield=True):
                await self._capture.write(stream, data)

        return write

    def outcome(
        self, timed_out: bool, limits: Limits, is_out_of_memory: Callable[[ErrorInfo], bool]
    ) -> Outcome:
        """How the program ended. Limits come first: the host was killed for them, so
        what the program would have answered is unknown."""
        outcome = outcomes.captured(self._capture)
        if self._capture.limit_hit:
            return outcomes.output_limit(outcome, limits)
        if self.payload_too_large:
            return outcomes.result_too_large(outcome, limits)
        if timed_out:
            return outcomes.timed_out(outcome, limits)
        if self.payload is not None and self.files is not None:
            outcome = outcomes.answered(outcome, self.payload, is_out_of_memory, "Pyodide worker")
            outcome.files = self.files.files
            return outcomes.disk_limit(outcome, limits) if self.files.disk_full else outcome
        returncode = self._host.returncode
        return outcomes.process_ended(outcome, returncode, limits, "Pyodide worker")


def _crashed(capture: OutputCapture, why: str) -> Outcome:
    return outcomes.failed(outcomes.captured(capture), Status.CRASHED, "Crashed", why)


async def _read_briefly(pipe: _Pipe, max_bytes: int = 4096) -> str:
    """Up to `max_bytes` of `pipe`, waiting at most a second (for error messages)."""
    data = b""
    with trio.move_on_after(1.0):
        while len(data) < max_bytes and (chunk := await pipe.receive()):
            data += chunk
    return data[:max_bytes].decode("utf-8", "replace").strip()
