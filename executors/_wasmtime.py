"""What every Wasmtime executor shares: the engine, the epoch ticker, the compiled-code
cache and the per-execution interrupt.

One `Engine` per executor, with the component model and epoch interruption on. A
daemon-wide `EpochTicker` advances the epoch of every registered engine every
`EPOCH_TICK_S` while a call into a guest is under way (each is made inside
`TICKER.running()`); each store's deadline is one tick away, and when it passes, the
store's `Interrupt` decides in the worker thread whether the guest goes on for another
tick or traps (wall time used up, the execution stopped, its output budget spent). So one
shared epoch serves executions that each stop for their own reason, and a stop takes
effect within a tick, on the thread running the store (a store is used by one thread
at a time).

Compiling a ~20 MB component to native code takes seconds, so `load_component` keeps
the compiled form in a cache file named after everything it depends on (the
component's hash, the Wasmtime version, the CPU, whether fuel is counted) with the
SHA-256 of its bytes beside it: a file whose bytes do not match is never handed to
Wasmtime (deserializing is only safe on bytes Wasmtime wrote), it is compiled again.
Daemons sharing a state directory (an MCP client's embedded daemons, say) take turns
on a lock beside the cache file, so the first compiles and the others load its result.

An executor's engine allocates instances from a pool (`new_engine(instances=...)`,
Wasmtime's pooling allocator): the address space of every instance it may ever hold at
once is reserved up front, and each slot is reset to the component's initial state
when its instance is dropped, so an execution maps and unmaps no memory. A slot may
also keep the first `keep_resident_bytes` of its linear memory resident: the next
instance then faults none of it in, but the reset copies all of it back (Wasmtime's C
API cannot limit that to the dirty pages). That moves work from the guest's run to
the reset, which pays because the reset happens when the store is closed, after the
answer is on its way (see `wasm.py`): both guests halve a trivial program's run.
Compiled code is the same with or without the pool, so the compiled-code cache is
unaffected.

wasmtime-py has no public way to the pool or to a store's epoch callback: both go
through `_wasmtime_private`. Where that is off (another wasmtime version, say) an
engine has no pool, and a store's epoch deadline can only trap: so an `Interrupt` is
checked by the ticker's thread instead, and stops its guest by moving the epoch of an
engine that store has to itself (`ticking` leaves such engines alone; `wasm.py` gives
each runner one). A stop then takes effect as promptly, at the guest's next epoch
check.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import fcntl
import functools
import hashlib
import importlib.metadata
import logging
import os
import platform
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import trio
import wasmtime
import wasmtime.component

from conduit.executors import _wasmtime_private as private
from conduit.executors.file_digest import file_version, sha256_hex

__all__ = [
    "EPOCH_TICK_S",
    "TICKER",
    "CompiledCache",
    "EpochTicker",
    "Interrupt",
    "LoadedComponent",
    "StopReason",
    "cpu_key",
    "load_component",
    "map_again",
    "new_engine",
    "stops_by_callback",
    "ticking",
    "wasmtime_version",
]

log = logging.getLogger(__name__)

# How long a start waits for another process compiling the same component before it
# compiles too (cache files are replaced atomically, so both results are sound): a
# compile under load takes a minute; a peer stopped while holding the lock must not
# stop this daemon's start for ever.
COMPILE_LOCK_WAIT_S = 300
COMPILE_LOCK_POLL_S = 0.05

# 10 ms: how late a timeout or a stop may take effect; ticking costs ~nothing.
EPOCH_TICK_S = 0.010
# Ticks with no guest call before the ticker waits for one: 0.1 s, longer than the
# gap between executions sent back to back, far shorter than an agent's pause.
IDLE_AFTER_TICKS = 10


@functools.cache
def wasmtime_version() -> str:
    # Cached: reading package metadata parses files (~0.4 ms), and `info()` asks for it
    # whenever a request picks an executor.
    return importlib.metadata.version("wasmtime")


# Component instances per store: the guest, and the helper that bounds its clock
# (`wasm_clock`).
COMPONENTS_PER_STORE = 2
# The pool's bounds per component instance, above what the guests need (wasm-js: 4
# core instances, 1 memory, 2 tables; wasm-python: 14, 1, 2). A guest that needs more
# fails to load, with Wasmtime's message saying which bound, never mid-execution.
POOL_CORE_INSTANCES_PER_COMPONENT = 32
POOL_MEMORIES_PER_COMPONENT = 2
POOL_TABLES_PER_COMPONENT = 8
# 4 GiB: a 32-bit linear memory's own limit; each store's limits enforce the
# execution's `memory_mb`, so the pool never is the limit a program meets.
POOL_MEMORY_BYTES = 4 << 30
# Table slots kept resident: the guests' tables are a few hundred entries, so the
# reset is a small copy rather than a page fault on each first use.
TABLE_KEEP_RESIDENT_BYTES = 1 << 20


def new_engine(
    *, fuel: bool = False, instances: int | None = None, keep_resident_bytes: int = 0
) -> wasmtime.Engine:
    """An engine for components, with epoch interruption (and fuel when asked).

    With `instances`, instances come from a pool with slots for that many stores, each keeping
    `keep_resident_bytes` of its memory resident (see the module docstring); the
    caller must never hold more stores of this engine at once, or instantiating
    fails. Without it, every instance maps fresh memory.
    """
    config = wasmtime.Config()
    config.wasm_component_model = True
    config.epoch_interruption = True
    config.consume_fuel = fuel
    if instances is not None:
        _use_pool(config, instances, keep_resident_bytes)
    return wasmtime.Engine(config)


def _use_pool(config: wasmtime.Config, instances: int, keep_resident_bytes: int) -> None:
    if not private.AVAILABLE:
        return  # wasmtime-py has no public way to it: every instance maps fresh memory
    private.use_pooling_allocator(
        config,
        total_component_instances=instances * COMPONENTS_PER_STORE,
        # Totals follow from the per-component bounds, so they cannot run out first.
        max_core_instances_per_component=POOL_CORE_INSTANCES_PER_COMPONENT,
        total_core_instances=instances * POOL_CORE_INSTANCES_PER_COMPONENT,
        max_memories_per_component=POOL_MEMORIES_PER_COMPONENT,
        total_memories=instances * POOL_MEMORIES_PER_COMPONENT,
        max_tables_per_component=POOL_TABLES_PER_COMPONENT,
        total_tables=instances * POOL_TABLES_PER_COMPONENT,
        max_memory_size=POOL_MEMORY_BYTES,
        # Stacks are for async calls, which these engines never make; each would cost
        # two memory mappings (the default 1000 exhaust a process's map count).
        total_stacks=0,
        linear_memory_keep_resident=keep_resident_bytes,
        table_keep_resident=TABLE_KEEP_RESIDENT_BYTES,
        # Resident memory is held by idle slots: one per core is what a busy daemon
        # reuses; slots idle beyond that give their memory back.
        max_unused_warm_slots=os.cpu_count() or 1,
    )


class EpochTicker:
    """Advances the epoch of every registered engine every `EPOCH_TICK_S`, while guest
    code may run.

    One per daemon, served by whichever executor's task came first (`serve_shared`);
    when that task ends, another one that serves takes over. An engine is ticked while
    it is `registered`, from the next tick on, and only while some thread is inside
    `running()`, the block around every call into a guest: with no guest under way the
    thread waits without a timeout, so an idle daemon has no thread waking every tick
    (each wake takes the GIL, from the event loop when a request has just come in).
    It goes on ticking for `IDLE_AFTER_TICKS` ticks after the last guest call ended,
    so executions back to back do not wake it each time.

    The ticks come from a thread of the serving task's own, not from the event loop:
    there, each tick was a Trio sleep ending in a cancellation, ~10% of the event loop's
    time while it served trivial executions back to back. Incrementing an epoch is an
    atomic add in Wasmtime, made for other threads.

    The ticker holds each engine strongly: the thread ticks a snapshot of them, so an
    engine cannot be freed while it may be ticked. Holding them weakly crashed the
    daemon: CPython runs a dying object's `__del__` before it clears the weak
    references to it, and `Engine.__del__` releases the GIL while Wasmtime frees the
    engine, so the ticker could increment the epoch of an engine being freed.
    """

    def __init__(self, interval_s: float = EPOCH_TICK_S) -> None:
        self._interval_s = interval_s
        # Replaced, never changed in place: the thread ticks whichever tuple it took.
        self._engines: tuple[wasmtime.Engine, ...] = ()
        # Interrupts the thread checks at every tick (those without an epoch callback),
        # replaced likewise.
        self._watched: frozenset[Interrupt] = frozenset()
        # Called at every tick while hooked (`hook`), replaced likewise.
        self._hooks: frozenset[Callable[[], None]] = frozenset()
        self._changed = threading.Condition()  # guards the fields below
        self._stopping = False
        self._serving = False
        # Guest calls under way, and how many ever began (the thread tells from it
        # whether any ran since its last tick).
        self._running = 0
        self._began = 0
        self._waiting_for_guests = False
        self._handover = trio.Event()

    def __repr__(self) -> str:
        return (
            f"<EpochTicker every {self._interval_s * 1000:g} ms, {len(self._engines)} engines, "
            f"{self._running} guest calls>"
        )

    @contextlib.contextmanager
    def registered(self, engine: wasmtime.Engine) -> Iterator[None]:
        """Tick `engine` for the duration of the block.

        On the way out the epoch moves once more, so every store's deadline has passed:
        a guest still running (one left behind in a blocking call, say) stops at its
        next check if its execution was stopped, rather than waiting for a tick that
        will not come.
        """
        with self._changed:
            self._engines = (*self._engines, engine)
            self._changed.notify_all()
        try:
            yield
        finally:
            with self._changed:
                self._engines = tuple(e for e in self._engines if e is not engine)
            engine.increment_epoch()

    def watch(self, interrupt: Interrupt) -> None:
        """Check `interrupt` (`Interrupt.check`) at every tick, from the next one on,
        until `unwatch`; the ticker holds it meanwhile."""
        with self._changed:
            self._watched = self._watched | {interrupt}
            self._changed.notify_all()

    def unwatch(self, interrupt: Interrupt) -> None:
        with self._changed:
            self._watched = self._watched - {interrupt}

    def hook(self, function: Callable[[], None]) -> None:
        """Call `function` from the ticker's thread at every tick while guests run,
        from the next one on, until `unhook`. It must not raise."""
        with self._changed:
            self._hooks = self._hooks | {function}

    def unhook(self, function: Callable[[], None]) -> None:
        with self._changed:
            self._hooks = self._hooks - {function}

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Tick while the block runs: around every call into a guest (any thread), for
        its deadline to be checked. Blocks nest and overlap freely."""
        with self._changed:
            self._running += 1
            self._began += 1
            if self._waiting_for_guests:
                self._changed.notify_all()
        try:
            yield
        finally:
            with self._changed:
                self._running -= 1

    async def serve_shared(self) -> None:
        """`serve` unless some task serves this ticker already; then wait, and take
        over if that task ends first. Runs until cancelled."""
        while self._serving:
            await self._handover.wait()
        self._serving = True
        try:
            await self.serve()
        finally:
            self._serving = False
            self._handover.set()
            self._handover = trio.Event()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Tick from a thread of this task's own until cancelled; the thread has ended
        when this returns."""
        with self._changed:
            self._stopping = False
        thread = threading.Thread(target=self._tick, name="conduit epoch ticker", daemon=True)
        thread.start()
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            with self._changed:
                self._stopping = True
                self._changed.notify_all()
            with trio.CancelScope(shield=True):
                # It sees `_stopping` within one round of increments.
                await trio.to_thread.run_sync(thread.join)

    def _tick(self) -> None:
        """The ticking thread: until stopped, tick every registered engine, then wait
        a tick's interval; with no engine registered, or no guest call for
        `IDLE_AFTER_TICKS` ticks, wait until there is one."""
        quiet_ticks = IDLE_AFTER_TICKS  # nothing has run yet
        began = self._began
        while True:
            with self._changed:
                if self._running or self._began != began:
                    quiet_ticks = 0
                if quiet_ticks >= IDLE_AFTER_TICKS or not (self._engines or self._watched):
                    self._wait_for_guests()
                    quiet_ticks = 0
                began = self._began
                if self._stopping:
                    return
                engines, watched, hooks = self._engines, self._watched, self._hooks
            for engine in engines:
                engine.increment_epoch()
            for interrupt in watched:
                interrupt.check()
            for function in hooks:
                function()
            del engines, watched, hooks  # hold no engine while waiting
            quiet_ticks += 1
            with self._changed:
                if self._changed.wait_for(lambda: self._stopping, self._interval_s):
                    return

    def _wait_for_guests(self) -> None:
        """Until an engine is registered or an interrupt watched and a guest call is
        under way, or stopping (with `_changed` held)."""
        self._waiting_for_guests = True
        try:
            self._changed.wait_for(
                lambda: self._stopping or ((self._engines or self._watched) and self._running)
            )
        finally:
            self._waiting_for_guests = False


# The daemon's one ticker, shared by every Wasmtime executor in the process.
TICKER = EpochTicker()


async def serve_ticker() -> None:
    """Run the shared ticker, now or once the task running it ends; until cancelled."""
    await TICKER.serve_shared()


def stops_by_callback() -> bool:
    """Whether interrupts made now stop their guests through the epoch callback
    (`_wasmtime_private`), so stores may share an engine the ticker ticks; otherwise
    each store that runs a program needs an engine of its own, never ticked."""
    return private.AVAILABLE


def ticking(engine: wasmtime.Engine) -> contextlib.AbstractContextManager[None]:
    """`TICKER.registered(engine)` where stores stop through the epoch callback; a
    no-op otherwise: there a tick would trap every store of `engine`."""
    return TICKER.registered(engine) if stops_by_callback() else contextlib.nullcontext()


class StopReason(enum.Enum):
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    OUTPUT_LIMIT = "output_limit"
    FILES_LIMIT = "files_limit"
    # Given back to the daemon to run elsewhere (`Job.move_after_cpu_s`).
    MOVED = "moved"


# How often an interrupt's `watch` check runs, at most.
WATCH_EVERY_S = 0.05


@dataclass(slots=True)
class _Watch:
    check: Callable[[], StopReason | None]
    every_s: float
    due: float = 0.0


class Interrupt:
    """When one store's guest must stop: its wall deadline, or a reason set from outside.

    `stop` may be called from any thread. With `_wasmtime_private`, the store's epoch
    callback, which runs in the thread running the guest, turns it into a trap within
    one tick. Without it, the ticker's thread checks the deadline and `watch` at every
    tick (`check`), and a stop moves the epoch of the store's engine, which the store
    has to itself: the guest traps at its next epoch check (see `install`).
    """

    def __init__(self, timeout_s: float) -> None:
        self.deadline = time.monotonic() + timeout_s
        self.reason: StopReason | None = None
        # Kept alive with self; None without `_wasmtime_private`.
        self._callback = private.deadline_callback(self._on_deadline) if private.AVAILABLE else None
        self._watches: tuple[_Watch, ...] = ()
        # Without the callback: the engine whose epoch stops the guest, while installed
        # (guarded by `_installed`, so that no stop reaches the store installed after).
        self._engine: wasmtime.Engine | None = None
        self._installed = threading.Lock()

    def stop(self, reason: StopReason) -> None:
        if self.reason is None:
            self.reason = reason
        if self._engine is not None:
            with self._installed:
                if self._engine is not None:
                    self._engine.increment_epoch()

    def watch(
        self, check: Callable[[], StopReason | None], *, every_s: float = WATCH_EVERY_S
    ) -> None:
        """Also stop for the reason `check` returns, if any: it runs on the guest's
        thread between its instructions (or on the ticker's, without the callback), at
        most every `every_s` (0: at every tick). It must not raise."""
        self._watches = (*self._watches, _Watch(check, every_s))

    def install(self, store: wasmtime.Store, engine: wasmtime.Engine) -> None:
        """Check this interrupt every tick while `store` (of `engine`) runs guest code.

        With `_wasmtime_private`, the store keeps only a pointer to this object's
        callback: keep the object alive for as long as it is installed (until the
        store is closed or another is). Without it, `engine` must be the store's
        alone and never ticked (see `ticking`): a stop moves its epoch, which traps the
        store's guest; `uninstall` before closing the store or installing another.
        """
        store.set_epoch_deadline(1)
        if self._callback is not None:
            private.set_deadline_callback(store, self._callback)
            return
        with self._installed:
            self._engine = engine
        TICKER.watch(self)
        if self.reason is not None:
            self.stop(self.reason)

    def uninstall(self) -> None:
        """No longer stop the store `install` was given (without the callback; a no-op
        with it, or if not installed)."""
        if self._engine is None:
            return
        TICKER.unwatch(self)
        with self._installed:
            self._engine = None

    def check(self) -> None:
        """Stop if the deadline has passed or `watch` says so (the ticker's thread,
        every tick, without the callback); once stopped, `stop` has moved the epoch."""
        if self.reason is None:
            reason = self._due(time.monotonic())
            if reason is not None:
                self.stop(reason)

    def _due(self, now: float) -> StopReason | None:
        """Why the guest must stop now, if it must (set as `reason`)."""
        if self.reason is None and now >= self.deadline:
            self.reason = StopReason.TIMEOUT
        for watch in self._watches:
            if self.reason is None and now >= watch.due:
                watch.due = now + watch.every_s
                reason = watch.check()
                # Only a reason: a stop from another thread while the check ran (it may
                # release the GIL) must not be overwritten by its None.
                if reason is not None and self.reason is None:
                    self.reason = reason
        return self.reason

    def _on_deadline(self, _context, _data, delta, kind) -> int:  # type: ignore[no-untyped-def]
        if self._due(time.monotonic()) is not None:
            return private.new_error(f"conduit: execution stopped ({self.reason.value})")
        delta[0] = 1
        kind[0] = private.CONTINUE
        return 0


def cpu_key() -> str:
    """What compiled code depends on besides Wasmtime: architecture and CPU features."""
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith(("flags", "Features")):
                    flags = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    digest = hashlib.sha256(flags.encode()).hexdigest()[:12]
    return f"{platform.machine()}-{digest}"


class CompiledCache(enum.StrEnum):
    """How `load_component` got the compiled component."""

    HIT = "hit"  # deserialized from a valid cache file
    MISS = "miss"  # compiled; there was no cache file
    REBUILT = "rebuilt"  # compiled; the cache file was corrupt and was replaced


@dataclass(frozen=True, slots=True)
class LoadedComponent:
    component: wasmtime.component.Component
    cache: CompiledCache
    path: Path
    seconds: float
    # The `file_version` of the compiled file whose bytes were checked and mapped.
    version: tuple[int, ...] = ()


def load_component(
    engine: wasmtime.Engine, wasm_path: Path, component_hash: str, *, fuel: bool = False
) -> LoadedComponent:
    """The compiled component for `wasm_path`, from the cache beside it if valid.

    `fuel` must say whether `engine` counts fuel: code compiled for one setting does
    not load into the other, so each has its own cache file.
    Blocking (seconds when compiling): call it in a worker thread.
    """
    key = f"{component_hash[:16]}-wasmtime{wasmtime_version()}-{cpu_key()}"
    if fuel:
        key += "-fuel"
    compiled = wasm_path.with_name(f"compiled-{key}.cwasm")
    started = time.perf_counter()
    with _compile_lock(compiled.with_suffix(".lock")):
        component, state, version = _load_or_compile(engine, wasm_path, compiled)
    return LoadedComponent(component, state, compiled, time.perf_counter() - started, version)


def map_again(
    engine: wasmtime.Engine, loaded: LoadedComponent
) -> wasmtime.component.Component | None:
    """`loaded`'s component in another `engine` (configured alike), mapped from the
    file `load_component` checked, without checking its bytes again: None if that
    file has changed since (then `load_component` it). Blocking."""
    try:
        if file_version(loaded.path) != loaded.version:
            return None
        component = wasmtime.component.Component.deserialize_file(engine, str(loaded.path))
        return component if file_version(loaded.path) == loaded.version else None
    except (OSError, wasmtime.WasmtimeError):
        return None


def _load_or_compile(
    engine: wasmtime.Engine, wasm_path: Path, compiled: Path
) -> tuple[wasmtime.component.Component, CompiledCache, tuple[int, ...]]:
    checksum = compiled.with_suffix(".sha256")
    state = CompiledCache.MISS
    if compiled.exists():
        expected = checksum.read_text().strip() if checksum.exists() else ""
        version = file_version(compiled)
        if sha256_hex(compiled) == expected:
            try:
                # Mapped, not read: its pages are the page cache's, shared by every
                # engine that loads it. Cache files are only ever replaced (and are
                # read-only), never written in place, so the mapping keeps the bytes
                # that were checked, if the file is still the one that was.
                component = wasmtime.component.Component.deserialize_file(engine, str(compiled))
                if file_version(compiled) == version:
                    return component, CompiledCache.HIT, version
                log.warning("the compiled cache %s changed as it loaded; compiling", compiled)
            except wasmtime.WasmtimeError as exc:
                log.warning("the compiled cache %s did not load (%s); compiling", compiled, exc)
        else:
            log.warning("the compiled cache %s is corrupt; compiling again", compiled)
        state = CompiledCache.REBUILT
    data = bytes(wasmtime.component.Component.from_file(engine, str(wasm_path)).serialize())
    _write_atomically(compiled, data)
    _write_atomically(checksum, hashlib.sha256(data).hexdigest().encode())
    del data
    # Loaded as a later start loads it, mapped from its file, and the heap compiling
    # left behind (hundreds of megabytes, freed but kept by the C allocator) given back.
    version = file_version(compiled)
    component = wasmtime.component.Component.deserialize_file(engine, str(compiled))
    release_free_memory()
    return component, state, version


@contextlib.contextmanager
def _compile_lock(path: Path) -> Iterator[None]:
    """Hold the lock at `path` for the block, once another process lets go of it.

    Polled, so the wait has a bound: a peer holding it for ever (a stopped process,
    say) delays this start by `COMPILE_LOCK_WAIT_S` (logged), then it goes on
    without. Where no lock file can be made (a read-only cache), it goes on at once.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        yield
        return
    try:
        if not _take(fd, time.monotonic() + COMPILE_LOCK_WAIT_S, path.stem):
            log.warning("%s stayed locked for %d s: going on without", path, COMPILE_LOCK_WAIT_S)
        yield
    finally:
        os.close(fd)  # lets go of the lock


def _take(fd: int, deadline: float, what: str) -> bool:
    """Whether the flock on `fd` was taken before `deadline`."""
    waiting = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            if not waiting:
                waiting = True
                log.info("waiting for another process compiling %s", what)
            time.sleep(COMPILE_LOCK_POLL_S)


def release_free_memory() -> None:
    """Give memory the C allocator holds free back to the system: glibc's malloc_trim,
    where there is one (elsewhere nothing is done)."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)


_LIBC = ctypes.CDLL(None)


def _write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with a read-only file holding `data`: a loaded component maps its
    file, and one written in place under it would crash the daemon."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    temporary.write_bytes(data)
    temporary.chmod(0o444)
    os.replace(temporary, path)
