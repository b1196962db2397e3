"""The pyodide executor: Python programs in Pyodide (CPython 3.14 on WebAssembly) under Deno.

Programs run in Pyodide worker processes (`shims/pyodide_worker.js`, driven through
`pyodide_host.PyodideHost`). Each compiled Pyodide's WebAssembly once and runs programs
one at a time, each in a fresh interpreter of its own: a Web Worker restored from a
memory snapshot, with no permission at all, ended after its one program. A pool
(`pyodide_pool.HostPool`) keeps `pool_size` such processes, each with its next
interpreter made ahead, after its last program; a program takes a process whose
interpreter is ready, or waits for one. That wait is queueing: it is reported in
`queue_ms` and bounded by the queue timeout, and the program's `timeout_ms` counts from
the moment its interpreter takes it.

The sandbox is Deno's, as on the Deno executor: no permission but reading Pyodide's
files and these scripts, and the callback address. The process connects to that
address and reads its files as it starts, then gives up everything but reading the two
JavaScript modules an interpreter loads; tool calls go through the process under each
program's own session token, which the program never holds. A process whose program
timed out, was stopped, hit a limit or crashed is killed and replaced; see
`pyodide_host` for what else ends one.

A session (`open_session`, see `pyodide_sessions`) takes a process from the pool for
keeps and runs its steps in that process's one interpreter; it goes the same way as a
fresh program (`host_for`, `run_on`), with the interpreter kept after each step.

Pyodide comes from npm, pinned with integrity by `shims/pyodide/package-lock.json`,
installed once with the machine's npm into `<cache_dir>` (see `npm.install_locked`);
the time-zone database is the pinned `tzdata` package, zipped once beside it, with the
operator's packages added when there are any (`pyodide_packages`); and the memory
snapshot is built once from both. The executor is unavailable, with the reason,
until that is done or if it fails.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.resources
import logging
import os
import re
import resource
import secrets
import shutil
import zipfile
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import trio

from conduit.core.errors import ExecutorError, Overloaded, RuntimeMissing, SandboxCrashed
from conduit.executors.base import (
    CallbackAddress,
    ErrorInfo,
    ExecutorInfo,
    Job,
    Limits,
    Outcome,
    SessionSpec,
    ToolBridge,
    python_request,
)
from conduit.executors.deno import (
    DENO_ENV,
    SANDBOX_FLAGS,
    callback_sockets,
    find_deno,
    permission_flags,
    read_version,
)
from conduit.executors.npm import install_locked, locked_version
from conduit.executors.os_sandbox import (
    NOT_PROBED,
    Confinement,
    SandboxChoice,
    Spawn,
    choose,
    worker_run,
)
from conduit.executors.packages import project_names, requirements_key
from conduit.executors.process import (
    DEFAULT_FILE_BYTES,
    DEFAULT_OPEN_FILES,
    Limited,
    kill_process_group,
    minimal_env,
    sandbox_process_options,
)
from conduit.executors.pyodide_host import IDLE_CPU_S, Kept, PyodideHost, set_soft_limit
from conduit.executors.pyodide_packages import ensure_packages_zip, guest_environment
from conduit.executors.pyodide_pool import HostPool
from conduit.executors.pyodide_sessions import PyodideSession, SessionRegistry
from conduit.executors.wasm_build import BuildError, shim_path

__all__ = ["PyodideExecutor"]

log = logging.getLogger(__name__)

SHIM_DIR = "pyodide"
PACKAGE = "pyodide"
# The files a worker process reads as it starts; nothing else of the package is needed.
PYODIDE_FILES = ("pyodide.asm.wasm", "python_stdlib.zip", "pyodide-lock.json")
# What an interpreter imports as it loads: the process keeps reading these.
PYODIDE_MODULES = ("pyodide.mjs", "pyodide.asm.mjs")
PROGRAM_MODULE = "python_program.py"
WORKER_SCRIPT = "pyodide_worker.js"
SNAPSHOT_SCRIPT = "pyodide_snapshot.js"
# The packages' compiler: the script that loads an interpreter for it, and its program.
COMPILE_SCRIPT = "pyodide_compile.js"
COMPILE_PROGRAM = "pyodide_compile.py"
# The interpreter's own scripts, read each time one starts (a Web Worker's modules need
# read permission; the worker process's own, imported as it starts, do not).
INTERPRETER_SCRIPTS = (
    "pyodide_interpreter.js",
    "pyodide_boot.js",
    "pyodide_files.js",
    "worker_io.js",
)
# The IANA time-zone database, a pinned dependency, zipped for the interpreters.
TIME_ZONES = "tzdata"
# Deno flags beyond the Deno executor's sandbox: an interpreter is a Web Worker started
# with no permission (the option is unstable). Code caching stays on: a process caches
# Pyodide's JavaScript once, in its own DENO_DIR, for all its interpreters.
FLAGS = (
    *(flag for flag in SANDBOX_FLAGS if flag != "--no-code-cache"),
    "--unstable-worker-options",
)
# Each interpreter is a new V8 isolate that runs Pyodide's ~1.2 MB of JavaScript once:
# compiled eagerly, all of it is in the code cache and later isolates compile none; the
# optimizing tiers would compile, in the background, code that runs once (Python's
# WebAssembly still tiers up); a 32 MB young generation holds what loading allocates
# without a dozen collections. Together a sixth of an interpreter's CPU.
V8_FLAGS = "--no-lazy,--no-opt,--no-maglev,--min-semi-space-size=32"
# Enough of the requirements' digest in a snapshot's name to tell package lists apart.
PACKAGES_KEY_CHARS = 12
# Building the snapshot loads Pyodide once (seconds); past this it is hung.
SNAPSHOT_TIMEOUT_S = 180
# Compiling packages as large as sympy's thousand modules takes a minute or two.
COMPILE_TIMEOUT_S = 300
# A worker process compiles Pyodide and makes its first interpreter in ~1 s on an idle
# machine, several on a loaded one; a later interpreter takes ~0.2 s of CPU.
START_TIMEOUT_S = 60.0
# Two processes, so one makes its next interpreter while the other runs a program.
DEFAULT_POOL_SIZE = 2
# Processes started beyond the pool for programs that wait on tools or sleeps while
# every process is busy; each holds ~0.25 GB, so this bounds the executor to ~2 GB.
MAX_PROCESSES = 8
# Sessions open at once, each holding a process of its own beyond the pool's while it
# has state (~0.25 GB and its memory limit).
DEFAULT_MAX_SESSIONS = 4


class PyodideExecutor:
    """Runs Python programs in Pyodide, each in a fresh interpreter (see the module).

    `cache_dir` is a directory the daemon owns (each worker process's private DENO_DIR
    is made there, and deleted with it); Pyodide is installed under `install_dir`
    (`cache_dir` by default). `binary` overrides where Deno is looked for (see
    `deno.find_deno`). `memory_mb` is the JavaScript heap limit of every interpreter;
    each program's own `memory_mb` bounds the memory it may add (a session's, all its
    steps together). `callback`, when set, is the one address the processes may connect
    to. At most `max_sessions` sessions are open at once (see `pyodide_sessions`), and
    at most `max_processes` processes run programs (`pool_size` kept warm, more while
    programs wait on tools).
    `packages` are requirements of pure-Python packages the programs may import,
    canonical (see `core.requirements.parse_requirement`), resolved once (`pyodide_packages`).
    """

    name = "pyodide"
    languages = frozenset({"python"})

    def __init__(
        self,
        *,
        cache_dir: str | os.PathLike[str],
        install_dir: str | os.PathLike[str] | None = None,
        work_dir: str | os.PathLike[str] | None = None,
        binary: str | os.PathLike[str] | None = None,
        pool_size: int = DEFAULT_POOL_SIZE,
        memory_mb: int = Limits().memory_mb,
        callback: CallbackAddress | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        max_processes: int = MAX_PROCESSES,
        packages: Sequence[str] = (),
        os_sandbox: str = "required",
        bwrap: str | None = None,
    ) -> None:
        self._cache_dir = Path(cache_dir)
        self._requirements = tuple(sorted(set(packages)))
        # The packages installed for the programs, by name, once resolved.
        self._packages: dict[str, str] = {}
        self._install_dir = Path(install_dir) if install_dir is not None else self._cache_dir
        self._work_dir = Path(work_dir) if work_dir is not None else self._cache_dir / "work"
        self._configured_binary = binary
        self._deno = find_deno(binary)
        self._memory_mb = memory_mb
        self._callback = callback
        self._permission_flags = permission_flags(callback)
        self._start_timeout_s = start_timeout_s
        self._pyodide_version = locked_version(SHIM_DIR, PACKAGE)
        self._pyodide_dir: Path | None = None
        self._time_zones: Path | None = None
        self._snapshot: Path | None = None
        self._deno_version: str | None = None
        self._pool = HostPool(
            self._run_host,
            size=pool_size,
            max_size=max(pool_size, max_processes),
            recycle_timeout_s=start_timeout_s,
        )
        self._sessions = SessionRegistry(max_sessions)
        self._reason: str | None = "the executor has not been started (serve() has not run)"
        self._settled = trio.Event()
        # What the worker processes run in (see `os_sandbox`), once probed.
        self._os_sandbox_mode = os_sandbox
        self._bwrap = bwrap
        self._os_sandbox: SandboxChoice = NOT_PROBED

    def __repr__(self) -> str:
        state = "available" if self._reason is None else f"unavailable: {self._reason}"
        return f"<PyodideExecutor ({state}) {self._pool!r}>"

    # -- lifecycle ---------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Install Pyodide and build its snapshot (once), then keep the pool until
        cancelled.

        Calls `task_status.started()` at once; the executor is unavailable, with the
        reason in `info()`, while that is done, and stays so if it cannot be. Never
        raises for a missing Deno or a failed install.
        """
        self._reason = "Pyodide is being installed (seconds, on first start only)"
        task_status.started()
        self._reason = await self._prepare()
        if self._reason is not None:
            log.warning("pyodide executor unavailable: %s", self._reason)
            self._settled.set()
            await trio.sleep_forever()
        async with trio.open_nursery() as nursery:
            await nursery.start(self._pool.run)
            # A program may come now: it waits for the first interpreter, as queueing.
            self._settled.set()

    async def wait_ready(self) -> bool:
        """Wait until `serve` knows whether the executor can run jobs; whether it can."""
        await self._settled.wait()
        return self._reason is None

    @property
    def preparing(self) -> bool:
        """Whether `wait_ready` would still wait."""
        return not self._settled.is_set()

    async def _prepare(self) -> str | None:
        """Everything a worker process needs, made once; why the executor cannot run, or
        None."""
        deno = self._deno
        if deno is None:
            where = (
                f"at the configured path {self._configured_binary}"
                if self._configured_binary is not None
                else "next to the Python interpreter or on PATH"
            )
            return (
                f"Deno was not found {where}; install it (pip install deno) or configure its path"
            )
        try:
            await trio.to_thread.run_sync(self._prepare_dirs)
            installed = await trio.to_thread.run_sync(
                lambda: install_locked(
                    SHIM_DIR, self._install_dir, expect=_package_file("pyodide.mjs")
                )
            )
            self._pyodide_dir = (installed / "node_modules" / PACKAGE).resolve()
            time_zones = await trio.to_thread.run_sync(_zip_time_zones, self._install_dir)
        except (BuildError, OSError) as exc:
            return f"Pyodide could not be installed: {exc}"
        try:
            self._time_zones = await trio.to_thread.run_sync(self._add_packages, time_zones)
        except (BuildError, OSError) as exc:
            return f"the pyodide packages could not be installed: {exc}"
        try:
            self._deno_version = await read_version(deno, self._work_dir)
            self._snapshot = await self._ensure_snapshot(deno)
        except ExecutorError as exc:
            return str(exc)
        except OSError as exc:
            return f"the Pyodide snapshot could not be built: {exc}"
        self._os_sandbox = await choose(
            self.name, self._os_sandbox_mode, self._bwrap, deno, self._work_dir
        )
        return self._os_sandbox.refusal

    def _add_packages(self, time_zones: Path) -> Path:
        """The zip the interpreters import from: `time_zones`, plus the packages when
        there are any (blocking: pip may run)."""
        if not self._requirements:
            return time_zones
        assert self._pyodide_dir is not None
        guest = guest_environment(self._pyodide_dir)
        compiler = hashlib.sha256()
        for part in self._compiler_sources():
            compiler.update(part.read_bytes())
        zipped, packages = ensure_packages_zip(
            self._install_dir,
            self._requirements,
            guest,
            time_zones,
            self._compile_zip,
            compiler.hexdigest(),
        )
        self._packages = project_names(packages)
        return zipped

    def _compiler_sources(self) -> list[Path]:
        """What the packages' bytecode depends on: Pyodide's version and the compiler."""
        scripts = (COMPILE_SCRIPT, COMPILE_PROGRAM, *INTERPRETER_SCRIPTS)
        return [shim_path(f"{SHIM_DIR}/package-lock.json"), *map(shim_path, scripts)]

    def _compile_zip(self, sources: Path, compiled: Path) -> None:
        """Compile the zip of the packages' sources `sources` into the zip `compiled`,
        in an interpreter of this Pyodide (see shims/pyodide_compile.js): the bytecode
        must be its CPython's, which the host's may not be. Blocking: call it from a
        worker thread of the executor's Trio run. Raises BuildError if it fails."""
        assert self._deno is not None
        readable = [*self._pyodide_files(), *self._compiler_sources()[1:], sources]
        command = [
            self._deno,
            "run",
            *FLAGS,
            _read_flag(readable),
            f"--allow-write={compiled}",
            str(shim_path(COMPILE_SCRIPT)),
            str(self._pyodide_dir),
            str(shim_path(COMPILE_PROGRAM)),
            str(sources),
            str(compiled),
        ]
        try:
            trio.from_thread.run(self._run_builder, command, COMPILE_TIMEOUT_S)
        except (OSError, trio.TooSlowError) as exc:
            raise BuildError(f"the packages could not be compiled: {exc}") from exc

    def _prepare_dirs(self) -> None:
        self._cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._work_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Left behind if the daemon died with worker processes running.
        for stale in self._cache_dir.glob("host-*"):
            shutil.rmtree(stale, ignore_errors=True)

    async def _ensure_snapshot(self, deno: str) -> Path:
        """The memory snapshot interpreters start from, built once; keyed by everything
        it holds (Pyodide, the contract, the scripts that load it, the time zones and
        packages). A new one deletes those it supersedes: of the same package list.

        Built by a trusted Deno process that may write only the new file. Raises
        RuntimeMissing if it cannot be built.
        """
        assert self._pyodide_dir is not None
        assert self._time_zones is not None
        digest = hashlib.sha256()
        sources = [shim_path(f"{SHIM_DIR}/package-lock.json"), shim_path(PROGRAM_MODULE)]
        sources += [shim_path(name) for name in (SNAPSHOT_SCRIPT, *INTERPRETER_SCRIPTS)]
        for part in (*sources, self._time_zones):
            digest.update(part.read_bytes())
        group = "snapshot"
        if self._requirements:
            group += f"-packages-{requirements_key(self._requirements)[:PACKAGES_KEY_CHARS]}"
        target = self._install_dir / f"{group}-{digest.hexdigest()[:16]}.bin"
        if target.is_file():
            return target.resolve()
        partial_file = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        readable = [*self._pyodide_files(), shim_path(PROGRAM_MODULE), self._time_zones]
        readable += [shim_path(name) for name in (SNAPSHOT_SCRIPT, *INTERPRETER_SCRIPTS)]
        command = [
            deno,
            "run",
            *FLAGS,
            _read_flag(readable),
            f"--allow-write={partial_file}",
            str(shim_path(SNAPSHOT_SCRIPT)),
            str(self._pyodide_dir),
            str(shim_path(PROGRAM_MODULE)),
            str(self._time_zones),
            str(partial_file),
        ]
        started = trio.current_time()
        try:
            await self._run_builder(command)
            os.replace(partial_file, target)
        except (OSError, trio.TooSlowError) as exc:
            partial_file.unlink(missing_ok=True)
            raise RuntimeMissing(f"the Pyodide snapshot could not be built: {exc}") from exc
        superseded = re.compile(rf"{re.escape(group)}-[0-9a-f]{{16}}\.bin")
        for old in self._install_dir.iterdir():
            if old != target and superseded.fullmatch(old.name):
                old.unlink(missing_ok=True)
        log.info("Pyodide snapshot built in %.1f s", trio.current_time() - started)
        return target.resolve()

    async def _run_builder(self, command: list[str], timeout_s: float = SNAPSHOT_TIMEOUT_S) -> None:
        deno_dir = self._cache_dir / f"host-{secrets.token_hex(8)}"
        env = minimal_env({**DENO_ENV, "DENO_DIR": str(deno_dir)})
        try:
            with trio.fail_after(timeout_s):
                done = await trio.run_process(
                    command,
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                    deliver_cancel=kill_process_group,
                    **sandbox_process_options(cwd=self._work_dir, env=env),
                )
        finally:
            await trio.to_thread.run_sync(partial(shutil.rmtree, deno_dir, ignore_errors=True))
        if done.returncode != 0:
            raise OSError(done.stderr.decode("utf-8", "replace").strip()[-500:])

    @property
    def unavailable_reason(self) -> str | None:
        return self._reason

    def info(self) -> ExecutorInfo:
        """Availability, versions and the pool's statistics."""
        deno = f" on Deno {self._deno_version}" if self._deno_version else ""
        pool = self._pool.statistics()
        pool["memory_mb"] = self._memory_mb
        pool["snapshot"] = str(self._snapshot) if self._snapshot else None
        pool["sessions"] = self._sessions.statistics()
        pool["os_sandbox"] = self._os_sandbox.state()
        return ExecutorInfo(
            name=self.name,
            languages=tuple(sorted(self.languages)),
            available=self._reason is None,
            version=f"Pyodide {self._pyodide_version}{deno}",
            reason=self._reason,
            pool=pool,
            packages=dict(self._packages),
        )

    # -- worker processes --------------------------------------------------------------

    def _pyodide_files(self) -> list[Path]:
        assert self._pyodide_dir is not None
        return [self._pyodide_dir / name for name in (*PYODIDE_FILES, *PYODIDE_MODULES)]

    def _confined(self, command: list[str], deno_dir: Path) -> Spawn | None:
        """`command` inside the operating-system sandbox, if there is one: it sees
        Pyodide's files, the shims and its DENO_DIR, and the callback socket alone."""
        sandbox = self._os_sandbox.sandbox
        if sandbox is None:
            return None
        assert self._pyodide_dir is not None
        assert self._snapshot is not None
        assert self._time_zones is not None
        confinement = Confinement(
            cwd=self._work_dir,
            read_only=(
                self._work_dir,
                shim_path(WORKER_SCRIPT).parent,
                self._pyodide_dir,
                self._snapshot,
                self._time_zones,
            ),
            writable=(deno_dir,),
            sockets=callback_sockets(self._callback),
        )
        return sandbox.spawn(command, confinement)

    def _command(self) -> list[str]:
        """`deno run` of a worker process. It may read what it loads, and gives up all
        of it but the interpreter's modules and scripts once started."""
        assert self._deno is not None
        assert self._pyodide_dir is not None
        assert self._snapshot is not None
        assert self._time_zones is not None
        kept = [self._pyodide_dir / name for name in PYODIDE_MODULES]
        kept += [shim_path(name) for name in INTERPRETER_SCRIPTS]
        used_up = [self._pyodide_dir / name for name in PYODIDE_FILES]
        used_up += [self._snapshot, self._time_zones]
        return [
            self._deno,
            "run",
            *FLAGS,
            *self._permission_flags,
            _read_flag([*kept, *used_up]),
            f"--v8-flags=--max-old-space-size={self._memory_mb},{V8_FLAGS}",
            str(shim_path(WORKER_SCRIPT)),
            str(self._pyodide_dir),
            str(self._snapshot),
            str(self._time_zones),
            *(str(path) for path in used_up),
        ]

    async def _run_host(self, *, task_status: trio.TaskStatus[PyodideHost]) -> None:
        """Run one worker process until it exits (the pool's `start`).

        Calls `task_status.started(host)` once its first interpreter is ready. Raises
        RuntimeMissing if Deno cannot be run, SandboxCrashed if the process does not
        start. Its private DENO_DIR is deleted after it has exited.
        """
        deno_dir = self._cache_dir / f"host-{secrets.token_hex(8)}"
        try:
            deno_dir.mkdir(mode=0o700)
        except OSError as exc:
            raise SandboxCrashed(f"cannot create a DENO_DIR for a worker: {exc}") from exc
        try:
            failure: ExecutorError | None = None
            async with trio.open_nursery() as nursery:
                try:
                    host = await self._start_host(nursery, deno_dir)
                except ExecutorError as exc:
                    failure = exc  # raised below, outside the nursery's exception group
                else:
                    task_status.started(host)
            if failure is not None:
                raise failure
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(partial(shutil.rmtree, deno_dir, ignore_errors=True))

    async def _start_host(self, nursery: trio.Nursery, deno_dir: Path) -> PyodideHost:
        env = minimal_env({**DENO_ENV, "DENO_DIR": str(deno_dir)})
        options = sandbox_process_options(cwd=self._work_dir, env=env)
        command = self._command()
        spawn = self._confined(command, deno_dir)
        try:
            process: trio.Process = await nursery.start(worker_run(command, spawn, options))
        except OSError as exc:
            if spawn is not None:
                spawn.close()
            raise RuntimeMissing(f"cannot start Deno ({self._deno}): {exc}") from exc
        host = PyodideHost.of(process, deno_dir)
        try:
            if spawn is not None:
                await _start_runtime(host, spawn)
            _limit_host(host.limited)
            await host.send({"callback": _address(self._callback)})
            await host.wait_ready(self._start_timeout_s)
        except ProcessLookupError as exc:
            await host.aclose()
            raise SandboxCrashed("a Pyodide worker exited right after starting") from exc
        except BaseException:
            await host.aclose()
            raise
        return host

    # -- jobs --------------------------------------------------------------------------

    async def run(self, job: Job, bridge: ToolBridge) -> Outcome:
        """Run `job` in a fresh interpreter and report how it ended.

        Waiting for an interpreter is the outcome's `queue_s`, at most
        `job.queue_timeout_s`; raises Overloaded if none was ready by then, and
        SandboxCrashed if none can be started. A failing
        program is an Outcome, never an exception. Raises RuntimeMissing if the
        executor is unavailable. If cancelled, the program's process is killed before
        `trio.Cancelled` propagates.
        """
        host, waited_s = await self.host_for(job, keep=False)
        reusable = False
        try:
            outcome, reusable = await self.run_on(host, job, bridge, None)
        finally:
            self._pool.release(host, reusable)
        outcome.queue_s += waited_s
        return outcome

    async def open_session(self, spec: SessionSpec) -> PyodideSession:
        """A session of its own interpreter, kept across steps (see `pyodide_sessions`);
        its process is taken when its first step comes. Raises RuntimeMissing if the
        executor is unavailable, Overloaded if it holds its most sessions already."""
        self._check_runnable(spec.language)
        return self._sessions.open(spec, self)

    # -- the run path fresh programs and session steps share -------------------------

    async def host_for(self, job: Job, *, keep: bool) -> tuple[PyodideHost, float]:
        """A host whose fresh interpreter is ready for `job`, and how long it waited;
        with `keep`, the pool's no more (a session's). Raises as `run`."""
        self._check_runnable(job.language)
        began = trio.current_time()
        take = self._pool.take if keep else self._pool.acquire
        host = await take(job.queue_timeout_s)
        if host is None:
            failure = self._pool.last_failure
            if failure is not None and not self._pool.processes:
                raise SandboxCrashed(f"no Pyodide worker process could be started: {failure}")
            raise Overloaded(
                f"the pyodide executor is busy: no interpreter was ready within "
                f"{job.queue_timeout_s:g} s; retry later, or raise executors.pyodide.pool_size"
            )
        return host, trio.current_time() - began

    async def run_on(
        self, host: PyodideHost, job: Job, bridge: ToolBridge, kept: Kept | None
    ) -> tuple[Outcome, bool]:
        """Run `job` on `host`'s interpreter (kept after it, as a session's step, with
        `kept`); its outcome and whether the host may go on. The caller kills the host
        if this is cancelled."""
        # Read only when it is used: a bridge may mint the token on first read.
        token = bridge.session_token if bridge.callback is not None else None
        request = python_request(job)
        if kept is not None:
            request["session"] = True
        return await host.run(job, request, token, self.is_out_of_memory, kept)

    def _check_runnable(self, language: str) -> None:
        if self._reason is not None:
            raise RuntimeMissing(f"the pyodide executor is unavailable: {self._reason}")
        if language not in self.languages:
            raise ValueError(f"the pyodide executor does not run {language!r}")

    def is_out_of_memory(self, error: ErrorInfo) -> bool:
        return error.type == "MemoryError"


