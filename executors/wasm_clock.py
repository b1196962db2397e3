"""The guest's monotonic clock, whose every wait ends by its execution's deadline.

Epoch interruption stops guest code, not a thread blocked inside a WASI call: a guest
sleeping in `wasi:io/poll` would hold its runner thread (and its store's memory) for as
long as it asked. Every wait a guest can make is a poll on pollables, and of the
pollables it can get only the monotonic clock's may stay pending: stdout and stderr
take writes at once, stdin is empty, files are local (a read or write never waits on
anything), and no socket can connect or resolve anything, so their pollables are
always ready. So bounding the clock's subscriptions bounds every wait, whatever code
the guest reaches.

`BoundedClock.install` shadows the component's `wasi:clocks/monotonic-clock` import
with host functions. `subscribe-duration` and `subscribe-instant` forward to
Wasmtime's own `subscribe-duration`, with the wait clamped to what is left of the
running execution's time (`_wasmtime.Interrupt`): a timer set past the deadline fires
at the deadline, where the epoch check stops the guest, so the clamp is never seen.
Wasmtime's own function is reached through a tiny helper component (`HELPER_WAT`,
instantiated in every store beside the guest: the pollable it returns must be
Wasmtime's own type, which only a function of Wasmtime's can make). `now` counts from
the store's making, so a program learns nothing of the host's uptime, and stands
still while the guest waits for a CPU slot (`StoreClock.pause`, see `wasm_slots`), as
its deadline does: a program's own clamps on its waits (the Python runner's sleep)
keep agreeing with the host's.

Which execution a host call belongs to is the store's `StoreClock`, current on the
thread running the store (`StoreClock.running`): a store runs on one thread at a time.

Only public wasmtime-py APIs are used (linker shadowing, `add_instance`, `add_func`,
component calls). If the component cannot be linked this way, `install` says so and
the executor runs with Wasmtime's unbounded clock (see `wasm.py` for what then
bounds a blocked guest).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

import wasmtime
import wasmtime.component

from conduit.executors import _wasmtime
from conduit.executors.wasm_calls import add_u64_import

__all__ = ["HELPER_WAT", "BoundedClock", "StoreClock"]

log = logging.getLogger(__name__)

CLOCK_INTERFACE = "wasi:clocks/monotonic-clock@"
SUBSCRIBE_EXPORT = "subscribe-duration"
# Re-exports Wasmtime's `subscribe-duration`: lowered into a one-function core module
# and lifted back, so a host function can call it in the guest's store. 0.2.0 imports
# resolve to whichever 0.2.x the linker defines.
HELPER_WAT = """
(component
  (import "wasi:io/poll@0.2.0" (instance $poll
    (export "pollable" (type (sub resource)))))
  (alias export $poll "pollable" (type $pollable))
  (import "wasi:clocks/monotonic-clock@0.2.0" (instance $clock
    (alias outer 1 $pollable (type $p))
    (export "pollable" (type $pe (eq $p)))
    (export "subscribe-duration" (func (param "when" u64) (result (own $pe))))))
  (core func $lowered (canon lower (func $clock "subscribe-duration")))
  (core module $forward
    (import "" "subscribe" (func $subscribe (param i64) (result i32)))
    (func (export "subscribe") (param i64) (result i32) local.get 0 call $subscribe))
  (core instance $forwarding
    (instantiate $forward (with "" (instance (export "subscribe" (func $lowered))))))
  (func (export "subscribe-duration") (param "when" u64) (result (own $pollable))
    (canon lift (core func $forwarding "subscribe"))))
