"""What the Wasmtime executors share: a guest component, a fresh instance per execution.

A subclass names its guest (`recipe`, see `wasm_guests`), its languages and how a job
becomes the guest's JSON request; everything else is here. `serve` builds the
component (or finds it in the cache) and loads its compiled form (see
`_wasmtime.load_component`) in a worker thread, and the executor reports itself
unavailable, with the reason, until that is done or if it fails.

Every execution gets a brand-new instance in a brand-new `Store`, closed after its
one program: nothing survives from one execution to the next. The instances are made
ahead (`wasm_instances`) by runner threads (`wasm_runners`), each of which keeps one
ready and runs the execution handed to it in its own thread. The store has no
preopened directory but its working directory, no environment, no arguments, no
sockets; its linear memory is
capped by the store's limits; its stdout and stderr go into an `OutputCapture` as the
guest writes them. WASI's clocks and random numbers are Wasmtime's defaults: wall and
monotonic clocks (a program can time itself; it can already count epoch ticks by
looping) and a random source (what `random`, `uuid` and `Math.random` seed from).

Each instance has a working directory of its own (`scratch`), empty when made and
deleted with the store: the guest sees it as its current directory (preopened), or
reaches it through `fs/*` host calls the runner serves itself (`wasm_fs`). A job's
input files are written there (`workdir`, never through a link) just before its guest
runs, and what it left under `out/` is read back just after, before the answer is
handed over; what the directory holds is capped by `limits.disk_mb`.

Each execution takes a ready runner, then a CPU slot (`wasm_slots`: one per core,
held only while the guest runs code, not while it waits on a tool or a timer), and
hands the runner the execution; waiting for either is queueing, not the program's
time. The guest's `host-call` import runs in the runner's thread and reaches the Trio
side with `trio.from_thread.run` (`bridge.request`, in a task of its own), so a tool
call goes through the daemon's one dispatcher under the execution's session. A guest
with an event loop (wasm-js) starts its calls and collects their answers later instead
(`calls/wait`, see `wasm_guest_calls`), so that it runs on while they are out. When the
job has an `on_output` hook, each piece of output the
guest writes is also handed, in order and without waiting, to a task on the Trio side
that awaits the hook (`_LiveOutput`); without one, nothing is done for streaming. A
timeout, a stop (`job.stop` or cancellation) or an exhausted output budget interrupts
the guest at its next epoch tick (`_wasmtime.Interrupt`).

A session (`open_session`, see `wasm_sessions`) is the exception, asked for: it holds a
runner and the instance it made, and runs its steps there one after the other, each
with a new execution of its own (its limits, interrupt, output and CPU slot, through
the same path as `run`), so that what a program defines is there for the next step.
A step after which the instance cannot go on (it trapped) has the session start the
next in a fresh one, and says so (`Outcome.session_reset`). Sessions are capped
(MAX_SESSIONS) below the runners, so that fresh executions always find some.

The runner hands the guest's answer to `run` as soon as it has it, and only then
closes the store (resetting its pool slot, see `_wasmtime`) and makes its next
instance: that is real work, and no caller needs to wait for it. A runner whose
execution was given up on (its guest blocked past the grace, or `run` cancelled)
retires when its guest comes back, and a new runner takes its place at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os
import re
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import trio
import wasmtime
import wasmtime.component

from conduit.core import jsontext
from conduit.core.errors import Overloaded, RpcError, RuntimeMissing, SandboxCrashed
from conduit.core.files import FileData
from conduit.core.left_calls import LeftCalls
from conduit.executors import _wasmtime, outcomes, thread_priority, wasm_output, workdir
from conduit.executors.base import (
    ErrorInfo,
    ExecutorInfo,
    Job,
    Limits,
    Outcome,
    SessionSpec,
    Status,
    StopSignal,
    ToolBridge,
)
from conduit.executors.output import OutputCapture, StreamName
from conduit.executors.scratch import ScratchDirs
from conduit.executors.wasm_build import (
    BuildError,
    BuildProgress,
    BuiltComponent,
    GuestRecipe,
    ensure_component,
)
from conduit.executors.wasm_calls import GuestEnded, add_string_import
from conduit.executors.wasm_clock import BoundedClock, StoreClock
from conduit.executors.wasm_fs import METHOD_PREFIX, FsError, GuestFiles
from conduit.executors.wasm_guest_calls import (
    INTERNAL_ERROR,
    PIPE_METHOD,
    WAIT_METHOD,
    Answer,
    GuestCalls,
    StartedCall,
    WaitRequest,
    answers_text,
    rpc_error,
)
from conduit.executors.wasm_instances import (
    MAX_MEMORY_MIB,
    MIB,
    BaseMemoryRecord,
    Instance,
    Instances,
)
from conduit.executors.wasm_lingering import LingerBudget
from conduit.executors.wasm_moves import MOVE_CHECK_EVERY_S, MoveWatch
from conduit.executors.wasm_runners import Runner, Runners
from conduit.executors.wasm_sessions import SessionSandbox, Step, WasmSession
from conduit.executors.wasm_slots import CpuSlots, GuestInterrupt, Seat

__all__ = ["ProgramRejected", "WasmExecutor"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# Under the cache directory: each executor's executions' scratch directories.
SCRATCH_DIR = "scratch"
# The import the guest calls (shims/world.wit).
HOST_CALL_IMPORT = "host-call"
# The host-call by which a guest ends its run before the program settles, its answer
# given: an error nothing could catch (a timer's or a listener's, see guest.js).
UNCAUGHT_METHOD = "program/uncaught"
# Guests running code at once (CPU slots, see `wasm_slots`): one per core. A guest
# waiting on a tool, a sleep or a timer holds none.
CONCURRENT_EXECUTIONS = os.cpu_count() or 1
# Runners kept, each with an instance made ahead: one more than run at once, so that a
# runner is ready while another is still closing its last store and making its next.
RUNNERS = CONCURRENT_EXECUTIONS + 1
# Runners at most: one per execution under way, waits included (see `wasm_runners`),
# well above the daemon's default admission cap. Each holds a thread and a store.
MAX_RUNNERS = 64
# Sessions held at most (see `wasm_sessions`): each holds a runner, so no more than half
# of MAX_RUNNERS, and fresh executions always find runners; one more is refused.
MAX_SESSIONS = MAX_RUNNERS // 2
# How long opening a session may wait for a runner to be ready.
SESSION_OPEN_WAIT_S = 10.0
# How long closing a session waits for its thread to close the store: a millisecond,
# unless a step's guest is blocked in a WASI call (then it is left to finish alone).
SESSION_CLOSE_WAIT_S = 1.0
# The answer to a tool call a program sent only as it answered, past its tool calls.
DROPPED_CALL = "not made: the program had answered, and had no tool calls left"
# The trap of a step handed to a session closed meanwhile: it never ran.
SESSION_CLOSED = "the session was closed before the step ran"
# How long a guest whose time is up (or that was stopped) may take to come back before
# its execution is reported without it: many epoch ticks, so only a thread blocked in a
# WASI call (a wait the deadline ends, see `wasm_clock`) is ever left behind.
LINGER_GRACE_S = 0.25
# Runner threads beyond MAX_RUNNERS that may be left finishing after their execution
# was reported (see `wasm_lingering`); at the cap, new executions are refused, not queued.
MAX_LINGERING_THREADS = 32
# A component that was built but did not load (Wasmtime or the system refusing
# something, perhaps for a moment) is loaded again while the executor serves: first
# after LOAD_RETRY_FIRST_S, then twice as long each time, up to LOAD_RETRY_MAX_S. A
# failed build is not tried again: its reason says what to fix, then restart.
LOAD_RETRY_FIRST_S = 5.0
LOAD_RETRY_MAX_S = 300.0
# The wall time a build step run in the guest (`run_trusted`) may take: compiling a
# large package (sympy's ~1,000 modules) takes tens of seconds; this bounds a hung one.
BUILD_PROGRAM_TIMEOUT_S = 600.0
# Programs up to this many characters are read on the event loop: a microsecond-scale
# job; a larger one may take a parse of hundreds of milliseconds.
INLINE_REQUEST_CHARS = 4096
# The execution whose guest this thread is running, for its `host-call` import: a
# runner runs one guest at a time.
_RUNNING = threading.local()
# A frame of the wasm backtrace Wasmtime puts in a trap's text: "  12: 0x1ac945 - ...".
_BACKTRACE_LINE = re.compile(r"\s*\d+:\s+0x[0-9a-f]+ - ")
# Trap messages that mean the guest ran out of linear memory rather than failed.
OUT_OF_MEMORY_SIGNS = ("out of memory", "memoryerror", "cannot allocate", "memory allocation")


class _State:
    """What the executor is doing; shown in `info()`."""

    NOT_STARTED = "not started"
    BUILDING = "building"
    READY = "ready"
    FAILED = "failed"


# What the runner hands back: (the guest's answer, None) or (None, the trap).
_Answer = tuple[str | None, str | None]


@dataclass(slots=True)
class _Execution:
    """One run's host side: shared by `run` (Trio) and the runner running it.

    The thread reads `bridge` and `interrupt` (in the `host-call` import) and hands
    back its answer with `token.run_sync_soon(execution.answer, ...)`; `answer` runs
    on the Trio side and wakes `run` by setting `waiter`, the event it waits for.

    The guest holds a CPU slot (`interrupt.seat`, see `wasm_slots`) only while it runs
    code. What it spends waiting for a runner or a slot is queueing (`queue_s`, at most
    `queue_limit_s` in all), not its own time: its deadline (and its clock, where the
    host keeps it) moves on by each such wait.
    """

    bridge: ToolBridge
    interrupt: GuestInterrupt
    token: trio.lowlevel.TrioToken
    slots: CpuSlots
    # Who the execution is charged to, and what its store may hold, should it linger.
    principal: str | None = None
    memory_mb: int = 0
    tool_calls: int = 0
    # Set once `run` has stopped waiting for the thread (its report may be out), and
    # `lingers` if the runner was not done with it then.
    abandoned: bool = False
    lingers: bool = False
    handed: bool = False  # to its runner
    # Set by the thread once the guest has answered: output from then on is dropped.
    output_closed: bool = False
    finished: bool = False  # the runner is done with the store
    answered: bool = False
    result: _Answer | BaseException | None = None
    waiter: trio.Event | None = None
    # The scope of the host call (or the wait for a slot) in flight for the guest's
    # thread, if any: `run` giving up, or stopping the guest, cancels it.
    host_call: trio.CancelScope | None = None
    # Hands kept output to the Trio side as it is written (streaming only).
    live: Callable[[StreamName, bytes], None] | None = None
    queue_s: float = 0.0
    queue_limit_s: float = math.inf
    # Set when the guest was stopped because its waits for a slot ran past the limit.
    queue_expired: bool = False
    # The guest's clock, while its store runs (None where Wasmtime's own is used).
    clock: StoreClock | None = None
    # When the guest returned its answer (`time.monotonic`, set by the thread).
    answered_at: float = 0.0
    # What its working directory may hold; the files placed there before it runs, and
    # those it left under out/ (read by the thread before it answers).
    disk_bytes: int = 0
    placing: tuple[FileData, ...] = ()
    files: list[FileData] = field(default_factory=list)
    # Serves the guest's `fs/*` calls, while it runs (a guest without WASI files).
    guest_files: GuestFiles | None = None
    # Whether what its runner does after the answer is work nobody waits for (closing
    # a fresh instance: see `thread_priority`); a session's runner only waits for its
    # next step, which it would then start in the idle class, a syscall later.
    idle_after: bool = True
    # Whether the guest may end its run early (`WasmExecutor.ends_early`), and the
    # answer it gave as it ended.
    may_end: bool = False
    ended_with: str | None = None
    # The calls the guest started and collects later (`wasm_guest_calls`), made at its
    # first; they run in `nursery` (the executor's), which may outlive the run.
    calls: GuestCalls | None = None
    nursery: trio.Nursery | None = None
    left_calls: LeftCalls | None = None
    tool_limit: int = 0  # `limits.tool_calls`
    # Watched to move elsewhere after this much CPU (`wasm_moves`), until a call of the
    # guest's reaches the daemon (`reached_out`).
    move_after_cpu_s: float | None = None
    reached_out: bool = False

    @property
    def queue_left_s(self) -> float:
        return max(0.0, self.queue_limit_s - self.queue_s)

    def answer(self, result: _Answer | BaseException) -> None:
        """Take the thread's answer (or failure) and wake `run`; Trio thread only."""
        if self.answered:
            return
        self.answered, self.result = True, result
        self.wake()

    def wake(self) -> None:
        """Have `run` look again: the answer is in, or the deadline moved."""
        if self.waiter is not None:
            self.waiter.set()

    async def regain_slot(self) -> None:
        """Wait until the guest, back from a wait, holds a CPU slot again (Trio side).

        The wait is queueing: the deadline and the guest's clock move on by it. If it
        runs past what is left of `queue_limit_s`, the guest is stopped instead (as
        timed out, `queue_expired`)."""
        seat = self.interrupt.seat
        if self.slots.take_nowait(seat, resuming=True):
            return
        seat.resuming = True
        began = trio.current_time()
        try:
            with trio.move_on_after(self.queue_left_s) as waiting:
                await self.slots.take(seat, resuming=True)
        finally:
            waited = trio.current_time() - began
            seat.resuming = False
            self.queue_s += waited
            self.interrupt.deadline += waited
            if self.clock is not None:
                self.clock.pause(waited)
            self.wake()
        # Judged by the wait, not by `seat.held`: a slot taken from the seat since (its
        # thread slow to run on) is regained at the guest's next tick.
        if waiting.cancelled_caught:
            self.queue_expired = True
            self.interrupt.stop(_wasmtime.StopReason.TIMEOUT)


