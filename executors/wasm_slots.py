"""CPU slots for Wasmtime guests: held while guest code runs, not while it waits.

A guest waiting on a tool call, a sleep or a timer uses no CPU, so it holds no slot:
the slots bound how many guests run code at once (one per core), not how many are
under way. Each execution has a `Seat`, its claim on a slot:

- A tool call gives the slot up before it is dispatched and takes it back when the
  answer is in, before the guest's code runs again (the executor does that around its
  `host-call`, on the Trio side).
- Any other wait is a WASI call that blocks the guest's thread inside Wasmtime (a
  sleep, a timer the program awaits), where the host cannot step in. But a guest that
  runs code is checked at every epoch tick (`GuestInterrupt`), and marks its seat alive
  there (`Seat.beat`). While somebody waits for a slot, `CpuSlots.serve` takes the
  slots of guests that have not been seen for `STALE_AFTER_S`: they are blocked, or
  the system is not running them anyway. Such a guest takes a slot back at its first
  tick after the wait (`GuestInterrupt` calls `regain`, which blocks its thread), so
  no guest runs code for more than a tick without a slot, whatever it does.

Guests coming back from a wait get slots before guests that have not started: they
hold stores and runner threads already, and finishing them frees both. A guest that
only computes keeps its slot until it ends.

Beats and `regain` come from the epoch callback (`_wasmtime_private`). Without it no
tick reaches the guest's thread: a guest keeps its slot while it waits in a WASI call
unless it is taken, and a guest whose slot was taken runs on without one.

Everything here but `Seat.beat` and `Seat.held` (read and written by the guest's
thread between its instructions) belongs to the Trio thread.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass

import trio

from conduit.executors import _wasmtime

__all__ = ["STALE_AFTER_S", "CpuSlots", "GuestInterrupt", "Seat", "SlotStatistics"]

# A running guest is seen every epoch tick; one not seen for three has been blocked
# (or left unscheduled by the system) for at least two.
STALE_AFTER_S = 3 * _wasmtime.EPOCH_TICK_S
# How often holders are looked at while somebody waits for a slot (never otherwise).
CHECK_EVERY_S = _wasmtime.EPOCH_TICK_S


@dataclass(frozen=True, slots=True)
class SlotStatistics:
    total: int
    running: int  # seats holding a slot
    resuming: int  # guests back from a wait, waiting for a slot
    starting: int  # guests not started yet, waiting for a slot


class Seat:
    """One execution's claim on a slot."""

    __slots__ = ("beat", "held", "resuming")

    def __init__(self) -> None:
        self.held = False
        # When the guest's thread last ran its code (`time.monotonic`).
        self.beat = 0.0
        # Whether the guest is waiting to run again after a wait: its own clock stands
        # still meanwhile (see `wasm.py`).
        self.resuming = False

    def __repr__(self) -> str:
        state = "held" if self.held else "resuming" if self.resuming else "free"
        return f"<Seat {state}>"


@dataclass(slots=True, eq=False)
class _Waiter:
    seat: Seat
    woken: trio.Event


class CpuSlots:
    """`total` slots, and two queues of seats waiting for one: guests resuming first,
    then guests starting, each in the order they came.

    `serve` must run for the slots of waiting guests to be taken (see the module
    docstring); without it a slot comes free only when its seat is released.
    """

    def __init__(
        self,
        total: int,
        *,
        stale_after_s: float = STALE_AFTER_S,
        check_every_s: float = CHECK_EVERY_S,
    ) -> None:
        self._total = total
        self._stale_after_s = stale_after_s
        self._check_every_s = check_every_s
        self._holders: set[Seat] = set()
        self._resuming: collections.deque[_Waiter] = collections.deque()
        self._starting: collections.deque[_Waiter] = collections.deque()
        self._waiting = trio.Event()  # set while anybody waits: `serve` then watches
        self.taken = 0  # slots taken from guests that were not running (for info)

    def __repr__(self) -> str:
        stats = self.statistics()
        return (
            f"<CpuSlots {stats.running}/{stats.total} running | "
            f"{stats.resuming} resuming, {stats.starting} starting>"
        )

    def statistics(self) -> SlotStatistics:
        return SlotStatistics(
            total=self._total,
            running=len(self._holders),
            resuming=len(self._resuming),
            starting=len(self._starting),
        )

    def take_nowait(self, seat: Seat, *, resuming: bool = False) -> bool:
        """Give `seat` a slot if one is free and nobody it must let go first waits;
        whether it holds one."""
        if seat.held:
            return True
        ahead = self._resuming if resuming else self._resuming or self._starting
        if ahead or len(self._holders) >= self._total:
            return False
        self._hold(seat)
        return True

    async def take(self, seat: Seat, *, resuming: bool = False) -> None:
        """Wait until `seat` holds a slot. Cancellation-safe: a slot handed over just
        as the wait was cancelled is passed on."""
        if self.take_nowait(seat, resuming=resuming):
            await trio.lowlevel.checkpoint()
            return
        waiter = _Waiter(seat, trio.Event())
        (self._resuming if resuming else self._starting).append(waiter)
        self._waiting.set()
        try:
            await waiter.woken.wait()
        except BaseException:
            if seat.held:
                self.release(seat)
            else:
                queue = self._resuming if resuming else self._starting
                queue.remove(waiter)
            raise

    def release(self, seat: Seat) -> None:
        """`seat` gives its slot up, if it holds one; the next waiter gets it."""
        if seat.held:
            self._holders.discard(seat)
            seat.held = False
            self._hand_on()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """While anybody waits for a slot, take the slots of guests not seen running
        for `stale_after_s`, every `check_every_s`. Runs until cancelled."""
        task_status.started()
        while True:
            await self._waiting.wait()
            while self._resuming or self._starting:
                self._take_from_idle(time.monotonic())
                await trio.sleep(self._check_every_s)
            self._waiting = trio.Event()

    def _take_from_idle(self, now: float) -> None:
        wanted = len(self._resuming) + len(self._starting)
        idle = [seat for seat in self._holders if now - seat.beat >= self._stale_after_s]
        idle.sort(key=lambda seat: seat.beat)
        for seat in idle[:wanted]:
            self.taken += 1
            self.release(seat)

    def _hold(self, seat: Seat) -> None:
        self._holders.add(seat)
        seat.held = True
        seat.beat = time.monotonic()

    def _hand_on(self) -> None:
        while len(self._holders) < self._total and (self._resuming or self._starting):
            waiter = (self._resuming or self._starting).popleft()
            self._hold(waiter.seat)
            waiter.woken.set()


class GuestInterrupt(_wasmtime.Interrupt):
    """An execution's interrupt, which also keeps its seat.

    At every tick of the guest's code (on its thread), the seat is marked alive; if
    its slot was taken while the guest waited, `regain` is called first, and returns
    once the seat holds a slot again or this interrupt is stopped. It must not raise;
    it may move `deadline` (the wait for a slot is not the program's time).
    """

    def __init__(self, timeout_s: float, seat: Seat) -> None:
        super().__init__(timeout_s)
        self.seat = seat
        self.regain: Callable[[], None] | None = None

    def _on_deadline(self, context, data, delta, kind) -> int:  # type: ignore[no-untyped-def]
        seat = self.seat
        now = time.monotonic()
        seat.beat = now
        if not seat.held and self.reason is None and now < self.deadline and self.regain:
            self.regain()
        return super()._on_deadline(context, data, delta, kind)

    def check(self) -> None:
        # Without the epoch callback (the ticker's thread): a wait for a slot is
        # queueing, and the deadline moves on by it once it ends.
        if not self.seat.resuming:
            super().check()