async def _start_runtime(host: PyodideHost, spawn: Spawn) -> None:
    """Learn Deno's own process in the sandbox `spawn` started; SandboxCrashed (with
    what bwrap said) if it reported none."""
    try:
        await host.start_runtime(spawn)
    except OSError as exc:
        raise SandboxCrashed(f"a Pyodide worker's sandbox failed to start: {exc}") from None


def _limit_host(process: Limited) -> None:
    """A new worker process's limits: no core dumps, bounded files and descriptors, and
    a CPU budget for starting; each program's own limits are set as it is handed over
    (`PyodideHost.run`). The hard limits stay where they are so those can be raised."""
    for which, value in (
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_FSIZE, DEFAULT_FILE_BYTES),
        (resource.RLIMIT_NOFILE, DEFAULT_OPEN_FILES),
    ):
        resource.prlimit(process.pid, which, (value, value))
    set_soft_limit(process, resource.RLIMIT_CPU, IDLE_CPU_S)


def _address(callback: CallbackAddress | None) -> dict[str, Any] | None:
    if callback is None:
        return None
    return {
        "unix_path": callback.unix_path,
        "tcp_host": callback.tcp_host,
        "tcp_port": callback.tcp_port,
        "max_message_bytes": callback.max_message_bytes,
    }