class ProgramRejected(Exception):
    """A program the guest cannot run as written; reported as the execution's error."""

    def __init__(self, error: ErrorInfo) -> None:
        super().__init__(error.message)
        self.error = error


class WasmExecutor:
    """Runs programs in fresh instances of one guest component on Wasmtime.

    `cache_dir` holds the built component and its compiled form (see `wasm_build`).
    `fuel`, when set, is an instruction budget per execution on top of the wall
    timeout (deterministic; off by default).
    """

    name: str
    languages: frozenset[str]
    recipe: GuestRecipe
    runtime: str  # what runs the programs, e.g. "CPython 3.14"
    # How much of an instance's memory its pool slot keeps resident (see `_wasmtime`).
    keep_resident_bytes: int = 0
    # Whether the host bounds the guest's clock waits (`wasm_clock`): needed where a
    # program can reach a raw WASI wait, as Python can.
    host_bounds_waits: bool = True
    # Whether a program has a working directory (`scratch`), capped by limits.disk_mb;
    # and whether the guest sees it through WASI (else through `fs/*` host calls).
    files: bool = False
    preopen_files: bool = True
    # Whether the guest may end a run before it settles, its answer given
    # (`UNCAUGHT_METHOD`); never a session's step, whose instance goes on.
    ends_early: bool = False

    def __init__(self, *, cache_dir: str | os.PathLike[str], fuel: int | None = None) -> None:
        self._cache_dir = Path(cache_dir)
        self._fuel = fuel
        # Each runner thread holds at most one store: the pool has a slot for every one.
        self._engine = _wasmtime.new_engine(
            fuel=fuel is not None,
            instances=MAX_RUNNERS + MAX_LINGERING_THREADS,
            keep_resident_bytes=self.keep_resident_bytes,
        )
        self._instances: Instances | None = None
        self._runners: Runners | None = None
        self._scratch: ScratchDirs | None = None
        self._built: BuiltComponent | None = None
        self._loaded: _wasmtime.LoadedComponent | None = None
        self._compiled_cache: str | None = None
        # The packages the programs may import, by name (see `prepare_files`), and
        # what they were built from, shown with the component's build inputs.
        self._packages: dict[str, str] = {}
        self._packages_inputs: dict[str, str] = {}
        self._timings: dict[str, float] = {}
        self._progress = BuildProgress(self.name)
        self._state = _State.NOT_STARTED
        self._reason: str | None = "the executor has not been started (serve() has not run)"
        # Held while a guest runs code: more guests than cores doing so only queue.
        self._slots = CpuSlots(CONCURRENT_EXECUTIONS)
        # Runner threads, counting those left finishing a blocking WASI call after
        # their execution was reported (see `_wait_for_guest`): a bound on what they
        # hold (and the size of the pool).
        self._threads = trio.CapacityLimiter(MAX_RUNNERS + MAX_LINGERING_THREADS)
        self._lingering = LingerBudget(max_threads=MAX_LINGERING_THREADS)
        # `abandoned` and `finished` of an execution are set by two threads.
        self._lingering_lock = threading.Lock()
        self._bounded_waits = False
        self._runs = 0
        self._sessions: set[WasmSession] = set()
        self._settled = trio.Event()  # set once the build has succeeded or failed
        # Where the calls guests start run (see `wasm_guest_calls`), while served, and
        # how many of them go on after their executions answered.
        self._nursery: trio.Nursery | None = None
        self._left_calls = LeftCalls()

    def __repr__(self) -> str:
        state = self._state if self._reason is None else f"{self._state}: {self._reason}"
        return f"<{type(self).__name__} ({state}) {self._runs} runs>"

    # -- lifecycle ---------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Build and load the component, then run the runners and tick the epoch until
        cancelled.

        Calls `task_status.started()` at once: the executor is unavailable (with the
        reason) while it builds, and stays so if the build fails. A component that does
        not load is loaded again, later (see `LOAD_RETRY_FIRST_S`). Never raises for a
        failed build or load.
        """
        try:
            with _wasmtime.ticking(self._engine):
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(_wasmtime.serve_ticker)
                    nursery.start_soon(self._slots.serve)
                    nursery.start_soon(self._end_sessions_on_exit)
                    task_status.started()
                    await self._prepare_until_loaded()
                    if self._instances is not None:
                        # No checkpoint since `prepare` made the executor available:
                        # an execution always finds the runners (ready, or soon to be).
                        self._runners = Runners(
                            self._instances,
                            count=RUNNERS,
                            limit=MAX_RUNNERS,
                            threads=self._threads,
                            own_instances=(
                                None if _wasmtime.stops_by_callback() else self._own_instances
                            ),
                        )
                        nursery.start_soon(self._runners.serve)
        finally:
            self._runners = self._nursery = None
            if self._scratch is not None:
                self._scratch.close()
                self._scratch = None

    async def _end_sessions_on_exit(self) -> None:
        """Until cancelled; then tell every session's thread to close its store, so
        that the runners, stopping beside it, find their threads ending."""
        try:
            await trio.sleep_forever()
        finally:
            for session in list(self._sessions):
                self._forget_session(session)

    async def _prepare_until_loaded(self) -> None:
        """`prepare`, and again after a pause each time the component was built but
        did not load; returns once it is loaded or its build failed."""
        delay = LOAD_RETRY_FIRST_S
        while not await self.prepare() and self._built is not None:
            self._reason = f"{self._reason}; trying again in {delay:g} s"
            log.warning("%s: loading again in %g s", self.name, delay)
            await trio.sleep(delay)
            delay = min(delay * 2, LOAD_RETRY_MAX_S)

    async def prepare(self) -> bool:
        """Build (or find) and load the component in a worker thread; whether it is
        loaded. Idempotent."""
        if self._state in (_State.READY, _State.BUILDING):
            return self._state == _State.READY
        self._state = _State.BUILDING
        self._reason = f"the {self.name} component is being built (seconds, on first start only)"
        try:
            await trio.to_thread.run_sync(self._load)
        except (BuildError, OSError, wasmtime.WasmtimeError) as exc:
            self._state = _State.FAILED
            self._reason = f"the {self.name} component could not be built or loaded: {exc}"
            log.warning("%s executor unavailable: %s", self.name, self._reason)
        else:
            self._state = _State.READY
            self._reason = None
        finally:
            self._settled.set()
        return self._state == _State.READY

    async def wait_ready(self) -> bool:
        """Wait until the component is loaded or failed to; whether it is available."""
        await self._settled.wait()
        return self._reason is None

    @property
    def preparing(self) -> bool:
        """Whether `wait_ready` would still wait."""
        return not self._settled.is_set()

    def _load(self) -> None:
        self._built = None  # set once built: then a failure is one of loading
        built = ensure_component(self.recipe, self._cache_dir, self._progress)
        self._built = built
        with self._progress.step("compile" if built.built else "load"):
            loaded = _wasmtime.load_component(
                self._engine, built.path, built.component_hash, fuel=self._fuel is not None
            )
        with self._progress.active():
            self.prepare_files(loaded.component)
        instances = self._instances_of(self._engine, loaded.component)
        self._bounded_waits = instances.bounded_waits
        self._timings = {
            "build_s" if built.built else "build_check_s": round(built.seconds, 3),
            ("compile_s" if loaded.cache is not _wasmtime.CompiledCache.HIT else "deserialize_s"): (
                round(loaded.seconds, 3)
            ),
        }
        self._compiled_cache = loaded.cache.value
        self._loaded = loaded
        self._instances = instances
        log.info("%s component %s ready (%s)", self.name, built.component_hash[:12], self._timings)

    def _instances_of(
        self,
        engine: wasmtime.Engine,
        component: wasmtime.component.Component,
        base_memory_mib: int | None = None,
    ) -> Instances:
        """Instances of `component` (of `engine`) whose waits end by their deadlines,
        or, if it cannot be linked so (logged), with Wasmtime's own clock: a blocked
        guest then lingers, within `wasm_lingering`'s caps."""
        fuel = self._fuel is not None
        read_only = self.read_only_dirs(self._built.path.parent) if self._built else ()
        if self.files and self._scratch is None:
            self._scratch = ScratchDirs(self._cache_dir / SCRATCH_DIR / self.name)
        options = {
            "read_only": read_only,
            "scratch": self._scratch,
            "preopen_scratch": self.preopen_files,
            "fuel": fuel,
            "base_memory_mib": base_memory_mib,
            "record": self._base_memory_record(read_only, fuel) if self._built else None,
        }
        clock = BoundedClock(engine)
        linker = self._linker(engine)
        if self.host_bounds_waits and clock.install(linker, component):
            try:
                return Instances(engine, linker, component, clock=clock, **options)
            except wasmtime.WasmtimeError as exc:
                log.warning("%s: bounded guest waits do not link (%s)", self.name, exc)
        return Instances(engine, self._linker(engine), component, **options)

    def _base_memory_record(
        self, read_only: tuple[tuple[Path, str], ...], fuel: bool
    ) -> BaseMemoryRecord:
        """Where the base memory of the built component's instances, made with these
        options, is kept between starts (see `Instances`)."""
        assert self._built is not None
        built = self._built
        options = (built.component_hash, read_only, self.preopen_files, fuel)
        return BaseMemoryRecord.of(built.path.parent, *options)

    def _own_instances(self) -> Instances:
        """Instances in an engine of their own, for one runner (blocking): without the
        epoch callback a guest is stopped by moving its engine's epoch, which must not
        stop any other runner's guest (see `_wasmtime.Interrupt`)."""
        # Runners start once the component is loaded.
        assert self._built is not None
        assert self._loaded is not None
        assert self._instances is not None
        fuel = self._fuel is not None
        engine = _wasmtime.new_engine(fuel=fuel)
        component = _wasmtime.map_again(engine, self._loaded)
        if component is None:  # the compiled file was replaced: check it again
            built = self._built
            loaded = _wasmtime.load_component(engine, built.path, built.component_hash, fuel=fuel)
            component = loaded.component
        return self._instances_of(engine, component, self._instances.base_memory_mib)

    def prepare_files(self, component: wasmtime.component.Component) -> None:
        """Make what instances of `component` will see beside the component's own
        files, once it is loaded (blocking; raises BuildError): a subclass's packages."""

    def run_trusted(
        self,
        component: wasmtime.component.Component,
        code: str,
        inputs: Any,
        writable: tuple[tuple[Path, str], ...],
    ) -> Any:
        """Run `code`, a program of ours, in a fresh instance of `component` that sees
        the host directories `writable` read-write, with the pool's memory bound and
        BUILD_PROGRAM_TIMEOUT_S: build work that must run on the guest's own runtime.
        Its result; BuildError if it fails."""
        assert self._built is not None  # the component is loaded
        instances = Instances(
            self._engine,
            self._linker(self._engine),
            component,
            fuel=self._fuel is not None,
            read_only=self.read_only_dirs(self._built.path.parent),
            writable=writable,
            base_memory_mib=MAX_MEMORY_MIB,  # never measured: nothing is refused by it
        )
        timeout_ms = int(BUILD_PROGRAM_TIMEOUT_S * 1000)
        request = jsontext.dumps({"code": code, "inputs": inputs, "timeout_ms": timeout_ms})
        try:
            instance = instances.new()
            try:
                instance.install(_wasmtime.Interrupt(BUILD_PROGRAM_TIMEOUT_S))
                with instance.running():
                    answer = _parse_answer(instance.run(instance.store, request))
            finally:
                instance.close()
        except (wasmtime.WasmtimeError, wasmtime.Trap) as exc:
            raise BuildError(f"the {self.name} guest failed a build step: {exc}") from exc
        if answer is None or answer.get("error"):
            raise BuildError(f"the {self.name} guest failed a build step: {answer}")
        return answer.get("result")

    def read_only_dirs(self, component_dir: Path) -> tuple[tuple[Path, str], ...]:
        """The host directories every instance sees, read-only, as (host, guest) paths:
        files the guest's build left beside the component in `component_dir`."""
        return ()

    def _linker(self, engine: wasmtime.Engine) -> wasmtime.component.Linker:
        linker = wasmtime.component.Linker(engine)
        linker.add_wasip2()
        # A module function, not a method: the linker holds what is registered until it
        # is freed, and a method would keep this executor (its engine, compiled code
        # and pool) alive as long.
        add_string_import(linker, HOST_CALL_IMPORT, _host_call)
        return linker

    @property
    def unavailable_reason(self) -> str | None:
        return self._reason

    def info(self) -> ExecutorInfo:
        """Availability, versions, the component and its cache state; never blocks."""
        lingering = self._lingering.statistics()
        slots = self._slots.statistics()
        details: dict[str, Any] = {
            "state": self._state,
            "runs": self._runs,
            "lingering_threads": lingering.threads,
            "lingering_memory_mb": lingering.memory_mb,
            "bounded_waits": self._bounded_waits,
            "runner_threads": self._runners.alive if self._runners is not None else 0,
            "max_runners": MAX_RUNNERS,
            "cpu_slots": slots.total,
            "running_guests": slots.running,
            "waiting_for_cpu": slots.resuming + slots.starting,
            "taken_runners": self._runners.taken if self._runners is not None else 0,
            "sessions": len(self._sessions),
            "max_sessions": MAX_SESSIONS,
        }
        if self._built is not None:
            details.update(
                component=str(self._built.path),
                component_hash=self._built.component_hash,
                build_inputs={**self._built.inputs, **self._packages_inputs},
                compiled_cache=self._compiled_cache,
                timings=self._timings,
            )
        if self._instances is not None:
            details.update(
                standby_instances=self._runners.ready if self._runners is not None else 0,
                base_memory_mib=self._instances.base_memory_mib,
            )
        return ExecutorInfo(
            name=self.name,
            languages=tuple(sorted(self.languages)),
            available=self._reason is None,
            version=f"{self.runtime} on wasmtime {_wasmtime.wasmtime_version()}",
            reason=self._reason,
            pool=details,
            progress=self._progress.snapshot(),
            packages=dict(self._packages),
        )

    # -- jobs --------------------------------------------------------------------------

    async def run(self, job: Job, bridge: ToolBridge) -> Outcome:
        """Run `job` in a fresh instance and report how it ended (see the module doc)."""
        self._check(job)
        execution, capture = self._execution_for(job, bridge, job.limits.memory_mb)
        try:
            request = await self._request(job)
        except ProgramRejected as exc:
            return _rejected(capture, exc)
        refused = self._refusal(execution, capture)
        if refused is not None:
            return refused
        runner = await self._take_runner(execution)
        assert runner.instances is not None  # it reported ready
        work = functools.partial(self._work, job, request, execution, capture, runner.instances)
        try:
            answer, trap = await self._guest_answer(
                job, execution, capture, functools.partial(runner.hand, work)
            )
        finally:
            self._let_go(runner, execution)
        return await self._conclude(job, execution, capture, answer, trap)

    def _check(self, job: Job) -> None:
        """Raise unless the executor can run `job` now."""
        if self._reason is not None:
            raise RuntimeMissing(f"the {self.name} executor is unavailable: {self._reason}")
        if job.language not in self.languages:
            raise ValueError(f"the {self.name} executor does not run {job.language!r}")

    def _execution_for(
        self, job: Job, bridge: ToolBridge, memory_mb: int
    ) -> tuple[_Execution, OutputCapture]:
        """The host side of running `job` (its store capped at `memory_mb`): the
        execution and the capture of its output, under the job's limits."""
        limits = job.limits
        interrupt = GuestInterrupt(limits.timeout_ms / 1000, Seat())
        capture = OutputCapture(
            max_bytes=limits.output_bytes,
            max_lines=limits.output_lines,
            on_limit=lambda: interrupt.stop(_wasmtime.StopReason.OUTPUT_LIMIT),
            on_output=job.on_output,
        )
        execution = _Execution(
            bridge,
            interrupt,
            trio.lowlevel.current_trio_token(),
            self._slots,
            principal=job.principal,
            memory_mb=memory_mb,
            queue_limit_s=job.queue_timeout_s,
            disk_bytes=limits.disk_mb * MIB,
            placing=job.files,
            may_end=self.ends_early,
            nursery=self._nursery,
            left_calls=self._left_calls,
            tool_limit=limits.tool_calls,
            # Only where the guest's own thread runs the watch: its CPU time is read.
            move_after_cpu_s=job.move_after_cpu_s if _wasmtime.stops_by_callback() else None,
        )
        interrupt.regain = functools.partial(_regain_slot, execution)
        self._runs += 1
        return execution, capture

    def _refusal(self, execution: _Execution, capture: OutputCapture) -> Outcome | None:
        """The outcome of an execution whose memory cannot even start the guest, or
        None; raises `Overloaded` while lingering guests hold too much already."""
        assert self._instances is not None  # loaded, as the executor is available
        base_mib = self._instances.base_memory_mib
        if execution.memory_mb < base_mib:
            return outcomes.failed(
                outcomes.captured(capture),
                Status.MEMORY_LIMIT,
                "MemoryLimit",
                f"the {self.name} sandbox needs {base_mib} MB to start, more than the "
                f"program's limit of {execution.memory_mb} MB; raise limits.memory_mb",
            )
        refusal = self._lingering.refusal(execution.principal, execution.memory_mb)
        if refusal is not None:
            raise Overloaded(f"the {self.name} executor is busy: {refusal}")
        return None

    async def _guest_answer(
        self,
        job: Job,
        execution: _Execution,
        capture: OutputCapture,
        hand: Callable[[], None],
    ) -> _Answer:
        """Take a CPU slot, `hand` the guest its work, and wait for its answer (see
        `_wait_for_guest`); the slot is free again on the way out."""
        try:
            await self._take_slot(execution)
            if job.on_output is None:
                return await self._wait_for_guest(job, execution, hand)
            return await self._wait_streaming(job, execution, capture, hand)
        except BaseException:
            if execution.calls is not None:  # no outcome will settle them
                execution.calls.cancel()
            raise
        finally:
            self._slots.release(execution.interrupt.seat)

    async def _conclude(
        self,
        job: Job,
        execution: _Execution,
        capture: OutputCapture,
        answer: str | None,
        trap: str | None,
    ) -> Outcome:
        """The outcome of an execution whose guest answered `answer` or trapped `trap`."""
        interrupt = execution.interrupt
        if answer is not None and execution.answered_at > interrupt.deadline:
            # Done between the deadline and the tick that would have stopped it: late.
            interrupt.stop(_wasmtime.StopReason.TIMEOUT)
        outcome = self._outcome(job, capture, answer, trap, interrupt.reason)
        # A stop that landed after the answer (the daemon's, over a limit, say) still
        # stops its calls, whatever the status says.
        answered = outcome.status is Status.OK and interrupt.reason is None
        await _settle_calls(execution.calls, answered=answered and not job.stop.is_set())
        if execution.queue_expired and outcome.status is Status.TIMEOUT:
            outcome.error = ErrorInfo(
                "Timeout",
                f"the program waited more than {job.queue_timeout_s:g} s in all for the "
                f"{self.name} executor's CPU to be free and was stopped; the daemon is "
                "overloaded: retry later",
            )
        outcome.tool_calls = execution.tool_calls
        outcome.queue_s = execution.queue_s
        outcome.files = execution.files
        return outcome

    def _let_go(self, runner: Runner, execution: _Execution) -> None:
        """`run` is done with `runner`: it goes on to its next instance, or retires
        after a guest that lingers, or, never handed the execution, is ready again."""
        if self._runners is None:
            return
        if execution.handed:
            self._runners.release(runner, retiring=execution.lingers)
        else:
            self._runners.give_back(runner)

    async def _wait_for_guest(
        self, job: Job, execution: _Execution, hand: Callable[[], None]
    ) -> _Answer:
        """`hand` the execution to its runner (taken, with a CPU slot held); the
        guest's answer, or the trap that ended it.

        The program's time starts here: what it waited for so far was queueing. The
        epoch interrupt stops guest code within a tick, but not a thread blocked inside
        a WASI call (a sleep, a timer the program awaits): Wasmtime checks the epoch
        only while guest code runs. So once the execution's time is up or it is
        stopped, a tool call in flight is cancelled and the runner gets LINGER_GRACE_S
        to come back; after that the execution is reported without it, and the runner
        finishes on its own, trapping as soon as the call returns and closing its
        store. Cancellation abandons it at once.
        """
        interrupt = execution.interrupt
        interrupt.deadline = time.monotonic() + job.limits.timeout_ms / 1000
        hand()
        execution.handed = True
        try:
            if not await _wait_answer(execution, job.stop):
                # A no-op if the guest was stopped for another reason first.
                reason = _wasmtime.StopReason.CANCELLED if job.stop.is_set() else None
                interrupt.stop(reason or _wasmtime.StopReason.TIMEOUT)
                if execution.host_call is not None:  # a guest waiting on a tool: back now
                    execution.host_call.cancel()
                await _wait_answer(execution, None, until=trio.current_time() + LINGER_GRACE_S)
        finally:
            if not execution.answered:  # given up on, or the run itself was cancelled
                self._abandon(execution)
        if isinstance(execution.result, BaseException):
            raise execution.result
        return execution.result or (None, None)

    async def _take_runner(self, execution: _Execution) -> Runner:
        """A ready runner, waiting for one (queueing) within the execution's queue
        time; raises `Overloaded` if none came."""
        runners = self._runners
        if runners is None:
            raise RuntimeMissing(f"the {self.name} executor is not being served (serve() runs it)")
        runner = runners.take_nowait()  # the usual case: no scope to wait in
        if runner is not None:
            return runner
        began = trio.current_time()
        runner = await self._runner_within(execution.queue_left_s)
        execution.queue_s += trio.current_time() - began
        if runner is None:
            raise Overloaded(
                f"the {self.name} executor is busy: all its {MAX_RUNNERS} sandboxes are in "
                f"use and none came free within {execution.queue_limit_s:g} s; retry later"
            )
        return runner

    async def _runner_within(self, limit_s: float) -> Runner | None:
        """A ready runner, waiting up to `limit_s` for one; None if none came."""
        runners = self._runners
        if runners is None:
            raise RuntimeMissing(f"the {self.name} executor is not being served (serve() runs it)")
        with trio.move_on_after(limit_s):
            # Leaving the scope is no checkpoint: a runner taken is never lost to it.
            return await runners.take()
        return None

    async def _take_slot(self, execution: _Execution) -> None:
        """Wait (queueing) until the guest holds a CPU slot, within the execution's
        queue time; raises `Overloaded` if none came."""
        seat = execution.interrupt.seat
        if self._slots.take_nowait(seat):
            return
        began = trio.current_time()
        try:
            with trio.move_on_after(execution.queue_left_s) as waiting:
                await self._slots.take(seat)
        finally:
            execution.queue_s += trio.current_time() - began
        if waiting.cancelled_caught:
            raise Overloaded(
                f"the {self.name} executor is busy: no CPU slot came free within "
                f"{execution.queue_limit_s:g} s; retry later"
            )

    async def _wait_streaming(
        self,
        job: Job,
        execution: _Execution,
        capture: OutputCapture,
        hand: Callable[[], None],
    ) -> _Answer:
        """`_wait_for_guest`, with the guest's output streamed to `job.on_output`.

        Returns once every piece the guest wrote has been through the hook.
        """
        live = _LiveOutput()
        execution.live = live.hand_over
        async with trio.open_nursery() as nursery:
            nursery.start_soon(live.forward, capture)
            try:
                return await self._wait_for_guest(job, execution, hand)
            finally:
                # The thread's hand-overs were queued before its result came back
                # (one FIFO queue), so everything it wrote is in the channel now.
                live.close()

    def _abandon(self, execution: _Execution) -> None:
        """Give up on the execution's guest; its runner lingers (`execution.lingers`)
        if the guest is not back yet, and retires when it is."""
        execution.interrupt.stop(_wasmtime.StopReason.CANCELLED)
        if execution.host_call is not None:  # a task of its own: it would carry on
            execution.host_call.cancel()
        if execution.calls is not None:
            execution.calls.cancel()
        with self._lingering_lock:
            execution.abandoned = True
            if execution.finished:
                return
            execution.lingers = True
            self._lingering.charge(execution.principal, execution.memory_mb)
        # Its runner retires once the guest is back (see `_work`): one takes its place.
        if self._runners is not None:
            self._runners.add()
        log.warning(
            "%s: a guest outlived its execution (blocked in a WASI call, or the run "
            "was cancelled); its runner finishes when the guest comes back",
            self.name,
        )

    async def _request(self, job: Job, *, session: bool = False) -> str:
        """`request_for(job)`, in a worker thread for a program large enough that reading
        it (wasm-js parses it) would hold up the event loop and every other connection."""
        read = functools.partial(self.request_for, session=True) if session else self.request_for
        if len(job.code) <= INLINE_REQUEST_CHARS:
            return read(job)
        return await trio.to_thread.run_sync(read, job, abandon_on_cancel=True)

    def request_for(self, job: Job, *, session: bool = False) -> str:
        """The guest's JSON request for `job`, as a session's step if `session` (run
        in the guest's persistent namespace); raises `ProgramRejected` to refuse it."""
        request = {"code": job.code, "inputs": job.inputs, "timeout_ms": job.limits.timeout_ms}
        if session:
            request["session"] = True
        return jsontext.dumps(request)

    def _work(
        self,
        job: Job,
        request: str,
        execution: _Execution,
        capture: OutputCapture,
        instances: Instances,
        instance: Instance | None,
    ) -> bool:
        """One execution in a runner's thread, in `instance` (or one made now with the
        runner's `instances` if it has none): hand `run` (the guest's answer, None) or
        (None, the trap message), then close the store. Whether the runner may go on:
        not if the execution was given up on before it finished (see `_abandon`)."""
        try:
            if not execution.abandoned:  # given up on before the runner got to it
                memory_bytes = job.limits.memory_mb * MIB
                instance = self._instance(execution, instances, instance, memory_bytes)
                if instance is not None:
                    self._answer(instance, memory_bytes, request, execution, capture)
        finally:
            if instance is not None:
                self._close(instance)
            retiring = self._finish(execution)
        return not retiring

    def _step_work(
        self,
        request: str,
        execution: _Execution,
        capture: OutputCapture,
        memory_bytes: int,
        instances: Instances,
        instance: Instance | None,
    ) -> tuple[Instance | None, bool]:
        """`_work` for a session's step (`wasm_sessions.Step`): the store is kept for
        the next step, and closed by the session (`SessionSandbox.reset`) if it cannot
        go on; the instance to keep, and whether the runner may go on."""
        try:
            if not execution.abandoned:
                instance = self._instance(execution, instances, instance, memory_bytes)
                if instance is not None:
                    self._answer(instance, memory_bytes, request, execution, capture)
        finally:
            retiring = self._finish(execution)
        return instance, not retiring

    def _instance(
        self,
        execution: _Execution,
        instances: Instances,
        instance: Instance | None,
        memory_bytes: int,
    ) -> Instance | None:
        """`instance`, or a new one if None; None if none could be made, after handing
        `run` the failure as the guest's trap (runner thread)."""
        if instance is not None:
            return instance
        try:
            return instances.new(memory_bytes)
        except (wasmtime.WasmtimeError, wasmtime.Trap) as exc:
            self._hand_answer(execution, (None, str(exc)))
        except Exception as exc:  # a fault of ours: `run` raises it
            self._hand_answer(execution, exc)
        return None

    def _answer(
        self,
        instance: Instance,
        memory_bytes: int,
        request: str,
        execution: _Execution,
        capture: OutputCapture,
    ) -> None:
        """Run the guest in `instance` and hand `run` its answer or trap (runner thread)."""
        answer: _Answer | BaseException
        try:
            refused = _place_files(instance, execution)
            if refused is not None:
                self._hand_answer(execution, (refused, None))
                return
            output = self._run_guest(instance, memory_bytes, request, execution, capture)
            execution.answered_at = time.monotonic()
            answer = (output, None)
        except (wasmtime.WasmtimeError, wasmtime.Trap) as exc:
            answer = (None, str(exc))
            if execution.ended_with is not None:  # the trap was its own way to end
                execution.answered_at = time.monotonic()
                answer = (execution.ended_with, None)
        except Exception as exc:  # a fault of ours: `run` raises it
            answer = exc
        finally:
            execution.guest_files = None
        if instance.scratch is not None and not execution.abandoned:
            execution.files = workdir.collect(instance.scratch.path, execution.disk_bytes)
        self._hand_answer(execution, answer)

    def _hand_answer(self, execution: _Execution, answer: _Answer | BaseException) -> None:
        # The output is complete; whatever tearing down writes is not the program's.
        execution.output_closed = True
        with contextlib.suppress(trio.RunFinishedError):
            execution.token.run_sync_soon(execution.answer, answer)
        if execution.idle_after:
            thread_priority.background()  # nobody waits for the rest

    def _close(self, instance: Instance) -> None:
        try:
            instance.close()
        except Exception:  # the answer is out; the pool slot is Wasmtime's to recover
            log.exception("%s: closing a store failed", self.name)

    def _run_guest(
        self,
        instance: Instance,
        memory_bytes: int,
        request: str,
        execution: _Execution,
        capture: OutputCapture,
    ) -> str:
        """Give `instance` the execution's limits, interrupt and output, and run it."""
        store = instance.store
        store.set_limits(memory_size=memory_bytes)
        if self._fuel is not None:
            store.set_fuel(self._fuel)
        watched = execution.disk_bytes if self.preopen_files else None
        instance.install(execution.interrupt, disk_bytes=watched)
        if execution.move_after_cpu_s is not None:
            seen = functools.partial(_seen_outside, execution, capture)
            watch = MoveWatch(execution.move_after_cpu_s, seen)
            execution.interrupt.watch(watch, every_s=MOVE_CHECK_EVERY_S)
        if instance.scratch is not None and not self.preopen_files:
            execution.guest_files = GuestFiles(
                instance.scratch,
                execution.disk_bytes,
                functools.partial(execution.interrupt.stop, _wasmtime.StopReason.FILES_LIMIT),
            )
        # Chosen once here, so a run nobody streams does no work for streaming.
        record = _record if execution.live is None else _record_live
        instance.output.attach(lambda stream, data: record(execution, capture, stream, data))
        _RUNNING.execution = execution
        execution.clock = instance.clock
        try:
            with instance.running():  # which reads all it wrote, and what it piped
                answer = instance.run(store, request)
        finally:
            _RUNNING.execution = None
        return _piped_answer(execution, answer)

    def _finish(self, execution: _Execution) -> bool:
        """The runner is done with the execution (its thread); whether the execution
        was given up on before, which retires the runner."""
        with self._lingering_lock:
            execution.finished = True
            if execution.abandoned:
                self._lingering.release(execution.principal, execution.memory_mb)
            return execution.abandoned

    # -- sessions ----------------------------------------------------------------------

    async def open_session(self, spec: SessionSpec) -> WasmSession:
        """A session holding a runner and its instance (see `wasm_sessions`); raises
        `Overloaded` at MAX_SESSIONS, or if no runner came within SESSION_OPEN_WAIT_S."""
        if self._reason is not None:
            raise RuntimeMissing(f"the {self.name} executor is unavailable: {self._reason}")
        if spec.language not in self.languages:
            raise ValueError(f"the {self.name} executor does not run {spec.language!r}")
        if len(self._sessions) >= MAX_SESSIONS:
            raise Overloaded(
                f"the {self.name} executor holds {MAX_SESSIONS} sessions already; "
                "close one or retry later"
            )
        session = WasmSession(spec, self)
        self._sessions.add(session)
        try:
            runner = await self._runner_within(SESSION_OPEN_WAIT_S)
        except BaseException:
            self._sessions.discard(session)
            raise
        if runner is None:
            self._sessions.discard(session)
            raise Overloaded(
                f"the {self.name} executor is busy: no sandbox came free for a session "
                f"within {SESSION_OPEN_WAIT_S:g} s; retry later"
            )
        self._hold(session, runner)
        return session

    async def _files_sandbox(self, session: WasmSession, *, hold: bool) -> SessionSandbox | None:
        """The sandbox whose directory `session`'s files are in; if its last step's
        guest took the runner with it, None, or, if `hold`, a runner taken now (its
        directory empty). Raises `SandboxCrashed` once closed, `Overloaded` if no
        runner came within SESSION_OPEN_WAIT_S."""
        if session.closed:
            raise SandboxCrashed(f"session {session.spec.session_id} is closed")
        if session.sandbox is not None or not hold:
            return session.sandbox
        runner = await self._runner_within(SESSION_OPEN_WAIT_S)
        if runner is None:
            raise Overloaded(f"the {self.name} executor is busy: no sandbox came free; retry later")
        if session.closed:
            if self._runners is not None:
                self._runners.give_back(runner)
            raise SandboxCrashed(f"session {session.spec.session_id} is closed")
        return self._hold(session, runner)

    def _hold(self, session: WasmSession, runner: Runner) -> SessionSandbox:
        """Give `session` the taken `runner`, and start another in its place."""
        sandbox = session.hold(runner)
        if self._runners is not None:
            self._runners.replenish()
        return sandbox

    async def _run_step(self, session: WasmSession, job: Job, bridge: ToolBridge) -> Outcome:
        """`run`, as `session`'s next step: in the instance it keeps, under its memory
        cap, with the job's own time, output and tool limits."""
        self._check(job)
        execution, capture = self._execution_for(job, bridge, session.spec.memory_mb)
        execution.idle_after = False
        execution.may_end = False
        session.disk_bytes = execution.disk_bytes
        if session.spec.principal is not None:
            execution.principal = session.spec.principal
        # From here on, closing the session stops the step.
        session.stop_step = functools.partial(_stop, execution)
        try:
            try:
                request = await self._request(job, session=True)
            except ProgramRejected as exc:
                return _rejected(capture, exc)
            refused = self._refusal(execution, capture)
            if refused is not None:
                return refused
            sandbox = session.sandbox or await self._hold_again(session, execution)
            return await self._step(session, sandbox, job, request, execution, capture)
        finally:
            session.stop_step = None

    async def _hold_again(self, session: WasmSession, execution: _Execution) -> SessionSandbox:
        """A runner for a session whose last step's guest took its own with it
        (queueing, as a fresh execution's); raises `SandboxCrashed` if the session
        was closed meanwhile."""
        runner = await self._take_runner(execution)
        if session.closed:
            if self._runners is not None:
                self._runners.give_back(runner)
            raise SandboxCrashed(f"session {session.spec.session_id} is closed")
        return self._hold(session, runner)

    async def _step(
        self,
        session: WasmSession,
        sandbox: SessionSandbox,
        job: Job,
        request: str,
        execution: _Execution,
        capture: OutputCapture,
    ) -> Outcome:
        """Run the step in `sandbox` and judge whether its instance goes on."""
        runner = session.runner
        work = functools.partial(
            self._step_work, request, execution, capture, session.memory_bytes, sandbox.instances
        )
        hand = functools.partial(_hand_step, session, sandbox, work, execution)
        try:
            answer, trap = await self._guest_answer(job, execution, capture, hand)
        finally:
            kept = _instance_kept(execution)
            if not kept:
                self._reset(session, runner, sandbox, execution)
        outcome = await self._conclude(job, execution, capture, answer, trap)
        if kept and execution.handed and outcome.status is Status.MEMORY_LIMIT:
            # The guest lived through it, at its cap: its state may leave no room.
            kept = False
            self._reset(session, runner, sandbox, execution)
        outcome.session_reset = not kept
        return outcome

    def _reset(
        self,
        session: WasmSession,
        runner: Runner | None,
        sandbox: SessionSandbox,
        execution: _Execution,
    ) -> None:
        """After a step the instance cannot go on from: a fresh one for the next, or,
        if the step's guest has not come back, a runner of the session's own next."""
        if not execution.lingers:
            sandbox.reset()
            return
        if session.sandbox is sandbox:
            session.let_go()
        if runner is not None and self._runners is not None:
            self._runners.release(runner, retiring=True)

    async def _close_session(self, session: WasmSession) -> None:
        """`WasmSession.aclose`: stop its step, then wait (shielded, briefly) until its
        thread has closed the store."""
        sandbox = self._forget_session(session)
        if sandbox is None:
            return
        with trio.move_on_after(SESSION_CLOSE_WAIT_S, shield=True):
            await sandbox.closed.wait()

    def _forget_session(self, session: WasmSession) -> SessionSandbox | None:
        """Close `session` without waiting: stop its step, give its runner back (it
        goes on once its thread has closed the store); the sandbox it held, if any."""
        if session.closed:
            return None
        session.closed = True
        self._sessions.discard(session)
        if session.stop_step is not None:
            session.stop_step()
        runner, sandbox = session.let_go()
        # Untaken before the thread can go on to be ready for anybody else.
        if runner is not None and self._runners is not None:
            self._runners.release(runner)
        if sandbox is not None:
            sandbox.close()
        return sandbox

    # -- how a run ended, for the guest to refine ---------------------------------------

    def is_out_of_memory(self, error: ErrorInfo) -> bool:
        """Whether the guest's own error report means it ran out of memory."""
        return error.type == "MemoryError"

    def out_of_memory_stderr(self, stderr: str) -> str | None:
        """After a trap: the program's stderr without the guest runtime's last words,
        if they say it gave up for want of memory; None if they do not."""
        return None

    def explain_trap(self, trap: str) -> ErrorInfo | None:
        """What a trap means in this guest's terms, when it means something plain."""
        return None

    def program_stderr(self, stderr: str, explained: ErrorInfo) -> str:
        """The program's stderr after a trap `explain_trap` explained: without what the
        guest's runtime wrote about it, which the error now says."""
        return stderr

    def _outcome(
        self,
        job: Job,
        capture: OutputCapture,
        answer: str | None,
        trap: str | None,
        stopped: _wasmtime.StopReason | None,
    ) -> Outcome:
        limits = job.limits
        if stopped is _wasmtime.StopReason.MOVED and answer is None:
            return Outcome(Status.CANCELLED, moved=True)
        outcome = outcomes.captured(capture)
        if capture.limit_hit:
            return outcomes.output_limit(outcome, limits)
        if stopped is _wasmtime.StopReason.TIMEOUT:
            return outcomes.timed_out(outcome, limits)
        if stopped is _wasmtime.StopReason.FILES_LIMIT:
            return outcomes.disk_limit(outcome, limits)
        if stopped is _wasmtime.StopReason.CANCELLED and answer is None:
            return outcomes.stopped(outcome)
        if answer is None:
            return self._trapped(outcome, limits, trap or "unknown trap")
        if len(answer.encode("utf-8")) > limits.result_bytes + len('{"result": }'):
            return outcomes.result_too_large(outcome, limits)
        message = _parse_answer(answer)
        if message is None:
            return outcomes.failed(
                outcome, Status.CRASHED, "Crashed", f"the {self.runtime} guest answered nonsense"
            )
        error = message.get("error")
        if not isinstance(error, dict):
            outcome.result = message.get("result")
            outcome.exit_code = 0
            return outcome
        outcome.exit_code = outcomes.error_exit_code(message)
        info = outcomes.error_info(error)
        if self.is_out_of_memory(info):
            return outcomes.memory_limit(outcome, limits, info.traceback)
        outcome.status = Status.ERROR
        outcome.error = info
        return outcome

    def _trapped(self, outcome: Outcome, limits: Limits, trap: str) -> Outcome:
        log.debug("%s: the guest trapped: %s", self.name, trap)
        # The backtrace names guest functions (CPython's MemoryError_new, say): only
        # the trap's own message and the guest's stderr tell what happened.
        cause = _trap_message(trap)
        program_stderr = self.out_of_memory_stderr(outcome.stderr)
        if program_stderr is not None:
            outcome.stderr = program_stderr
            return outcomes.memory_limit(outcome, limits)
        if any(sign in (cause + outcome.stderr).lower() for sign in OUT_OF_MEMORY_SIGNS):
            return outcomes.memory_limit(outcome, limits)
        if "fuel" in cause:
            return outcomes.failed(
                outcome, Status.TIMEOUT, "Timeout", "the program used up its instruction budget"
            )
        explained = self.explain_trap(trap)
        if explained is not None:
            outcome.status, outcome.error, outcome.exit_code = Status.ERROR, explained, 1
            outcome.stderr = self.program_stderr(outcome.stderr, explained)
            return outcome
        return outcomes.failed(
            outcome, Status.CRASHED, "Crashed", f"the {self.runtime} sandbox trapped: {trap}"
        )