"""
# The resolution `resolution` reports, in nanoseconds: `time.monotonic_ns`'s unit.
RESOLUTION_NS = 1
# The store whose guest this thread is running, for the clock's host functions.
_CURRENT = threading.local()


class ClockStopped(wasmtime.WasmtimeError):
    """A wait asked for with no execution to bound it; traps the guest."""


class StoreClock:
    """One store's clock: where it counts from, Wasmtime's subscribe in that store,
    and the interrupt whose deadline bounds its waits (the execution's, once taken)."""

    __slots__ = ("_origin_ns", "_subscribe", "interrupt")

    def __init__(self, subscribe: wasmtime.component.Func, interrupt: _wasmtime.Interrupt) -> None:
        self._origin_ns = time.monotonic_ns()
        self._subscribe = subscribe
        self.interrupt = interrupt

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The block runs this store's guest on this thread."""
        previous = getattr(_CURRENT, "clock", None)
        _CURRENT.clock = self
        try:
            yield
        finally:
            _CURRENT.clock = previous

    def now_ns(self) -> int:
        return time.monotonic_ns() - self._origin_ns

    def pause(self, seconds: float) -> None:
        """Take `seconds` just passed off the clock (any thread): time the guest spent
        waiting for a CPU slot is not its own, and its deadline moved on by as much."""
        self._origin_ns += int(seconds * 1e9)

    def subscribe(self, store: object, wait_ns: int) -> object:
        """Wasmtime's pollable for `wait_ns`, clamped to the execution's deadline.

        Once the execution is stopped or its time is up, raises `ClockStopped` (a trap
        saying why) instead: a guest that has no time left must not go on."""
        interrupt = self.interrupt
        left_ns = int((interrupt.deadline - time.monotonic()) * 1e9)
        if left_ns <= 0:
            interrupt.stop(_wasmtime.StopReason.TIMEOUT)
        if interrupt.reason is not None:
            raise ClockStopped(f"conduit: execution stopped ({interrupt.reason.value})")
        pollable = self._subscribe(store, min(max(0, wait_ns), left_ns))
        self._subscribe.post_return(store)
        return pollable


def _running() -> StoreClock:
    clock: StoreClock | None = getattr(_CURRENT, "clock", None)
    if clock is None:
        raise ClockStopped("conduit: a wait outside any execution")
    return clock


def _now() -> int:
    clock: StoreClock | None = getattr(_CURRENT, "clock", None)
    return clock.now_ns() if clock is not None else 0


def _resolution(_store: object) -> int:
    return RESOLUTION_NS


def _subscribe_duration(store: object, wait_ns: int) -> object:
    return _running().subscribe(store, wait_ns)


def _subscribe_instant(store: object, when_ns: int) -> object:
    clock = _running()
    return clock.subscribe(store, when_ns - clock.now_ns())


class BoundedClock:
    """Shadows a component's monotonic clock in its linker, and attaches each store's.

    After `install` answers False (logged, with the reason), `attach` returns None and
    the linker may be half changed: link the component with a fresh one.
    """

    def __init__(self, engine: wasmtime.Engine) -> None:
        self._engine = engine
        self._helper: wasmtime.component.Component | None = None
        self._helper_linker: wasmtime.component.Linker | None = None

    @property
    def bounded(self) -> bool:
        return self._helper is not None

    def install(
        self, linker: wasmtime.component.Linker, component: wasmtime.component.Component
    ) -> bool:
        """Shadow `component`'s monotonic clock in `linker` (which has WASI already);
        whether the waits are bounded. Blocking: compiles the helper."""
        try:
            interface = _clock_import(self._engine, component)
            helper = wasmtime.component.Component(self._engine, HELPER_WAT)
            helper_linker = wasmtime.component.Linker(self._engine)
            helper_linker.add_wasip2()
            linker.allow_shadowing = True
            with linker.root() as root, root.add_instance(interface) as clock:
                # Through the C API: a guest reads it on every run, SpiderMonkey ~9
                # times (0.17 ms of a trivial run through wasmtime-py's generic call).
                add_u64_import(clock, "now", _now)
                clock.add_func("resolution", _resolution)
                clock.add_func("subscribe-duration", _subscribe_duration)
                clock.add_func("subscribe-instant", _subscribe_instant)
            linker.allow_shadowing = False
        except (wasmtime.WasmtimeError, LookupError, AttributeError, TypeError) as exc:
            log.warning("guest waits are not bounded on the host (%s): %s", type(exc).__name__, exc)
            return False
        self._helper, self._helper_linker = helper, helper_linker
        return True

    def attach(self, store: wasmtime.Store, interrupt: _wasmtime.Interrupt) -> StoreClock | None:
        """The clock of `store`, with its helper instantiated there; None if unbounded.
        Raises `wasmtime.WasmtimeError` if the helper does not instantiate."""
        if self._helper is None or self._helper_linker is None:
            return None
        instance = self._helper_linker.instantiate(store, self._helper)
        subscribe = instance.get_func(store, SUBSCRIBE_EXPORT)
        if subscribe is None:
            raise wasmtime.WasmtimeError(f"the clock helper exports no {SUBSCRIBE_EXPORT!r}")
        return StoreClock(subscribe, interrupt)


def _clock_import(engine: wasmtime.Engine, component: wasmtime.component.Component) -> str:
    """The name under which `component` imports the monotonic clock (its version)."""
    for name in component.type.imports(engine):
        if name.startswith(CLOCK_INTERFACE):
            return name
    raise LookupError("the component imports no monotonic clock")
