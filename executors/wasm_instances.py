"""Instances of one Wasmtime component, and those made before they are needed.

Instantiating is part of every execution's cost: ~0.1 ms for the JavaScript guest,
~1 ms for CPython (measured on a two-core VM). So each runner thread (`wasm_runners`)
makes its next instance (`standby`) before it is needed, while nobody waits for it. A
standby instance has never run a program: making it ahead changes when the component
is instantiated, not what a program finds in it.

What an instance needs that depends on its execution (the memory limit, the fuel
budget, the interrupt, where its output goes) is set when an execution takes it; only
what Wasmtime fixes at instantiation is fixed ahead: the WASI context, whose output
goes through an `OutputRoute` (`wasm_output`) that drops everything until the execution
attaches its sink. A store's memory limit also bounds the memory an instance starts with, so
standby instances have none: an execution may take one only if its own limit is at
least what the component starts with, `base_memory_mib` (the executor refuses the
others before they run, saying so).

Each store also holds the helper that bounds its guest's clock (`wasm_clock`), made
with the store; the store's clock is current on the thread while its guest runs
(`Instance.running`).

Everything here blocks (instantiating, closing stores): call it in worker threads. A
store is used by one thread at a time.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import wasmtime
import wasmtime.component

from conduit.executors import _wasmtime
from conduit.executors.scratch import Scratch, ScratchDirs
from conduit.executors.wasm_calls import StringExport
from conduit.executors.wasm_clock import BoundedClock, StoreClock
from conduit.executors.wasm_output import OutputRoute

__all__ = ["BaseMemoryRecord", "Instance", "Instances"]

log = logging.getLogger(__name__)

MIB = 1024 * 1024
# The export the host calls (shims/world.wit).
RUN_EXPORT = "run"
# The wall time instantiating may take before it is interrupted: the component's
# start-up code is ours and takes milliseconds; this only bounds a broken build.
INSTANTIATE_TIMEOUT_S = 30.0
# Fuel for instantiating, when fuel is counted: the execution's own budget is set when
# it takes the instance, so a program's budget is the same in every one.
INSTANTIATE_FUEL = 1 << 62
# How Wasmtime refuses to instantiate under a memory limit below the component's start.
LIMIT_REFUSED = "exceeds memory limits"
# The first instance of a component builds its memory images, each sealed in a memfd,
# and the kernel refuses the seal (EBUSY) while anything else holds one of its pages:
# for a moment, on a loaded machine (seen once in CI). Wasmtime keeps no failed image,
# so a later try builds it anew. Tries, and the wait before the second (then doubled).
FIRST_INSTANCE_TRIES = 4
FIRST_INSTANCE_BACKOFF_S = 0.05
# The largest memory limit tried when finding the smallest that instantiates: the
# pool's bound per memory (see `_wasmtime`), in MiB.
MAX_MEMORY_MIB = _wasmtime.POOL_MEMORY_BYTES // MIB
# Beside a component, the base memory found for it under each set of instance options.
BASE_MEMORY_FILE = "base-memory.json"
# Where an instance sees its scratch directory.
SCRATCH_GUEST = "/tmp"
# What a guest given a scratch directory is first called with, as its instance is made:
# it enters the directory then, ahead of its execution (see shims/wasm_python/guest.py).
PREPARE_REQUEST = ""


@dataclass(slots=True)
class Instance:
    """A store holding one instance of the component, its `run` export and output."""

    store: wasmtime.Store
    # The store's engine, whose epoch stops it where interrupts have no callback.
    engine: wasmtime.Engine
    run: StringExport
    output: OutputRoute
    # The interrupt the store calls back into: it must live as long as it is installed
    # (the store holds only a pointer to its callback).
    interrupt: _wasmtime.Interrupt
    # Bounds the guest's waits by the interrupt's deadline; None if unbounded.
    clock: StoreClock | None = None
    # The directory its files go to, if it may write any.
    scratch: Scratch | None = None

    def install(self, interrupt: _wasmtime.Interrupt, *, disk_bytes: int | None = None) -> None:
        """Stop the guest by `interrupt` from now on (the execution's, when taken), and
        once its files take more than `disk_bytes` (if given and it has a scratch
        directory: a guest whose files go through the host is checked there instead)."""
        self.interrupt.uninstall()
        if _wasmtime.stops_by_callback():  # between the guest's own instructions
            interrupt.watch(self.output.between_instructions, every_s=0.0)
        interrupt.install(self.store, self.engine)
        self.interrupt = interrupt
        if self.clock is not None:
            self.clock.interrupt = interrupt
        if self.scratch is not None and disk_bytes is not None:
            interrupt.watch(functools.partial(_files_over, self.scratch, disk_bytes))

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Around every call into the guest, on the thread making it."""
        clock = self.clock.running() if self.clock is not None else _NOTHING
        with _wasmtime.TICKER.running(), clock, self.output.current():
            yield

    def close(self) -> None:
        try:
            self.interrupt.uninstall()
            self.store.close()
        finally:
            self.output.close()
            if self.scratch is not None:
                self.scratch.release()


_NOTHING = contextlib.nullcontext()


def _files_over(scratch: Scratch, max_bytes: int) -> _wasmtime.StopReason | None:
    return _wasmtime.StopReason.FILES_LIMIT if scratch.over(max_bytes) else None


@dataclass(frozen=True)
class BaseMemoryRecord:
    """The base memory found for a component under one set of instance options
    (`key`), kept in `BASE_MEMORY_FILE` in the component's directory, so that an
    executor's next start need not find it again. Only what is sane is taken from the
    file (anything else is found again); a record that cannot be written is logged.
    """

    component_dir: Path
    key: str

    @classmethod
    def of(cls, component_dir: Path, *parts: object) -> BaseMemoryRecord:
        """The record for the options `parts` (the component's hash among them)."""
        digest = hashlib.sha256(json.dumps([str(part) for part in parts]).encode())
        return cls(component_dir, digest.hexdigest()[:32])

    def get(self) -> int | None:
        value = self._read().get(self.key)
        return value if type(value) is int and 1 <= value <= MAX_MEMORY_MIB else None

    def put(self, mib: int) -> None:
        kept = {**self._read(), self.key: mib}
        target = self.component_dir / BASE_MEMORY_FILE
        # Whole or not at all: another process may be reading it.
        partial = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            partial.write_text(json.dumps(kept))
            os.replace(partial, target)
        except OSError as exc:
            log.warning("the base memory could not be recorded: %s", exc)
            partial.unlink(missing_ok=True)

    def _read(self) -> dict[str, object]:
        try:
            kept = json.loads((self.component_dir / BASE_MEMORY_FILE).read_text())
        except (OSError, ValueError, RecursionError):
            return {}
        return kept if isinstance(kept, dict) else {}


class Instances:
    """Makes instances of `component` with `linker`, whose waits `clock` bounds (when
    it does: see `BoundedClock.install`), each seeing the host directories of
    `read_only` (host path, guest path), those of `writable` read-write (a build's
    staging directory, never a program's), a fresh directory of `scratch` to write its
    files in (if given: at SCRATCH_GUEST if `preopen_scratch`, else the guest reaches
    it only through the host, see `wasm_fs`), and nothing else of the host.

    Creating it makes a first instance, then finds `base_memory_mib` by instantiating
    under shrinking limits (a dozen instances, most of an executor's start), unless
    `base_memory_mib` is given (found for the same component in another engine), or
    `record` has it from an earlier start (and gets it when found): blocking, like
    every method.
    """

    def __init__(
        self,
        engine: wasmtime.Engine,
        linker: wasmtime.component.Linker,
        component: wasmtime.component.Component,
        *,
        fuel: bool,
        clock: BoundedClock | None = None,
        read_only: Sequence[tuple[Path, str]] = (),
        writable: Sequence[tuple[Path, str]] = (),
        scratch: ScratchDirs | None = None,
        preopen_scratch: bool = True,
        base_memory_mib: int | None = None,
        record: BaseMemoryRecord | None = None,
    ) -> None:
        self._engine = engine
        self._preopen_scratch = preopen_scratch
        self._clock = clock
        self._read_only = tuple(read_only)
        self._writable = tuple(writable)
        self._scratch = scratch
        self._linker = linker
        self._component = component
        self._fuel = fuel
        # Whether its guests' waits end by their deadlines (`wasm_clock`).
        self.bounded_waits = clock is not None
        if base_memory_mib is not None:
            self.base_memory_mib = base_memory_mib
            return
        self._first_instance()
        recorded = record.get() if record is not None else None
        if recorded is not None:
            self.base_memory_mib = recorded
            return
        self.base_memory_mib = self._smallest_memory_mib()
        if record is not None:
            record.put(self.base_memory_mib)

    def __repr__(self) -> str:
        return f"<Instances from {self.base_memory_mib} MiB>"

    def new(self, memory_bytes: int | None = None) -> Instance:
        """A new instance, its memory limited to `memory_bytes` (None: the pool's bound).

        Raises `wasmtime.WasmtimeError` (or `Trap`) if it cannot be instantiated, for
        one when the limit is below what the component starts with.
        """
        store = wasmtime.Store(self._engine)
        scratch = self._scratch.new() if self._scratch is not None else None
        interrupt: _wasmtime.Interrupt | None = None
        output = OutputRoute()
        try:
            if memory_bytes is not None:
                store.set_limits(memory_size=memory_bytes)
            if self._fuel:
                store.set_fuel(INSTANTIATE_FUEL)
            wasi = wasmtime.WasiConfig()
            output.configure(wasi)
            for host, guest in self._read_only:
                wasi.preopen_dir(str(host), guest, fs_mutable=False)
            for host, guest in self._writable:
                wasi.preopen_dir(str(host), guest, fs_mutable=True)
            if scratch is not None and self._preopen_scratch:
                wasi.preopen_dir(str(scratch.path), SCRATCH_GUEST, fs_mutable=True)
            store.set_wasi(wasi)
            interrupt = _wasmtime.Interrupt(INSTANTIATE_TIMEOUT_S)
            interrupt.install(store, self._engine)
            clock = self._clock.attach(store, interrupt) if self._clock is not None else None
            guest = clock.running() if clock is not None else _NOTHING
            with _wasmtime.TICKER.running(), guest:
                run = self._linker.instantiate(store, self._component).get_func(store, RUN_EXPORT)
                if run is None:
                    raise wasmtime.WasmtimeError(f"the component exports no {RUN_EXPORT!r}")
                export = StringExport(run)
                if scratch is not None and self._preopen_scratch:
                    export(store, PREPARE_REQUEST)
            output.finish()  # nobody's: what instantiating wrote
        except BaseException:
            if interrupt is not None:
                interrupt.uninstall()
            store.close()
            output.close()
            if scratch is not None:
                scratch.remove()
            raise
        return Instance(store, self._engine, export, output, interrupt, clock, scratch)

    def standby(self) -> Instance | None:
        """A new instance without a memory limit, made ahead of its execution; None if
        that failed (logged: the execution makes its own, and reports why it fails)."""
        try:
            return self.new()
        except (wasmtime.WasmtimeError, wasmtime.Trap) as exc:
            log.warning("an instance could not be made ahead: %s", exc)
            return None

    def _first_instance(self) -> None:
        """Make and drop one instance, trying again a few times if it fails: the first
        builds the memory images, which can fail for a moment (see
        `FIRST_INSTANCE_TRIES`). Raises the last failure."""
        for attempt in range(FIRST_INSTANCE_TRIES):
            try:
                self.new().close()
                return
            except wasmtime.WasmtimeError as exc:
                if attempt + 1 == FIRST_INSTANCE_TRIES:
                    raise
                log.warning("the first instance could not be made (%s); trying again", exc)
                time.sleep(FIRST_INSTANCE_BACKOFF_S * 2**attempt)

    def _smallest_memory_mib(self) -> int:
        """The smallest memory limit, in whole MiB, under which the component
        instantiates (a binary search; each failed try fails before mapping anything).

        Only Wasmtime's refusal of the limit counts as "too small": any other failure
        is raised, rather than taken for a component that needs gigabytes (which would
        refuse every execution for the executor's life).
        """
        low, high = 1, MAX_MEMORY_MIB
        while low < high:
            middle = (low + high) // 2
            try:
                self.new(middle * MIB).close()
            except wasmtime.WasmtimeError as exc:
                if LIMIT_REFUSED not in str(exc):
                    raise
                low = middle + 1
            else:
                high = middle
        return low