def _rejected(capture: OutputCapture, rejected: ProgramRejected) -> Outcome:
    outcome = outcomes.captured(capture)
    outcome.status, outcome.error, outcome.exit_code = Status.ERROR, rejected.error, 1
    return outcome


def _host_call(method: str, params: str) -> str:
    """The guest's `host-call`: a JSON-RPC call under the session token (runner thread)."""
    wasm_output.drain_current()  # what the guest wrote before the call comes first
    execution: _Execution | None = getattr(_RUNNING, "execution", None)
    if execution is None:
        return rpc_error(INTERNAL_ERROR, "the execution is being stopped")
    if method.startswith(METHOD_PREFIX) and execution.interrupt.reason is None:
        return _file_call(execution, method, params)  # takes what was piped, and shuts
    files = execution.guest_files
    # Whatever the call: the guest's stdout after it is never a file's bytes, and what
    # was piped for it is its params or nothing.
    piped = files.take_text() if files is not None else None
    if execution.interrupt.reason is not None:
        return rpc_error(INTERNAL_ERROR, "the execution is being stopped")
    if method == PIPE_METHOD:
        return _open_pipe(files, params)
    execution.reached_out = True
    if method == UNCAUGHT_METHOD:
        if not execution.may_end:  # a session's step: it ends with the error as it settles
            return rpc_error(-32601, f"method not found: {method} (the instance goes on)")
        # The program stopped by an error nothing could catch, as Deno stops it.
        execution.ended_with = params
        raise GuestEnded
    if method == WAIT_METHOD:
        if params == "":
            if piped is None:
                return rpc_error(-32700, "parse error: the calls to start did not arrive whole")
            params = piped
        return _wait_calls(execution, params)
    return _blocking_call(execution, method, params)