def _read_flag(paths: list[Path]) -> str:
    if any("," in str(path) for path in paths):
        raise RuntimeMissing("Pyodide's paths must not contain commas (Deno's flag separator)")
    return f"--allow-read={','.join(str(path) for path in paths)}"


def _zip_time_zones(install_dir: Path) -> Path:
    """The tzdata package zipped for the interpreters' sys.path, made once per version.

    Raises BuildError if tzdata is not installed.
    """
    try:
        version = importlib.metadata.version(TIME_ZONES)
    except importlib.metadata.PackageNotFoundError:
        raise BuildError(f"{TIME_ZONES} is not installed; reinstall conduit") from None
    target = install_dir / f"tzdata-{version}.zip"
    if target.is_file():
        return target.resolve()
    partial_file = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    source = importlib.resources.files(TIME_ZONES)
    with importlib.resources.as_file(source) as root, zipfile.ZipFile(partial_file, "w") as out:
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                # Fixed times: the same package makes the same zip, and the same snapshot.
                info = zipfile.ZipInfo(f"{TIME_ZONES}/{path.relative_to(root).as_posix()}")
                out.writestr(info, path.read_bytes())
    os.replace(partial_file, target)
    return target.resolve()


def _package_file(name: str) -> str:
    return f"node_modules/{PACKAGE}/{name}"
