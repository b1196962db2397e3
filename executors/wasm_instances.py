"""Instances of one Wasmtime component, a few of them made before they are needed.

Instantiating is part of every execution's cost: ~0.1 ms for the JavaScript guest,
~1 ms for CPython (measured on a two-core VM). `Instances` keeps up to `standby`
instances made ahead, in the worker thread that has just closed its execution's store,
so that an execution starts in one that exists already. A standby instance has never
run a program: making it ahead changes when the component is instantiated, not what
a program finds in it. Each is taken by exactly one execution and closed after it, like
an instance made on the spot.

What an instance needs that depends on its execution (the memory limit, the fuel
budget, the interrupt, where its output goes) is set when it is taken; only what
Wasmtime fixes at instantiation is fixed ahead: the WASI context, whose output goes
through an `OutputRoute` that drops everything until the execution attaches its sink.
A store's memory limit also bounds the memory an instance starts with, so standby
instances are made without one: an execution may take one only if its own limit is
at least what the component starts with, `base_memory_mib` (the executor refuses the
others before they run, saying so).

Every method but `take` blocks (instantiating, closing stores): call them in worker
threads. A store is used by one thread at a time, though not always the thread that
made it; Wasmtime allows a store to move between threads.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import wasmtime
import wasmtime.component

from conduit.executors import _wasmtime
from conduit.executors.output import StreamName

__all__ = ["Instance", "Instances", "OutputRoute"]

log = logging.getLogger(__name__)

MIB = 1024 * 1024
# The export the host calls (shims/world.wit).
RUN_EXPORT = "run"
# The wall time instantiating may take before it is interrupted: the component's
# start-up code is ours and takes milliseconds; this only bounds a broken build.
INSTANTIATE_TIMEOUT_S = 30.0
# Fuel for instantiating, when fuel is counted: the execution's own budget is set when
# the instance is taken, so the program's budget is the same whenever it was made.
INSTANTIATE_FUEL = 1 << 62
# The largest memory limit tried when finding the smallest that instantiates: the
# pool's bound per memory (see `_wasmtime`), in MiB.
MAX_MEMORY_MIB = _wasmtime.POOL_MEMORY_BYTES // MIB


class OutputRoute:
    """Where an instance's stdout and stderr go: nowhere until `attach` names a sink."""

    __slots__ = ("_sink",)

    def __init__(self) -> None:
        self._sink: Callable[[StreamName, bytes], None] | None = None

    def attach(self, sink: Callable[[StreamName, bytes], None]) -> None:
        self._sink = sink

    def stdout(self, data: bytes) -> None:
        if self._sink is not None:
            self._sink("stdout", data)

    def stderr(self, data: bytes) -> None:
        if self._sink is not None:
            self._sink("stderr", data)


@dataclass(slots=True)
class Instance:
    """A store holding one instance of the component, its `run` export and output."""

    store: wasmtime.Store
    run: wasmtime.component.Func
    output: OutputRoute
    # The interrupt the store calls back into: it must live as long as it is installed
    # (the store holds only a pointer to its callback).
    interrupt: _wasmtime.Interrupt

    def install(self, interrupt: _wasmtime.Interrupt) -> None:
        """Stop the guest by `interrupt` from now on (the execution's, when taken)."""
        interrupt.install(self.store)
        self.interrupt = interrupt

    def close(self) -> None:
        self.store.close()


class Instances:
    """Makes instances of `component`, keeping up to `standby` made ahead.

    Creating it finds `base_memory_mib` by instantiating under shrinking limits (a few
    milliseconds up to ~50 for CPython, once): blocking, like everything but `take`.
    """

    def __init__(
        self,
        engine: wasmtime.Engine,
        linker: wasmtime.component.Linker,
        component: wasmtime.component.Component,
        *,
        fuel: bool,
        standby: int,
    ) -> None:
        self._engine = engine
        self._linker = linker
        self._component = component
        self._fuel = fuel
        self._standby = standby
        self._ready: collections.deque[Instance] = collections.deque()
        self._lock = threading.Lock()  # guards _making and _closed across threads
        self._making = 0
        self._closed = False
        self.base_memory_mib = self._smallest_memory_mib()

    def __repr__(self) -> str:
        return f"<Instances {len(self._ready)}/{self._standby} standing by>"

    @property
    def standing_by(self) -> int:
        return len(self._ready)

    def new(self, memory_bytes: int | None = None) -> Instance:
        """A new instance, its memory limited to `memory_bytes` (None: the pool's bound).

        Raises `wasmtime.WasmtimeError` (or `Trap`) if it cannot be instantiated, for
        one when the limit is below what the component starts with.
        """
        store = wasmtime.Store(self._engine)
        try:
            if memory_bytes is not None:
                store.set_limits(memory_size=memory_bytes)
            if self._fuel:
                store.set_fuel(INSTANTIATE_FUEL)
            output = OutputRoute()
            wasi = wasmtime.WasiConfig()
            wasi.stdout_custom = output.stdout
            wasi.stderr_custom = output.stderr
            store.set_wasi(wasi)
            interrupt = _wasmtime.Interrupt(INSTANTIATE_TIMEOUT_S)
            interrupt.install(store)
            run = self._linker.instantiate(store, self._component).get_func(store, RUN_EXPORT)
            if run is None:
                raise wasmtime.WasmtimeError(f"the component exports no {RUN_EXPORT!r}")
        except BaseException:
            store.close()
            raise
        return Instance(store, run, output, interrupt)

    def take(self) -> Instance | None:
        """A standby instance, if one is ready; never blocks. Its store has no memory
        limit yet: set one of at least `base_memory_mib`."""
        try:
            return self._ready.popleft()
        except IndexError:
            return None

    def refill(self) -> None:
        """Make instances until `standby` are ready (or being made by other threads)."""
        while self._reserve():
            instance: Instance | None = None
            try:
                instance = self.new()
            except (wasmtime.WasmtimeError, wasmtime.Trap) as exc:
                # The next execution makes its own instance, and reports why if it fails.
                log.warning("a standby instance could not be made: %s", exc)
            with self._lock:
                self._making -= 1
                kept = instance is not None and not self._closed
                if kept:
                    self._ready.append(instance)
            if not kept:
                if instance is not None:
                    instance.close()
                return

    def close(self) -> None:
        """Close the standby instances; those still being made are closed when done."""
        with self._lock:
            self._closed = True
        while self._ready:
            self._ready.popleft().close()

    def _reserve(self) -> bool:
        with self._lock:
            if self._closed or len(self._ready) + self._making >= self._standby:
                return False
            self._making += 1
            return True

    def _smallest_memory_mib(self) -> int:
        """The smallest memory limit, in whole MiB, under which the component
        instantiates (a binary search; each failed try fails before mapping anything)."""
        low, high = 1, MAX_MEMORY_MIB
        while low < high:
            middle = (low + high) // 2
            try:
                self.new(middle * MIB).close()
            except (wasmtime.WasmtimeError, wasmtime.Trap):
                low = middle + 1
            else:
                high = middle
        return low