def _seen_outside(execution: _Execution, capture: OutputCapture) -> bool:
    """Whether something of the guest's run reached the outside: a call of its reached
    the daemon, or output of its was streamed (the guest's thread)."""
    if execution.reached_out:
        return True
    if execution.live is None:
        return False  # its output is the result's, which a moved run has none of
    wasm_output.drain_current()  # what it wrote is in the capture, or streamed
    return capture.statistics().bytes > 0


def _open_pipe(files: GuestFiles | None, params: str) -> str:
    """`calls/pipe`: the guest's next line on stdout, of at most `length` bytes, is the
    params of its next `calls/wait` (see `wasm_guest_calls`)."""
    if files is None:
        return rpc_error(-32601, f"method not found: {PIPE_METHOD} (this guest has WASI files)")
    try:
        length = jsontext.loads(params, lenient_numbers=True).get("length")
    except (jsontext.JsonTextError, AttributeError):
        length = None
    if type(length) is not int or length < 0:
        return rpc_error(-32602, "invalid params: length must be a number of bytes")
    files.pipe_text(length)
    return '{"result":null}'


def _blocking_call(execution: _Execution, method: str, params: str) -> str:
    """A call the guest waits for, dispatched under its session (runner thread)."""
    if method == "tools/call":
        execution.tool_calls += 1
    try:
        decoded = jsontext.loads(params, lenient_numbers=True)
    except jsontext.JsonTextError as exc:
        return rpc_error(-32700, f"parse error: {exc}")
    if not isinstance(decoded, dict):
        return rpc_error(-32602, "invalid params: params must be an object")
    # A task of its own (the token's system nursery), rather than a turn of the task
    # awaiting this thread: two scheduler passes fewer per call, and `_without_slot`
    # scopes it for cancelling either way.
    request = functools.partial(execution.bridge.request, method, decoded)
    result, error = _on_trio(execution, method, _without_slot, execution, request)
    # jsontext: a lone surrogate in a tool's result would fail to cross into the guest.
    return error if error is not None else jsontext.dumps({"result": result})


