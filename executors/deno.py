"""The Deno executor: TypeScript and JavaScript, each run in a fresh Deno process.

Every execution gets a `deno run` process that has run nothing before and is killed
after its one program. Speed comes from a `WarmPool` of such processes, started ahead
of time and blocked reading their job; a job takes one (or starts one cold when the
pool is empty or the job wants a different heap size) and the pool refills behind it.
So as many programs run at once as the daemon admits (`limits.max_concurrent_executions`),
each in its own process: a program waiting on a tool holds its process and nothing
else, and the kernel shares the cores among those that compute. Starting a worker cold
is queueing (`Outcome.queue_s`), not the program's time.

The process is the sandbox: Deno's permissions deny everything (no --allow-* flag
unless a callback address is configured, and then only that address), remote, npm
and config-file loading are off, the environment holds only what Deno needs, the
process runs in its own process group under rlimits, with a private DENO_DIR that is
deleted with it (Deno keeps localStorage, the Web Cache and per-module analysis under
DENO_DIR, which would otherwise carry state and programs from one execution to the
next).

Files: each worker is born with a working directory of its own (a `scratch.Scratch`,
holding only an empty `out/`), and reading and writing there is the one permission it
keeps (`--allow-read` and `--allow-write` name that directory alone, and the shim
checks nothing else is left). Deno's permissions are fixed when a process starts,
long before its job is known, so the directory belongs to the worker, not the job:
a worker runs one program, so it is still one directory per execution, deleted with
the worker. The job's input files are written in host-side before the program is
handed over, what the program left under `out/` is read back after it (`workdir`,
never through a link), and its size is watched while it runs: past
`limits.disk_mb` the process is killed and the execution ends in `disk_limit`.
RLIMIT_FSIZE caps any one file at the same size, should a file grow faster than the
watch looks.

Inside the process `shims/deno_worker.js` runs the program; the protocol is described
there. The daemon's side: write one JSON job to stdin and close it; read stdout and
stderr under the output budget while they stream; the result is the payload after a
per-job 128-bit nonce, which only the daemon and the shim ever hold.

A session (`open_session`) is the exception to one program per process: a worker of
its own runs the session's steps one after another (`deno_session`), the shim reading
a job per line instead of one to the end of stdin.

The executor knows nothing about sockets or tokens beyond what `bridge` hands it: the
job carries the bridge's session token and callback address to the shim, which makes
the program's tool calls itself. The permission to reach that address is granted when
a worker starts, so it comes from the constructor's `callback` (warm workers are
started before any job exists).

The callback channel is out of the program's reach. The address is the daemon's one
sandbox socket, shared by every execution: a program allowed to touch it could unlink
it and listen in its place, reading and answering everyone's tool calls. So a worker
is handed the address in a one-line prelude on stdin as it starts, connects, then
revokes every permission and checks that none is left (`shims/permissions.js`), all
before it says READY: no job, token or program exists yet, and the program runs with
no permission at all. What it can reach at most is that one connection (Deno 2 has no
`resources()`, but its internals are reachable), which carries only its own token and
calls. Done while the worker warms up, so no execution waits for the connect. Chosen
over a channel on the worker's own pipes, which would need no permission ever but a
second framing on stdout beside the program's output and the daemon dispatching calls
per worker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.resources
import logging
import math
import os
import resource
import secrets
import shutil
import signal
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio

from conduit.core import jsontext
from conduit.core.errors import ExecutorError, RuntimeMissing, SandboxCrashed
from conduit.core.files import OUT_DIR
from conduit.executors import cpu_watch, outcomes, workdir
from conduit.executors.base import (
    CallbackAddress,
    ErrorInfo,
    ExecutorInfo,
    FilesRefused,
    Job,
    Limits,
    Outcome,
    SessionSpec,
    Status,
    ToolBridge,
)
from conduit.executors.deno_session import (
    DEFAULT_MAX_SESSIONS,
    DenoSession,
    SessionSlots,
    SessionWorker,
)
from conduit.executors.disk_watch import DiskWatch
from conduit.executors.file_digest import file_version
from conduit.executors.js_session import rewrite_step
from conduit.executors.js_syntax import Dialect, prepare_parsed
from conduit.executors.os_sandbox import (
    NOT_PROBED,
    Confinement,
    Contained,
    SandboxChoice,
    Spawn,
    Stopper,
    choose,
    worker_run,
)
from conduit.executors.output import OutputCapture, ResultSplitter, read_buffered
from conduit.executors.pool import WarmPool
from conduit.executors.process import (
    Limited,
    ProcessLimits,
    apply_limits,
    cpu_backstop_s,
    cpu_seconds,
    describe_returncode,
    kill_process_group,
    lower_rlimit,
    memory_available_bytes,
    minimal_env,
    read_vm_data_bytes,
    sandbox_process_options,
    set_soft_limit,
)
from conduit.executors.scratch import Scratch, ScratchDirs

__all__ = ["DenoExecutor", "DenoWorker", "find_deno", "permission_flags", "read_version"]

log = logging.getLogger(__name__)

MIB = 1024 * 1024

# Written by the shim once it is loaded and waiting for its job (see deno_worker.js).
READY = b"\x1econduit-ready\n"
# Starts the result line; followed by the job's nonce, so a program cannot forge it.
RESULT_MARK = b"\x1e"
# 128 bits: a program that prints untrusted data cannot guess it.
NONCE_BYTES = 16

# Flags every sandbox gets. --no-code-cache and --cached-only: the DENO_DIR is thrown
# away with the process, so caching compiled code only costs writes, and nothing may
# ever be downloaded. The --deny-* flags name permissions a sandbox must never get,
# even if an --allow-* flag is added by mistake (deny wins in Deno).
SANDBOX_FLAGS = (
    "--no-prompt",
    "--no-remote",
    "--no-npm",
    "--no-config",
    "--no-lock",
    "--cached-only",
    "--no-code-cache",
    "--deny-run",
    "--deny-ffi",
    "--deny-env",
    "--deny-sys",
)

# Deno's own settings for the sandbox. The *_MODE variables keep caches that Deno
# would write under DENO_DIR in memory or off: a transpiled copy of every program and
# the Web Cache / KV store that programs can use without any permission.
DENO_ENV = {
    "NO_COLOR": "1",
    "DENO_NO_UPDATE_CHECK": "1",
    "DENO_NO_PROMPT": "1",
    "DENO_NO_PACKAGE_JSON": "1",
    "DENO_EMIT_CACHE_MODE": "disable",
    "DENO_CACHE_DB_MODE": "memory",
    "DENO_KV_DB_MODE": "memory",
}

# Programs up to this size are prepared on the event loop (parsing 4 KiB of
# TypeScript takes under a millisecond); larger ones in a worker thread, since a 1 MiB
# program takes up to the parse budget (`js_syntax.PARSE_BUDGET_S`).
INLINE_PREPARE_CHARS = 4096

# A worker starts in ~20-50 ms; this is generous for a loaded machine, and a start
# that takes longer means something is broken.
START_TIMEOUT_S = 10.0
# The pool grows past its `pool_size` while requests find it empty, only while this much
# memory is left (an idle worker holds ~34 MB).
GROW_FLOOR_BYTES = 1024 * MIB
VERSION_TIMEOUT_S = 10.0
# How much stderr to keep when explaining a worker that failed to start.
START_ERROR_BYTES = 4096
# An idle warm worker uses ~0.1 s of CPU; its job's own limit replaces this at hand-out.
IDLE_WORKER_CPU_S = 600
# Writable memory a worker may add on top of its idle size and its heap limit: the
# young generation, compiled code and allocator slack. Bounds what the V8 heap flag
# does not: ArrayBuffers, WebAssembly memories, and extra isolates (Web Workers).
DATA_SLACK_BYTES = 64 * MIB
# A session's worker may use this much CPU over its whole life; each step's own
# backstop is set below it (see `_limit_cpu`).
SESSION_CPU_S = 3600
# Two warm workers cover back-to-back requests while a refill (~30 ms) is under way.
DEFAULT_POOL_SIZE = 2
# Under the cache directory: the workers' working directories (see `ScratchDirs`).
SCRATCH_DIR = "scratch"
# The largest file a worker may write before its job is known: the daemon's largest
# `limits.disk_mb`; a job's own limit replaces it at hand-out.
DEFAULT_MAX_DISK_MB = 1024

# What Deno prints when it dies of memory: V8's fatal heap OOM, a failed Rust allocation.
OOM_SIGNS = outcomes.V8_OUT_OF_MEMORY
# A worker that could not write its answer exits with this (shims/deno_worker.js).
UNREPORTED_EXIT = 121
# Where V8's OOM report (GC log, C stack trace) starts; cut from the stderr we return.
OOM_REPORT_STARTS = ("\n<--- Last few GCs --->", "<--- Last few GCs --->", "\n#\n# Fatal")
# How V8 words an ArrayBuffer or WebAssembly.Memory allocation that the memory
# backstop refused (a RangeError the program may catch).
ALLOCATION_REFUSED = ("allocation failed", "could not allocate", "unable to grow", "out of memory")


def find_deno(configured: str | os.PathLike[str] | None = None) -> str | None:
    """The Deno binary to use: `configured` if given, else next to the Python
    interpreter (a venv's bin, where the `deno` PyPI package puts it), else on PATH.

    Returns None if there is none (or `configured` is not an executable file).
    """
    if configured is not None:
        path = Path(configured)
        return str(path) if path.is_file() and os.access(path, os.X_OK) else None
    beside = Path(sys.executable).parent / "deno"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("deno")


async def read_version(deno: str, cwd: Path) -> str:
    """The first line of `deno --version` without the program name ("2.9.8 (…)"), run
    in `cwd`; asked once per process for each version of the binary.

    Raises RuntimeMissing if it fails.
    """
    try:
        binary = file_version(Path(deno))
    except OSError:
        binary = None
    if binary is not None and (known := _versions.get(binary)) is not None:
        return known
    version = await _ask_version(deno, cwd)
    if binary is not None:
        _versions[binary] = version
    return version


# What each version of a Deno binary said it is (see `read_version`).
_versions: dict[tuple[int, ...], str] = {}


async def _ask_version(deno: str, cwd: Path) -> str:
    options = sandbox_process_options(cwd=cwd, env=minimal_env(DENO_ENV))
    try:
        with trio.fail_after(VERSION_TIMEOUT_S):
            done = await trio.run_process(
                [deno, "--version"],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                deliver_cancel=kill_process_group,
                **options,
            )
    except OSError as exc:
        raise RuntimeMissing(f"cannot run {deno}: {exc}") from exc
    except trio.TooSlowError as exc:
        raise RuntimeMissing(
            f"`{deno} --version` did not answer within {VERSION_TIMEOUT_S:g} s"
        ) from exc
    if done.returncode != 0:
        detail = done.stderr.decode("utf-8", "replace").strip()
        raise RuntimeMissing(
            f"`{deno} --version` failed ({describe_returncode(done.returncode)}): {detail}"
        )
    # "deno 2.9.8 (stable, release, x86_64-unknown-linux-gnu)": the name is the
    # executor's already.
    lines = done.stdout.decode("utf-8", "replace").strip().splitlines()
    if not lines:
        raise RuntimeMissing(f"`{deno} --version` printed nothing")
    return lines[0].removeprefix("deno ")


def permission_flags(callback: CallbackAddress | None, workdir: Path | None = None) -> list[str]:
    """The --allow-* flags that let a sandbox reach exactly `callback` and read and
    write in `workdir`, and nothing else.

    None for both gives no permission at all. A TCP address allows that host and port
    only; a Unix socket needs net access to the socket plus read and write access to
    its path. The shim uses the callback's once, to connect, and revokes them before
    the program runs; `workdir`'s are the program's (see `shims/permissions.js`).
    """
    files = [] if workdir is None else [_flag_path(str(workdir), "working directory")]
    net = []
    if callback is not None and callback.unix_path is not None:
        path = _flag_path(callback.unix_path, "callback socket path")
        net = [f"--allow-net=unix:{path}"]
        files.insert(0, path)
    elif callback is not None:
        if callback.tcp_host is None or callback.tcp_port is None:
            raise ValueError("a callback address needs a unix_path, or a tcp_host and tcp_port")
        host = callback.tcp_host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # IPv6 literal
        net = [f"--allow-net={host}:{callback.tcp_port}"]
    if not files:
        return net
    paths = ",".join(files)
    return [*net, f"--allow-read={paths}", f"--allow-write={paths}"]


def callback_sockets(callback: CallbackAddress | None) -> tuple[Path, ...]:
    """What an operating-system sandbox binds in for `callback`: its Unix socket."""
    if callback is None or callback.unix_path is None:
        return ()
    return (Path(callback.unix_path),)


def _flag_path(path: str, what: str) -> str:
    """`path` as a permission flag may list it: absolute, without the list's commas."""
    if not os.path.isabs(path) or "," in path:
        raise ValueError(f"{what} {path!r} must be absolute, without commas")
    return path


@dataclasses.dataclass(eq=False)
class DenoWorker(Contained):
    """One started `deno run` process waiting for its job. Used once, then closed."""

    process: trio.Process
    heap_mb: int
    # Its working directory, its own from its start to its end.
    scratch: Scratch
    # Whether it was told to die: a session's worker so told cannot take another step.
    killed: bool = False
    # Whether a job or session has it: its directory is then kept past the process's
    # exit until `aclose` (`released`), so what the program left can still be read.
    taken: bool = False
    released: trio.Event = dataclasses.field(default_factory=trio.Event)
    # Inside the operating-system sandbox: how its runtime is stopped (`Contained`).
    stopper: Stopper | None = None
    # A session's worker between steps: the watch on its CPU (`cpu_watch`).
    resting: trio.CancelScope = dataclasses.field(default_factory=trio.CancelScope)

    def kill(self) -> None:
        """SIGKILL the worker now; its task reaps it."""
        self.killed = True
        self.resting.cancel()
        self.kill_process()

    @property
    def alive(self) -> bool:
        """Whether it may still take a job: neither killed nor exited."""
        return not self.killed and self.process.returncode is None

    @property
    def workdir(self) -> Path:
        return self.scratch.path

    async def aclose(self) -> None:
        """Kill the worker and close its pipes. Idempotent; safe when cancelled.

        Does not wait for the exit: the task running the worker reaps the process
        (the pool's nursery for a warm worker, the caller's for a cold one), then
        deletes its directories.
        """
        self.kill()
        self.released.set()
        with trio.CancelScope(shield=True):
            for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
                if stream is not None:
                    await stream.aclose()


class DenoExecutor:
    """Runs TypeScript and JavaScript programs in one-shot Deno sandboxes.

    `cache_dir` is a directory the daemon owns: each worker gets a private DENO_DIR
    and a working directory under it, deleted when the worker exits (a tmpfs makes
    that cheaper). `work_dir`, where `deno --version` runs, defaults to
    `cache_dir / "work"`. `max_disk_mb` is the largest `limits.disk_mb` a job may
    have (a warm worker's file size cap until its job comes). `binary`
    overrides where Deno is looked for (see `find_deno`). `pool_size` warm workers are
    kept with a V8 heap limit of `memory_mb`; a job asking for another `memory_mb`
    starts a worker cold. `callback`, when set, is the one address sandboxes may
    connect to (see `permission_flags`). At most `max_sessions` sessions are open at
    once, each holding a worker of its own (see `deno_session`).
    """

    name = "deno"
    languages = frozenset({"typescript", "javascript"})
    # The worker script in `shims/`; a subclass running another guest names its own.
    shim = "deno_worker.js"

    def __init__(
        self,
        *,
        cache_dir: str | os.PathLike[str],
        work_dir: str | os.PathLike[str] | None = None,
        binary: str | os.PathLike[str] | None = None,
        pool_size: int = DEFAULT_POOL_SIZE,
        memory_mb: int = Limits().memory_mb,
        callback: CallbackAddress | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
        max_pool_size: int | None = None,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        max_disk_mb: int = DEFAULT_MAX_DISK_MB,
        os_sandbox: str = "required",
        bwrap: str | None = None,
    ) -> None:
        self._cache_dir = Path(cache_dir)
        self._work_dir = Path(work_dir) if work_dir is not None else self._cache_dir / "work"
        self._configured_binary = binary
        self._deno = find_deno(binary)
        self._memory_mb = memory_mb
        permission_flags(callback)  # a ValueError now, rather than at each start
        self._callback = callback
        self._max_file_bytes = max_disk_mb * MIB
        self._scratch: ScratchDirs | None = None
        self._start_timeout_s = start_timeout_s
        self._shim = Path(str(importlib.resources.files("conduit.shims") / self.shim))
        self._pool: WarmPool[DenoWorker] = WarmPool(
            partial(self._run_worker, memory_mb, IDLE_WORKER_CPU_S),
            size=pool_size,
            max_size=max_pool_size,
            # Starts beyond the cores only slow each other down: back to back, a
            # request waits for one under way (a third of a whole start, on average).
            max_starting=os.cpu_count() or 1,
            may_grow=_room_for_a_worker,
            name=self.name,
        )
        self._version: str | None = None
        self._reason: str | None = "the executor has not been started (serve() has not run)"
        self._cold_starts_other_heap = 0
        self._settled = trio.Event()  # set once `serve` knows whether Deno works
        self._sessions = SessionSlots(max_sessions)
        # "required" or "optional" (see `os_sandbox`); the sandbox once probed, or why
        # there is none.
        self._os_sandbox_mode = os_sandbox
        self._bwrap = bwrap
        self._os_sandbox: SandboxChoice = NOT_PROBED

    def __repr__(self) -> str:
        state = "available" if self._reason is None else f"unavailable: {self._reason}"
        return f"<DenoExecutor {self._deno or 'deno not found'} ({state}) {self._pool!r}>"

    # -- lifecycle ---------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Find out whether Deno works, then keep the warm pool filled until cancelled.

        Calls `task_status.started()` once the first warm workers are up, or at once if
        Deno is unusable: the executor then stays unavailable, with the reason in
        `info()`, and this returns only when cancelled. Never raises for a missing or
        broken Deno.
        """
        self._reason = await self._probe()
        self._settled.set()
        if self._reason is not None:
            log.warning("deno executor unavailable: %s", self._reason)
            if self._scratch is not None:
                self._scratch.close()
                self._scratch = None
            task_status.started()
            await trio.sleep_forever()
        try:
            async with trio.open_nursery() as nursery:
                # Session workers outlive the task that opened them: they run here.
                self._sessions.nursery = nursery
                try:
                    await self._pool.run(task_status=task_status)
                finally:
                    self._sessions.nursery = None
        finally:
            if self._scratch is not None:
                self._scratch.close()
                self._scratch = None

    async def wait_ready(self) -> bool:
        """Wait until `serve` knows whether the executor can run jobs; whether it can."""
        await self._settled.wait()
        return self._reason is None

    @property
    def preparing(self) -> bool:
        """Whether `wait_ready` would still wait."""
        return not self._settled.is_set()

    async def _probe(self) -> str | None:
        """Check Deno, the shim and the directories; return why not usable, or None."""
        if self._deno is None:
            where = (
                f"at the configured path {self._configured_binary}"
                if self._configured_binary is not None
                else "next to the Python interpreter or on PATH"
            )
            return (
                f"Deno was not found {where}; install it (pip install deno) or configure its path"
            )
        if not self._shim.is_file():
            return f"the worker shim {self._shim} is missing; reinstall conduit"
        try:
            await trio.to_thread.run_sync(self._prepare_dirs)
        except (OSError, ValueError) as exc:
            return f"cannot prepare the Deno directories: {exc}"
        try:
            self._version = await read_version(self._deno, self._work_dir)
        except ExecutorError as exc:
            return str(exc)
        return await self._probe_os_sandbox()

    async def _probe_os_sandbox(self) -> str | None:
        """Make the workers' operating-system sandbox; the executor's reason to be
        unavailable if it is required and cannot be made."""
        assert self._deno is not None
        self._os_sandbox = await choose(
            self.name, self._os_sandbox_mode, self._bwrap, self._deno, self._work_dir
        )
        return self._os_sandbox.refusal

    def _prepare_dirs(self) -> None:
        self._cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._work_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Left behind if the daemon died with workers running: nothing may survive.
        for stale in self._cache_dir.glob("worker-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if self._scratch is None:
            self._scratch = ScratchDirs(self._cache_dir / SCRATCH_DIR)
        permission_flags(None, self._scratch.root)  # a path a flag can name

    @property
    def unavailable_reason(self) -> str | None:
        return self._reason

    def info(self) -> ExecutorInfo:
        """Availability, version (read once by `serve`) and pool statistics."""
        pool = {
            key: value.value if key == "state" else value
            for key, value in dataclasses.asdict(self._pool.statistics()).items()
        }
        pool["memory_mb"] = self._memory_mb
        pool["cold_starts_other_heap"] = self._cold_starts_other_heap
        pool["sessions"] = self._sessions.held
        pool["os_sandbox"] = self._os_sandbox.state()
        return ExecutorInfo(
            name=self.name,
            languages=tuple(sorted(self.languages)),
            available=self._reason is None,
            version=self._version,
            reason=self._reason,
            pool=pool,
        )

    # -- workers -----------------------------------------------------------------------

    def _command(self, heap_mb: int, workdir: Path) -> list[str]:
        assert self._deno is not None
        return [
            self._deno,
            "run",
            *SANDBOX_FLAGS,
            *permission_flags(self._callback, workdir),
            *self.extra_flags(),
            f"--v8-flags=--max-old-space-size={heap_mb}",
            str(self._shim),
            *self.shim_args(),
        ]

    # -- what a subclass running another guest changes ---------------------------------

    def extra_flags(self) -> list[str]:
        """Deno flags beyond the sandbox's and the callback's (none: no permission)."""
        return []

    def shim_args(self) -> list[str]:
        """Arguments for the worker script."""
        return []

    def program_fields(self, job: Job) -> dict[str, Any]:
        """The job's program, as the worker script reads it."""
        # Loaded as the job's language (shims/deno_worker.js), so parsed as it.
        dialect: Dialect = "javascript" if job.language == "javascript" else "typescript"
        prepared = job.syntax.decided(
            ("deno module", dialect),
            job.code,
            lambda: prepare_parsed(job.code, job.syntax.take(job.code, dialect)),
        )
        job.syntax.forget()
        return {
            "module": prepared.text,
            "line_offset": prepared.line_offset,
            "column_shift": prepared.column_shift,
            "return_site": prepared.return_site,
        }

    def is_out_of_memory(self, error: ErrorInfo) -> bool:
        """Whether the program's error means it ran out of memory."""
        refused = error.message.lower()
        return error.type == "RangeError" and any(s in refused for s in ALLOCATION_REFUSED)

    async def _run_worker(
        self,
        heap_mb: int,
        cpu_s: int,
        *,
        session: bool = False,
        task_status: trio.TaskStatus[DenoWorker],
    ) -> None:
        """Run one worker until its process exits (a `WarmPool` spawn function).

        Calls `task_status.started(worker)` once the worker waits for its job (or, for
        a `session`, its steps, one after another). Raises
        RuntimeMissing if Deno cannot be run, SandboxCrashed if the worker does not
        start. Its private DENO_DIR and working directory are deleted after the process
        has exited, and the working directory once whoever took the worker is done
        with it.
        """
        deno_dir = self._cache_dir / f"worker-{secrets.token_hex(8)}"
        scratch = await trio.to_thread.run_sync(self._new_dirs, deno_dir)
        worker: DenoWorker | None = None
        try:
            failure: ExecutorError | None = None
            async with trio.open_nursery() as nursery:
                try:
                    worker = await self._start_worker(
                        nursery, heap_mb, cpu_s, deno_dir, scratch, session=session
                    )
                except ExecutorError as exc:
                    failure = exc  # raised below, outside the nursery's exception group
                else:
                    task_status.started(worker)
            if failure is not None:
                raise failure
            if worker is not None and worker.taken:
                await worker.released.wait()
        finally:
            # In a thread: unlinking Deno's SQLite files takes milliseconds on a
            # journaling filesystem, which would stall every other task.
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(_remove_dirs, deno_dir, scratch)

    def _new_dirs(self, deno_dir: Path) -> Scratch:
        """Make a worker's DENO_DIR and its working directory (holding an empty
        `out/`); SandboxCrashed if they cannot be made."""
        if self._scratch is None:
            raise SandboxCrashed("the deno executor is not serving")
        try:
            deno_dir.mkdir(mode=0o700)
        except OSError as exc:
            raise SandboxCrashed(f"cannot create a DENO_DIR for a worker: {exc}") from exc
        try:
            scratch = self._scratch.new()
            (scratch.path / OUT_DIR).mkdir(mode=0o700)
        except OSError as exc:
            shutil.rmtree(deno_dir, ignore_errors=True)
            raise SandboxCrashed(f"cannot create a working directory for a worker: {exc}") from exc
        return scratch

    async def _start_worker(
        self,
        nursery: trio.Nursery,
        heap_mb: int,
        cpu_s: int,
        deno_dir: Path,
        scratch: Scratch,
        *,
        session: bool,
    ) -> DenoWorker:
        env = minimal_env({**DENO_ENV, "DENO_DIR": str(deno_dir)})
        options = sandbox_process_options(cwd=scratch.path, env=env)
        command = self._command(heap_mb, scratch.path)
        spawn = self._confined(command, deno_dir, scratch.path)
        try:
            process: trio.Process = await nursery.start(worker_run(command, spawn, options))
        except OSError as exc:
            if spawn is not None:
                spawn.close()
            raise RuntimeMissing(f"cannot start Deno ({self._deno}): {exc}") from exc
        worker = DenoWorker(process, heap_mb, scratch, taken=session)
        try:
            if spawn is not None:
                await _start_runtime(worker, spawn)
            _limit(worker, ProcessLimits(cpu_s=cpu_s, file_bytes=self._max_file_bytes))
            prelude = _encode_prelude(self._callback, scratch.path, session=session)
            await _send_prelude(process, prelude)
            await self._wait_ready(worker)
            self._limit_memory(worker)
        except BaseException:
            await worker.aclose()
            raise
        return worker

    def _confined(self, command: list[str], deno_dir: Path, workdir: Path) -> Spawn | None:
        """`command` inside the operating-system sandbox, if there is one: it sees the
        shims, its DENO_DIR and working directory, and the callback socket alone."""
        sandbox = self._os_sandbox.sandbox
        if sandbox is None:
            return None
        confinement = Confinement(
            cwd=workdir,
            read_only=(self._shim.parent,),
            writable=(deno_dir, workdir),
            sockets=callback_sockets(self._callback),
        )
        return sandbox.spawn(command, confinement)

    async def _wait_ready(self, worker: DenoWorker) -> None:
        """Wait for the shim's READY line; raise SandboxCrashed if it does not come."""
        stdout = worker.process.stdout
        assert stdout is not None
        received = b""
        with trio.move_on_after(self._start_timeout_s):
            while len(received) < len(READY):
                chunk = await stdout.receive_some(len(READY) - len(received))
                if not chunk:
                    break
                received += chunk
        if received == READY:
            return
        worker.kill()
        stderr = await _read_briefly(worker.process.stderr, START_ERROR_BYTES)
        why = (
            f"it did not become ready within {self._start_timeout_s} s"
            if not received
            else f"it wrote {received!r} instead of its ready line"
        )
        raise SandboxCrashed(f"a Deno worker failed to start: {why}; stderr: {stderr!r}")

    def _limit_memory(self, worker: DenoWorker) -> None:
        """Cap writable memory at the idle size plus the heap limit plus slack."""
        idle_bytes = read_vm_data_bytes(worker.limited.pid)
        if idle_bytes is None:
            raise SandboxCrashed("a Deno worker exited right after starting")
        limit = idle_bytes + worker.heap_mb * MIB + DATA_SLACK_BYTES
        try:
            lower_rlimit(worker.limited, resource.RLIMIT_DATA, limit, limit)
        except ProcessLookupError as exc:
            raise SandboxCrashed("a Deno worker exited right after starting") from exc

    # -- jobs --------------------------------------------------------------------------

    async def run(self, job: Job, bridge: ToolBridge) -> Outcome:
        """Run `job` in a fresh Deno sandbox and report how it ended.

        A failing program is an Outcome, never an exception. Raises RuntimeMissing if
        Deno is unavailable and SandboxCrashed if no worker could be started. If
        cancelled, the sandbox is killed before `trio.Cancelled` propagates.
        """
        self._check(job.language)
        nonce = secrets.token_hex(NONCE_BYTES)
        request = await self._request(job, bridge, nonce, self.program_fields)
        if job.limits.memory_mb == self._memory_mb:
            began = trio.current_time()
            worker = await self._pool.acquire(within_s=self._start_timeout_s)
            if worker is not None:
                waited_s = trio.current_time() - began
                outcome = await self._run_on(worker, job, request, nonce)
                if outcome is not None:
                    outcome.queue_s += waited_s  # a start under way, waited for
                    return outcome
                log.warning("a warm Deno worker died before taking its job; starting one cold")
        else:
            self._cold_starts_other_heap += 1
        return await self._run_cold(job, request, nonce)

    # -- sessions ----------------------------------------------------------------------

    async def open_session(self, spec: SessionSpec) -> DenoSession:
        """A worker of the session's own, its V8 heap capped at `spec.memory_mb`.

        Raises RuntimeMissing if Deno is unavailable, Overloaded if the executor holds
        its maximum of sessions, SandboxCrashed if the worker does not start.
        """
        self._check(spec.language)
        self._sessions.take()
        try:
            worker = await self.start_session_worker(spec.memory_mb)
        except BaseException:
            self._sessions.give_back()
            raise
        return DenoSession(self, spec, worker, self._sessions)

    async def start_session_worker(self, heap_mb: int) -> DenoWorker:
        """A worker for a session's steps, run in `serve`'s nursery (it outlives the
        request that started it) with a CPU limit for the session's whole life."""
        nursery = self._sessions.nursery
        if nursery is None or self._reason is not None:
            raise RuntimeMissing(f"the deno executor is unavailable: {self._reason}")
        worker: DenoWorker = await nursery.start(
            partial(self._run_worker, heap_mb, SESSION_CPU_S, session=True)
        )
        return worker

    def rest(self, worker: SessionWorker) -> None:
        """Between a session's steps, its worker may use SESSION_IDLE_CPU_S of CPU more:
        a step's own budget (`_limit_cpu`) is for the step, not for the timers it
        leaves. Past it the worker is ended (by the system, or, in the sandbox where
        the system does not, by `cpu_watch`), and the next step starts afresh."""
        assert isinstance(worker, DenoWorker)
        nursery = self._sessions.nursery
        with contextlib.suppress(OSError):  # gone already: the next step sees it
            used = math.ceil(cpu_seconds(worker.limited.pid))
            set_soft_limit(worker.limited, resource.RLIMIT_CPU, used + SESSION_IDLE_CPU_S)
            if nursery is not None:
                worker.resting.cancel()
                worker.resting = trio.CancelScope()
                budget_s = used + SESSION_IDLE_CPU_S
                nursery.start_soon(
                    cpu_watch.watch, worker.limited, budget_s, worker.kill, worker.resting
                )

    async def run_step(self, worker: SessionWorker, job: Job, bridge: ToolBridge) -> Outcome | None:
        """Run `job` as a session's step on `worker` (one `start_session_worker` gave),
        its declarations made global (`js_session`); None if the worker died before
        taking it."""
        assert isinstance(worker, DenoWorker)
        self._check(job.language)
        nonce = secrets.token_hex(NONCE_BYTES)
        request = await self._request(job, bridge, nonce, self.session_fields)
        return await self._step(worker, job, request, nonce, one_shot=False)

    def session_fields(self, job: Job) -> dict[str, Any]:
        """A session step's program, as the worker script reads it."""
        dialect = "javascript" if job.language == "javascript" else "typescript"
        return self.program_fields(dataclasses.replace(job, code=rewrite_step(job.code, dialect)))

    def _check(self, language: str) -> None:
        if self._reason is not None or self._deno is None:
            raise RuntimeMissing(f"the deno executor is unavailable: {self._reason}")
        if language not in self.languages:
            raise ValueError(f"the deno executor does not run {language!r}")

    async def _request(
        self,
        job: Job,
        bridge: ToolBridge,
        nonce: str,
        fields: Callable[[Job], dict[str, Any]],
    ) -> bytes:
        """The job as the worker reads it, its program prepared by `fields` (in a
        thread for a large one: parsing it may take up to the parse budget)."""
        if len(job.code) <= INLINE_PREPARE_CHARS:
            program = fields(job)
        else:
            program = await trio.to_thread.run_sync(fields, job)
        return _encode_job(job, nonce, bridge, program)

    async def _run_cold(self, job: Job, request: bytes, nonce: str) -> Outcome:
        """Start a worker for `job` and run it there. Starting is the wait for a
        sandbox, not the program's time: it is the outcome's `queue_s` (bounded by the
        start timeout), and the program's timeout starts once the worker is ready."""
        cpu_s = cpu_backstop_s(job.limits.timeout_ms / 1000)
        failure: ExecutorError | None = None
        outcome: Outcome | None = None
        async with trio.open_nursery() as nursery:
            began = trio.current_time()
            try:
                worker = await nursery.start(self._run_worker, job.limits.memory_mb, cpu_s)
            except ExecutorError as exc:
                failure = exc  # raised below, outside the nursery's exception group
            else:
                starting_s = trio.current_time() - began
                outcome = await self._run_on(worker, job, request, nonce)
                if outcome is not None:
                    outcome.queue_s += starting_s
        if failure is not None:
            raise failure
        if outcome is None:
            return Outcome(
                Status.CRASHED,
                error=ErrorInfo("Crashed", "the Deno sandbox died before it took the program"),
            )
        return outcome

    async def _run_on(
        self, worker: DenoWorker, job: Job, request: bytes, nonce: str
    ) -> Outcome | None:
        """Run the job on `worker`, then close it. None if it died before the job."""
        try:
            return await self._step(worker, job, request, nonce, one_shot=True)
        finally:
            await worker.aclose()

    async def _step(
        self, worker: DenoWorker, job: Job, request: bytes, nonce: str, *, one_shot: bool
    ) -> Outcome | None:
        """Run the job on `worker` under its limits and stop signal; the worker is
        left as the job left it. None if it died before taking the job.

        `one_shot`: the worker's only job, after which it is killed; otherwise a
        session's step, after which a worker that answered waits for the next.

        The job's files are placed in the worker's directory first; what the program
        left under `out/` comes back in the outcome's `files`."""
        worker.taken = True
        worker.resting.cancel()  # a session's next step: its own budget holds now
        if not worker.alive:
            return None
        disk = DiskWatch(worker.scratch, job.limits.disk_mb * MIB, worker.kill)
        if (refused := await _place_inputs(worker, job, disk.max_bytes)) is not None:
            return refused
        with job.stop.calling(worker.kill):
            outcome = await self._execute(worker, job, request, nonce, disk, one_shot=one_shot)
        if outcome is None:
            return None
        if job.stop.is_set() and outcome.status is Status.CRASHED:
            return outcomes.stopped(outcome)
        return await _with_files(worker, job.limits, outcome, disk)

    async def _execute(
        self,
        worker: DenoWorker,
        job: Job,
        request: bytes,
        nonce: str,
        disk: DiskWatch,
        *,
        one_shot: bool,
    ) -> Outcome | None:
        limits = job.limits
        process = worker.process
        assert process.stdout is not None
        assert process.stderr is not None
        try:
            _limit_cpu(worker.limited, cpu_backstop_s(limits.timeout_ms / 1000), one_shot=one_shot)
            _limit_file_size(worker.limited, disk.max_bytes, one_shot=one_shot)
        except ProcessLookupError:
            return None
        # Limits are enforced by killing the sandbox the moment they are hit.
        capture = OutputCapture(
            max_bytes=limits.output_bytes,
            max_lines=limits.output_lines,
            on_limit=worker.kill,
            on_output=job.on_output,
        )

        def settled() -> None:
            # Once the result is in, nothing the program does can change the outcome:
            # stop it rather than wait for Deno's exit (~8 ms). Everything it wrote
            # before is already in the pipes and is still read to the end. A session
            # keeps a worker that answered; one whose answer is too large is still
            # writing it.
            if one_shot or stdout.payload is None:
                worker.kill()

        stdout = ResultSplitter(
            process.stdout,
            RESULT_MARK + nonce.encode("ascii"),
            max_payload_bytes=limits.result_bytes,
            on_settled=settled,
        )
        died_before_job = False
        with trio.move_on_after(limits.timeout_ms / 1000) as deadline:
            async with trio.open_nursery() as io:
                io.start_soon(capture.pump, "stderr", process.stderr)
                io.start_soon(disk.run)
                if not await _send(process, request, close=one_shot):
                    died_before_job = True
                    worker.kill()
                await capture.pump("stdout", stdout)
                disk.done()
                if stdout.payload is not None:
                    # The shim wrote its stderr before the result, with synchronous
                    # writes: all of it is in the pipe now, so the killed sandbox's
                    # exit (~1 ms of teardown) need not be waited for.
                    io.cancel_scope.cancel()
            if stdout.payload is not None:
                await capture.write("stderr", read_buffered(process.stderr))
                await capture.finish("stderr")
            # Without a result or a limit hit, the exit status tells how it ended.
            # Otherwise the outcome is known and reaping is left to the worker's task.
            elif not (died_before_job or stdout.settled or capture.limit_hit):
                await process.wait()
        if deadline.cancelled_caught:
            worker.kill()
        if died_before_job:
            return None
        return _outcome(
            limits,
            capture,
            stdout,
            timed_out=deadline.cancelled_caught,
            disk_hit=disk.hit,
            returncode=worker.returncode,
            is_out_of_memory=self.is_out_of_memory,
        )


# CPU a session's worker may use between its steps (see `DenoExecutor.rest`).
SESSION_IDLE_CPU_S = 5


def _limit_cpu(process: Limited, cpu_s: int, *, one_shot: bool) -> None:
    """The CPU backstop for the job about to run. A one-shot worker's limit only ever
    goes down; a session's worker has used CPU in earlier steps, so its soft limit is
    set that far above what it has used, under the hard limit of its whole life."""
    if one_shot:
        lower_rlimit(process, resource.RLIMIT_CPU, cpu_s, cpu_s + 1)
    else:
        used = math.ceil(cpu_seconds(process.pid))
        set_soft_limit(process, resource.RLIMIT_CPU, used + cpu_s)


def _limit_file_size(process: Limited, max_bytes: int, *, one_shot: bool) -> None:
    """No file the job writes may take more than its whole disk limit: a backstop for
    one that grows faster than `DiskWatch` looks. A session's worker keeps the hard
    limit it started with, under which each step sets its own."""
    if one_shot:
        lower_rlimit(process, resource.RLIMIT_FSIZE, max_bytes, max_bytes)
    else:
        set_soft_limit(process, resource.RLIMIT_FSIZE, max_bytes)


async def _place_inputs(worker: DenoWorker, job: Job, max_bytes: int) -> Outcome | None:
    """Write the job's files into the worker's directory; an error outcome naming the
    path if they cannot be (in a session, a directory or link of an earlier step's
    may hold it), else None."""
    if not job.files:
        return None
    try:
        await trio.to_thread.run_sync(workdir.put, worker.workdir, job.files, max_bytes)
    except FilesRefused as exc:
        return outcomes.failed(Outcome(Status.ERROR), Status.ERROR, "FilesRefused", str(exc))
    return None


async def _with_files(
    worker: DenoWorker, limits: Limits, outcome: Outcome, disk: DiskWatch
) -> Outcome:
    """The outcome with the files the program left under `out/`, or `disk_limit` if
    its directory went past the limit after the watch's last look (the worker is then
    killed: a session starts afresh rather than keep the excess)."""
    if outcome.status is Status.DISK_LIMIT:
        return outcome
    if not disk.hit and workdir.untouched(worker.workdir):
        return outcome  # most programs write no file: no thread for nothing to read
    collect = functools.partial(workdir.collect, worker.workdir, disk.max_bytes)
    files = await trio.to_thread.run_sync(disk.settle, collect)
    if files is None:
        disk.stop()
        return outcomes.disk_limit(outcome, limits)
    outcome.files = files
    return outcome


async def _start_runtime(worker: DenoWorker, spawn: Spawn) -> None:
    """Learn Deno's own process in the sandbox `spawn` started; SandboxCrashed (with
    what bwrap said) if it reported none."""
    try:
        await worker.start_runtime(spawn)
    except OSError as exc:
        worker.killed = True
        stderr = await _read_briefly(worker.process.stderr, START_ERROR_BYTES)
        why = f"a Deno worker's sandbox failed to start: {exc}; stderr: {stderr!r}"
        raise SandboxCrashed(why) from None


def _limit(worker: DenoWorker, limits: ProcessLimits) -> None:
    try:
        apply_limits(worker.limited, limits)
    except ProcessLookupError as exc:
        raise SandboxCrashed("a Deno worker exited right after starting") from exc


def _encode_prelude(
    callback: CallbackAddress | None, workdir: Path, *, session: bool = False
) -> bytes:
    """The line a worker reads as it starts: the one address it connects to before it
    gives up every permission but its working directory's (see the module
    docstring), that directory, and whether it will run a session's steps (one job
    per line) rather than one job."""
    address = dataclasses.asdict(callback) if callback is not None else None
    message = {"callback": address, "session": session, "workdir": str(workdir)}
    return jsontext.encode(message) + b"\n"


def _remove_dirs(deno_dir: Path, scratch: Scratch) -> None:
    shutil.rmtree(deno_dir, ignore_errors=True)
    scratch.remove()


async def _send_prelude(process: trio.Process, prelude: bytes) -> None:
    """Hand a starting worker its prelude; a worker already gone shows in its READY wait."""
    assert process.stdin is not None
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await process.stdin.send_all(prelude)


def _encode_job(job: Job, nonce: str, bridge: ToolBridge, program: dict[str, Any]) -> bytes:
    callback = bridge.callback
    message = {
        "nonce": nonce,
        **program,
        "inputs": job.inputs,
        "timeout_ms": job.limits.timeout_ms,
        "lang": job.language,
        # How the program's `tools.*` calls reach the daemon: this execution's session
        # token, on the one address the sandbox may connect to.
        "session_token": bridge.session_token,
        "callback": dataclasses.asdict(callback) if callback is not None else None,
    }
    # jsontext: inputs holding a lone surrogate or a non-finite float must not raise.
    return jsontext.encode(message)


async def _send(process: trio.Process, request: bytes, *, close: bool) -> bool:
    """Write the job, then close stdin if it is the worker's only one (a session's
    worker reads a line per step); False if the worker was already dead."""
    assert process.stdin is not None
    try:
        await process.stdin.send_all(request if close else request + b"\n")
        if close:
            await process.stdin.aclose()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return False
    return True


async def _read_briefly(stream: trio.abc.ReceiveStream | None, max_bytes: int) -> str:
    """Up to `max_bytes` of `stream`, waiting at most a second (for error messages)."""
    if stream is None:
        return ""
    data = b""
    with trio.move_on_after(1.0):
        while len(data) < max_bytes and (chunk := await stream.receive_some(max_bytes)):
            data += chunk
    return data[:max_bytes].decode("utf-8", "replace").strip()


def _outcome(
    limits: Limits,
    capture: OutputCapture,
    stdout: ResultSplitter,
    *,
    timed_out: bool,
    disk_hit: bool,
    returncode: int | None,
    is_out_of_memory: Callable[[ErrorInfo], bool],
) -> Outcome:
    """How the execution ended, from what was observed. Limits come first: the
    sandbox was killed for them, so what it would have returned is unknown."""
    outcome = outcomes.captured(capture)
    if capture.limit_hit:
        return outcomes.output_limit(outcome, limits)
    if disk_hit:
        return outcomes.disk_limit(outcome, limits)
    if stdout.payload_too_large:
        return outcomes.result_too_large(outcome, limits)
    if timed_out:
        return outcomes.timed_out(outcome, limits)
    if stdout.payload is not None:
        return outcomes.answered(outcome, stdout.payload, is_out_of_memory, "Deno worker")
    return _from_exit(outcome, returncode, limits)


def _from_exit(outcome: Outcome, returncode: int | None, limits: Limits) -> Outcome:
    """No result line: the program called Deno.exit(), or the process died."""
    if returncode == UNREPORTED_EXIT:
        return outcomes.failed(
            outcome,
            Status.ERROR,
            "Error",
            "the sandbox's standard output was closed (Deno.stdout.close(), by this program "
            "or by code an earlier step of its session left running), so its answer could "
            "not be reported; leave stdout open",
        )
    if returncode is not None and returncode >= 0:
        outcome.exit_code = returncode
        if returncode == 0:
            return outcome
        return outcomes.failed(
            outcome,
            Status.ERROR,
            "Exit",
            f"the program exited with code {returncode} before returning a result",
        )
    if returncode == -signal.SIGXFSZ:  # a file past `_limit_file_size`
        return outcomes.disk_limit(outcome, limits)
    if returncode is not None and any(sign in outcome.stderr for sign in OOM_SIGNS):
        outcome.stderr = _cut_oom_report(outcome.stderr)
        return outcomes.memory_limit(outcome, limits)
    return outcomes.process_ended(outcome, returncode, limits, "Deno sandbox")


def _cut_oom_report(stderr: str) -> str:
    """stderr without V8's out-of-memory report (GC log, C stack trace)."""
    cuts = [stderr.find(start) for start in OOM_REPORT_STARTS]
    found = [cut for cut in cuts if cut >= 0]
    return stderr[: min(found)] if found else stderr


def _room_for_a_worker() -> bool:
    """Whether the machine has memory for one more idle worker (`GROW_FLOOR_BYTES`)."""
    available = memory_available_bytes()
    return available is None or available > GROW_FLOOR_BYTES