def _on_trio(
    execution: _Execution, method: str, function: Callable[..., Awaitable[Any]], *args: Any
) -> tuple[Any, str | None]:
    """`await function(*args)` on the Trio side for the guest's thread: (its value,
    None), or (None, the JSON-RPC error answer the guest gets instead)."""
    try:
        return trio.from_thread.run(function, *args, trio_token=execution.token), None
    except RpcError as exc:
        return None, rpc_error(exc.code, exc.message, exc.data)
    except (trio.Cancelled, trio.RunFinishedError, _Stopped):
        execution.interrupt.stop(_wasmtime.StopReason.CANCELLED)
        return None, rpc_error(INTERNAL_ERROR, "the execution is being stopped")
    except BaseException as exc:
        # Nothing may unwind into Wasmtime: wasmtime-py turns only an `Exception` into
        # a trap, and anything else would leave the call's result unwritten. Reported
        # to the guest; the daemon's side logs its own.
        log.exception("host-call %s failed", method)
        return None, rpc_error(INTERNAL_ERROR, f"internal error: {type(exc).__name__}")


def _wait_calls(execution: _Execution, params: str) -> str:
    """`calls/wait`: start the calls listed, then answer those done, waiting (off its
    CPU slot) up to the time asked for until one is (runner thread)."""
    try:
        wait = WaitRequest.parse(jsontext.loads(params, lenient_numbers=True), params)
    except jsontext.JsonTextError as exc:
        return rpc_error(-32700, f"parse error: {exc}")
    except ValueError as exc:
        return rpc_error(-32602, f"invalid params: {exc}")
    wait, dropped = _within_tool_limit(execution, wait)
    execution.tool_calls += sum(call.method == "tools/call" for call in wait.start)
    answers, error = _on_trio(execution, WAIT_METHOD, _collect_for_guest, execution, wait)
    return error if error is not None else answers_text(answers + dropped)


def _within_tool_limit(
    execution: _Execution, wait: WaitRequest
) -> tuple[WaitRequest, list[Answer]]:
    """`wait` less the tool calls sent as the run answers (`wait.last`) past what is
    left of `limits.tool_calls`, and the answers of those dropped."""
    if not wait.last:
        return wait, []
    room = execution.tool_limit - execution.tool_calls
    kept: list[StartedCall] = []
    dropped: list[Answer] = []
    for call in wait.start:
        if call.method != "tools/call":
            kept.append(call)
        elif room > 0:
            room -= 1
            kept.append(call)
        else:
            dropped.append((call.ticket, False, rpc_error(INTERNAL_ERROR, DROPPED_CALL)))
    return dataclasses.replace(wait, start=tuple(kept)), dropped


async def _collect_for_guest(execution: _Execution, wait: WaitRequest) -> list[Answer]:
    """Start `wait`'s calls; the answers of those done, at once if any is (or if it
    asks for no wait), else after waiting off the CPU slot."""
    interrupt = execution.interrupt
    if time.monotonic() > interrupt.deadline:  # its time is up, the tick not yet come
        interrupt.stop(_wasmtime.StopReason.TIMEOUT)
    if execution.abandoned or interrupt.reason is not None:
        raise _Stopped  # nothing would cancel calls started now
    calls = execution.calls
    if calls is None:
        calls = GuestCalls(
            execution.bridge.request, execution.nursery, execution.left_calls, execution.principal
        )
        execution.calls = calls
    alone = calls.alone(wait)
    if alone is not None:  # the usual case: one call awaited after another
        return await _without_slot(execution, functools.partial(calls.answer_alone, alone))
    for index, call in enumerate(wait.start):
        if index:
            # One scheduler pass apart, as the daemon starts the requests a connection
            # sends: the calls reach their upstreams in the order the program made them
            # (Trio runs the tasks of one pass in no set order).
            await trio.lowlevel.checkpoint()
        calls.start(call)
    answers = calls.collect_nowait()
    if answers is not None:
        return answers
    if wait.timeout_s <= 0:
        return []
    return await _without_slot(execution, functools.partial(calls.collect, wait.timeout_s))


async def _settle_calls(calls: GuestCalls | None, *, answered: bool) -> None:
    """Settle what becomes of a run's calls still out as it is reported: those of a
    program that `answered` (and was not stopped) go on (`GuestCalls.leave`), once
    every one has begun, so that it is counted; those of a program stopped or failed
    are cancelled, as a Deno worker's are when it ends."""
    if calls is None:
        return
    if not answered:
        calls.cancel()
        return
    try:
        await calls.begun()
    except BaseException:
        calls.cancel()
        raise
    calls.leave()


def _file_call(execution: _Execution, method: str, params: str) -> str:
    """A guest's `fs/*` call, served in its runner thread on its working directory."""
    files = execution.guest_files
    if files is None:
        return rpc_error(-32601, f"method not found: {method} (this guest has WASI files)")
    try:
        decoded = jsontext.loads(params, lenient_numbers=True)
        if not isinstance(decoded, dict):
            raise FsError("ERR_INVALID_ARG_TYPE", "params must be an object")
        return jsontext.dumps({"result": files.call(method, decoded)})
    except jsontext.JsonTextError as exc:
        return rpc_error(-32700, f"parse error: {exc}")
    except FsError as exc:
        return rpc_error(INTERNAL_ERROR, exc.message, {"code": exc.code})


def _place_files(instance: Instance, execution: _Execution) -> str | None:
    """Write the job's files into the instance's working directory (runner thread);
    None, or the guest's error answer if one cannot be placed (in a session's
    directory, a path the program made a directory or a link)."""
    if not execution.placing or instance.scratch is None:
        return None
    for file in execution.placing:
        try:
            workdir.write(instance.scratch.path, file.path, file.data)
        except OSError as exc:
            message = f"file {file.path!r} could not be placed: {exc.strerror or exc}"
            return jsontext.dumps({"error": {"type": "FilesRefused", "message": message}})
    return None


def _trap_message(trap: str) -> str:
    """A Wasmtime trap's text without its wasm backtrace (the frames and their header)."""
    return "\n".join(
        line
        for line in trap.splitlines()
        if not _BACKTRACE_LINE.match(line) and not line.endswith("wasm backtrace:")
    )


def _stop(execution: _Execution) -> None:
    """Stop the execution's guest at its next tick, and the host call it waits on."""
    execution.interrupt.stop(_wasmtime.StopReason.CANCELLED)
    if execution.host_call is not None:
        execution.host_call.cancel()


def _hand_step(
    session: WasmSession, sandbox: SessionSandbox, work: Step, execution: _Execution
) -> None:
    """Hand a session's step to its thread; or, the session closed (its thread ends
    without reading it), answer it as a guest stopped before it began."""
    if session.closed:
        execution.answer((None, SESSION_CLOSED))
    else:
        sandbox.hand(work)


def _instance_kept(execution: _Execution) -> bool:
    """Whether a session's instance can go on after the step `execution`: the step
    never reached it, or its guest answered (rather than trapped, or was given up on)."""
    if not execution.handed:
        return True
    result = execution.result
    return execution.answered and isinstance(result, tuple) and result[0] is not None


def _piped_answer(execution: _Execution, answer: str) -> str:
    """`run`'s answer: itself, or when it is empty, the line the guest piped on stdout
    in its place (a long answer, see `answered` in shims/wasm_js/guest.js)."""
    files = execution.guest_files
    if answer or files is None:
        return answer
    return files.take_text() or answer


def _parse_answer(answer: str) -> dict[str, Any] | None:
    """The guest's JSON answer, or None if it is not the object the world promises."""
    try:
        message = jsontext.loads(answer, lenient_numbers=True)
    except jsontext.JsonTextError:
        return None
    return message if isinstance(message, dict) else None


def _record(execution: _Execution, capture: OutputCapture, stream: str, data: bytes) -> bool:
    """Keep what `data` holds of output; whether more is wanted (`wasm_output.Sink`)."""
    _keep(execution, capture, stream, data)
    return _wanted(execution, capture)


def _record_live(
    execution: _Execution, capture: OutputCapture, stream: StreamName, data: bytes
) -> bool:
    """`_record`, also handing what was kept to the Trio side (runner thread)."""
    kept = _keep(execution, capture, stream, data)
    if kept and execution.live is not None:
        execution.live(stream, kept)
    return _wanted(execution, capture)


def _keep(execution: _Execution, capture: OutputCapture, stream: str, data: bytes) -> bytes:
    """What the capture kept of `data` less what was piped, unless the report may be out."""
    data = _unpiped(execution, stream, data)
    if data and not (execution.abandoned or execution.output_closed):
        return capture.write_nowait(stream, data)  # type: ignore[arg-type]
    return b""


def _wanted(execution: _Execution, capture: OutputCapture) -> bool:
    """Whether the execution takes more output: not past its limit (the guest is being
    stopped), nor once it is reported."""
    return not (capture.limit_hit or execution.abandoned or execution.output_closed)


def _unpiped(execution: _Execution, stream: str, data: bytes) -> bytes:
    """`data` less what was a file's bytes piped on stdout (see `wasm_fs`): output."""
    files = execution.guest_files
    if stream != "stdout" or files is None:
        return data
    taken = files.piped_output(data)
    return data[taken:] if taken else data


class _LiveOutput:
    """A guest's output on its way from the runner thread to the `on_output` hook.

    `hand_over` (runner thread) never blocks the guest: it queues a callback on the
    Trio loop, and Trio runs such callbacks in the order they were queued, so stdout
    and stderr keep the order the guest wrote them in. Only output the budget kept is
    handed over, so what waits here is bounded by `limits.output_bytes`. `forward`
    (Trio side) awaits the hook with each piece until `close`.
    """

    def __init__(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._send, self._receive = trio.open_memory_channel[tuple[StreamName, bytes]](math.inf)

    def hand_over(self, stream: StreamName, kept: bytes) -> None:
        # A finished run: the daemon is gone and nobody is watching.
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(self._deliver, (stream, kept))

    def _deliver(self, item: tuple[StreamName, bytes]) -> None:
        # Runs on the Trio loop, where raising would be fatal. A closed channel means the
        # piece came after the execution was reported: dropped, as the capture drops it.
        with contextlib.suppress(trio.ClosedResourceError):
            self._send.send_nowait(item)

    def close(self) -> None:
        self._send.close()

    async def forward(self, capture: OutputCapture) -> None:
        async for stream, kept in self._receive:
            await capture.emit(stream, kept)
        await capture.finish("stdout")
        await capture.finish("stderr")


class _Stopped(Exception):
    """A host call cut short because its execution was given up on."""


async def _without_slot(execution: _Execution, wait: Callable[[], Awaitable[T]]) -> T:
    """`await wait()` for the guest's thread (a tool call, or the wait for calls it
    started), in a scope that `_abandon` (and the executor's shutdown) cancels: it runs
    in a task of its own, which would otherwise outlive the execution.

    The guest runs no code while it waits: its CPU slot is free for another guest
    meanwhile, and taken back before the answer goes to the guest."""
    with trio.CancelScope() as scope:
        execution.host_call = scope
        if execution.abandoned:
            scope.cancel()
        execution.slots.release(execution.interrupt.seat)
        try:
            try:
                return await wait()
            finally:
                if not scope.cancel_called:
                    await execution.regain_slot()
        finally:
            execution.host_call = None
    raise _Stopped


def _regain_slot(execution: _Execution) -> None:
    """`GuestInterrupt.regain`: block the guest's thread until it holds a CPU slot
    again, or until its execution is stopped (then the guest stops at this tick).
    Never raises: it runs inside Wasmtime's epoch callback."""
    try:
        trio.from_thread.run(_regain_for_guest, execution, trio_token=execution.token)
    except BaseException:  # cancelled, given up on, or the daemon is gone
        execution.interrupt.stop(_wasmtime.StopReason.CANCELLED)


async def _regain_for_guest(execution: _Execution) -> None:
    """`_Execution.regain_slot` for the guest's thread, in a scope that `_abandon` and
    a stop cancel (as `_without_slot`)."""
    with trio.CancelScope() as scope:
        execution.host_call = scope
        if execution.abandoned or execution.interrupt.reason is not None:
            scope.cancel()
        try:
            await execution.regain_slot()
        finally:
            execution.host_call = None
    if scope.cancelled_caught:
        raise _Stopped


async def _wait_answer(
    execution: _Execution, stop: StopSignal | None, *, until: float | None = None
) -> bool:
    """Wait until the thread has answered, the execution's deadline, `until` (Trio
    time, instead of the deadline) or `stop`; whether it has answered.

    The deadline is the interrupt's, which moves on while the guest waits for a CPU
    slot (then there is none to wait for: `execution.wake` says when to look again).
    Woken by an event (`_Execution.answer`, or `stop` calling back), not by cancelling
    a scope: that cost the event loop ~10% of its time per trivial execution (a cancel
    and its exception), on the way to the reply."""
    while not execution.answered:
        if until is not None:
            deadline = until
        elif execution.interrupt.seat.resuming:
            deadline = math.inf
        else:
            deadline = trio.current_time() + (execution.interrupt.deadline - time.monotonic())
        if deadline <= trio.current_time() or (stop is not None and stop.is_set()):
            break
        woken = trio.Event()
        execution.waiter = woken
        try:
            with trio.move_on_at(deadline), stop.calling(woken.set) if stop else _NOTHING:
                await woken.wait()
        finally:
            execution.waiter = None
    return execution.answered


_NOTHING = contextlib.nullcontext()
