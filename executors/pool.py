"""A warm pool of pre-started, one-shot workers.

`WarmPool` keeps workers started and idle, hands each out at most once, and starts
replacements in the background. It aims for `size` idle workers, and more while
requests find none: each miss raises the aim by one, up to `max_size` (and only while
`may_grow` says the machine has room), and a minute without a miss lowers it by one,
back to `size`. A request that finds none waits for a start already under way
(`acquire`) rather than adding one of its own: that start began earlier, so it ends
sooner.

A worker is anything started by a `spawn` function in trio's `task_status` style:
`spawn` runs the worker for its whole life, calls `task_status.started(worker)` once
the worker is ready for a job, and returns when the worker has exited. The pool never
reuses a worker: whoever acquires one owns it and must `aclose()` it after its single
job.

The pool knows nothing about processes or jobs. Like httpcore's connection pool it
changes its bookkeeping without awaiting, and closes workers as a separate step that
is shielded and bounded in time.

Resource handling: every worker's task lives in the nursery that `run()` owns, also
after the worker is handed out, so when `run()` is cancelled every worker still alive,
idle or in use, is stopped before `run()` returns.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import trio

__all__ = ["PoolState", "PoolStatistics", "PoolWorker", "StartRelay", "WarmPool"]

log = logging.getLogger(__name__)

# After a failed start, wait before the next attempt, doubling up to the cap, so a
# broken runtime costs one attempt every half minute rather than a busy loop.
FIRST_BACKOFF_S = 0.1
MAX_BACKOFF_S = 30.0
# Long enough for a trivial program to finish before its replacement starts competing
# for the CPU; short enough that a long program does not leave the pool a worker short.
REFILL_DELAY_S = 0.05

# A minute without a request finding the pool empty: one worker fewer is aimed for.
SHRINK_AFTER_S = 60.0

# Closing an idle worker is a kill and a reap; a worker that takes longer than this is
# left to its task, which the nursery still waits for.
CLOSE_TIMEOUT_S = 5.0


class PoolWorker(Protocol):
    """What the pool needs of a worker."""

    def kill(self) -> None:
        """Stop the worker now, without waiting; its `spawn` task then returns."""

    async def aclose(self) -> None:
        """Stop the worker and release what it holds; idempotent, bounded in time."""


W = TypeVar("W", bound=PoolWorker)
Spawn = Callable[..., Awaitable[Any]]


class StartRelay(Generic[W]):
    """A task_status for starting a worker: adopts it the moment it is ready, so no
    scheduling gap lets it die unnoticed, then passes it on."""

    def __init__(self, task_status: trio.TaskStatus[W], adopt: Callable[[W, float], None]) -> None:
        self._task_status = task_status
        self._adopt = adopt
        self._began = trio.current_time()
        self.worker: W | None = None

    def started(self, value: W) -> None:
        self.worker = value
        self._adopt(value, trio.current_time() - self._began)
        self._task_status.started(value)


class PoolState(enum.Enum):
    """The pool's lifecycle."""

    STARTING = "starting"  # run() is filling the pool for the first time
    READY = "ready"  # run() is keeping `size` workers idle
    DRAINING = "draining"  # run() was cancelled and is closing workers
    CLOSED = "closed"  # run() has returned (or never ran)


@dataclass(frozen=True, slots=True)
class PoolStatistics:
    """A snapshot of a `WarmPool`, for `executors/list` and metrics."""

    state: PoolState
    size: int  # idle workers the pool aims to keep now
    base_size: int  # ... when nobody has found it empty for a while
    max_size: int  # ... at most
    idle: int  # started, ready, waiting to be handed out
    starting: int  # being started (or waiting out a back-off after a failed start)
    in_use: int  # handed out and not yet exited
    handed_out: int  # workers handed out since the pool started
    cold_starts: int  # acquire calls that found no idle worker
    waited_for_start: int  # of those, served by a start already under way
    refills: int  # workers started successfully
    refill_seconds_total: float  # time those starts took, spawn to ready, summed
    last_refill_s: float | None  # how long the latest successful start took
    deaths: int  # idle workers that exited on their own and were replaced
    start_failures: int  # starts that failed


class WarmPool(Generic[W]):
    """Keeps `size` one-shot workers started by `spawn` ready to hand out.

    `spawn(*, task_status)` must run one worker until it exits and call
    `task_status.started(worker)` once the worker is ready; an exception before that
    counts as a failed start. `run()` keeps the pool filled; `acquire()` hands out a
    worker, or None.
    """

    def __init__(
        self,
        spawn: Spawn,
        *,
        size: int,
        max_size: int | None = None,
        max_starting: int | None = None,
        may_grow: Callable[[], bool] = lambda: True,
        name: str = "pool",
    ) -> None:
        if size < 0:
            raise ValueError(f"pool size must be zero or more, not {size}")
        self._spawn = spawn
        self._base_size = size
        self._max_size = max(size, max_size if max_size is not None else size)
        self._may_grow = may_grow
        # Starts at once beyond the first fill: more than the cores only slows each.
        self._max_starting = max_starting if max_starting is not None else math.inf
        # What the pool aims for now: `size`, raised by misses, lowered by quiet.
        self._size = size
        self._last_miss = -math.inf
        self._name = name
        self._state = PoolState.CLOSED
        self._idle: list[W] = []
        self._in_use: set[W] = set()
        self._starting = 0
        self._handed_out = 0
        self._cold_starts = 0
        self._waited_for_start = 0
        self._waiting = 0  # acquirers waiting for a start under way
        self._adopted = trio.Event()  # set (and replaced) each time a worker is adopted
        self._refills = 0
        self._refill_seconds_total = 0.0
        self._last_refill_s: float | None = None
        self._deaths = 0
        self._start_failures = 0
        self._failures_in_a_row = 0
        self._changed = trio.Event()
        self._nursery: trio.Nursery | None = None

    @property
    def state(self) -> PoolState:
        return self._state

    def __repr__(self) -> str:
        return (
            f"<WarmPool {self._name} [{self._state.name}] "
            f"[Workers: {len(self._idle)} idle, {self._starting} starting, "
            f"{len(self._in_use)} in use | target {self._size} of {self._max_size}]>"
        )

    def statistics(self) -> PoolStatistics:
        """A frozen snapshot of the pool's counters."""
        return PoolStatistics(
            state=self._state,
            size=self._size,
            base_size=self._base_size,
            max_size=self._max_size,
            idle=len(self._idle),
            starting=self._starting,
            in_use=len(self._in_use),
            handed_out=self._handed_out,
            cold_starts=self._cold_starts,
            waited_for_start=self._waited_for_start,
            refills=self._refills,
            refill_seconds_total=self._refill_seconds_total,
            last_refill_s=self._last_refill_s,
            deaths=self._deaths,
            start_failures=self._start_failures,
        )

    async def acquire(self, *, within_s: float) -> W | None:
        """An idle worker; else the next one the pool makes ready, waited for up to
        `within_s` (the pool starts one for each acquirer waiting, `max_starting` at
        a time); None when it does not come, when `max_starting` acquirers wait
        already, while starts are failing, or for a pool of no workers at all
        (`max_size` 0): start one yourself then ("cold", counted in `cold_starts`).
        The caller owns a worker it gets and must `aclose()` it after its one job."""
        if self._idle:
            return self._hand_out()
        self._cold_starts += 1
        # Beyond `max_starting` waiting, a burst is better served by starts of its own
        # at once than by a queue for the pool's (a start is not all CPU).
        crowded = self._waiting >= self._max_starting
        if self._failures_in_a_row or self._nursery is None or not self._max_size or crowded:
            self._missed()
            return None
        self._waiting += 1
        self._missed()
        try:
            with trio.move_on_after(within_s):
                while not self._idle:
                    await self._adopted.wait()
                self._waited_for_start += 1
                return self._hand_out()
        finally:
            self._waiting -= 1
        return None

    def _missed(self) -> None:
        """A request found no idle worker: aim for one more, if there is room, and
        start what the aim lacks now (not after `REFILL_DELAY_S`: one is wanted)."""
        self._last_miss = trio.current_time()
        if self._size < self._max_size and self._may_grow():
            self._size += 1
        self._fill()

    def _fill(self) -> None:
        """Start workers until the idle and starting ones make the aim and one for
        each acquirer waiting, at most `max_starting` at a time."""
        if self._nursery is None or self._state is not PoolState.READY:
            return
        wanted = self._size + self._waiting
        while len(self._idle) + self._starting < wanted and self._starting < self._max_starting:
            self._starting += 1
            self._nursery.start_soon(self._start_one, True)

    def _hand_out(self) -> W:
        worker = self._idle.pop()
        self._in_use.add(worker)
        self._handed_out += 1
        # The refill waits for the job to finish, or for REFILL_DELAY_S: starting a
        # runtime competes for the CPU with the job just handed out, and on a small
        # machine that costs the job more than a short wait costs the pool.
        if self._nursery is not None:
            self._nursery.start_soon(self._wake_after, REFILL_DELAY_S)
        return worker

    async def _wake_after(self, delay_s: float) -> None:
        await trio.sleep(delay_s)
        self._wake()

    def _wake(self) -> None:
        self._changed.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the pool filled until cancelled.

        Calls `task_status.started()` once the first round of starts has finished,
        whether they succeeded or not: a pool that cannot start workers still lets
        callers start their own, and keeps retrying with back-off. On cancellation the
        idle workers are closed (shielded, bounded) and every worker task is waited for.
        """
        if self._state is not PoolState.CLOSED or self._nursery is not None:
            raise RuntimeError(f"{self!r} is already running; run() may be called once")
        self._state = PoolState.STARTING
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    await self._fill_first()
                    self._state = PoolState.READY
                    task_status.started()
                    await self._keep_filled()
                finally:
                    # Bookkeeping first, without awaiting; then the shielded close. The
                    # nursery then cancels the remaining tasks, in-use workers included.
                    self._state = PoolState.DRAINING
                    idle, self._idle = self._idle, []
                    await self._close_all(idle)
        finally:
            self._nursery = None
            self._state = PoolState.CLOSED

    async def _fill_first(self) -> None:
        async with trio.open_nursery() as first_round:
            for _ in range(self._size):
                self._starting += 1
                first_round.start_soon(self._start_one, False)

    async def _keep_filled(self) -> None:
        assert self._nursery is not None
        while True:
            self._fill()
            with trio.move_on_after(SHRINK_AFTER_S):
                await self._changed.wait()
            self._changed = trio.Event()
            self._shrink_if_quiet()

    def _shrink_if_quiet(self) -> None:
        """Aim for one worker fewer (down to `size`) after `SHRINK_AFTER_S` without a
        miss, closing an idle one beyond the aim."""
        if self._size <= self._base_size:
            return
        if trio.current_time() - self._last_miss < SHRINK_AFTER_S:
            return
        self._size -= 1
        self._last_miss = trio.current_time()  # the next step down is as far away
        if len(self._idle) > self._size and self._nursery is not None:
            self._nursery.start_soon(self._close_all, [self._idle.pop(0)])

    async def _start_one(self, back_off: bool) -> None:
        """Start one worker into the idle list; `self._starting` was already counted."""
        assert self._nursery is not None
        try:
            await self._nursery.start(self._host)
        except Exception as exc:
            self._start_failures += 1
            self._failures_in_a_row += 1
            log.warning("%s: could not start a worker: %s", self._name, exc)
            if back_off:
                # Still counted as starting, so no other start is attempted meanwhile.
                exponent = min(self._failures_in_a_row - 1, 20)
                await trio.sleep(min(FIRST_BACKOFF_S * math.pow(2, exponent), MAX_BACKOFF_S))
        finally:
            self._starting -= 1
            self._wake()

    async def _host(self, *, task_status: trio.TaskStatus[W]) -> None:
        """Run one worker; forget it when it exits, counting a death if it was idle."""
        relay: StartRelay[W] = StartRelay(task_status, self._adopt)
        try:
            await self._spawn(task_status=relay)
        finally:
            if relay.worker is not None:
                self._forget(relay.worker)

    def _adopt(self, worker: W, took_s: float) -> None:
        self._failures_in_a_row = 0
        self._refills += 1
        self._refill_seconds_total += took_s
        self._last_refill_s = took_s
        if self._state is PoolState.DRAINING:
            worker.kill()  # started too late to be used; its task then ends
        elif len(self._idle) >= self._size + self._waiting:
            worker.kill()  # started for an acquirer that stopped waiting: not wanted
        else:
            self._idle.append(worker)
            self._adopted.set()
            self._adopted = trio.Event()

    def _forget(self, worker: W) -> None:
        if worker in self._idle:
            self._idle.remove(worker)
            if self._state is not PoolState.DRAINING:
                self._deaths += 1
                log.warning("%s: an idle worker exited on its own; replacing it", self._name)
            # Its pipes and files still need releasing; the host task must not block.
            if self._nursery is not None:
                self._nursery.start_soon(self._close_all, [worker])
        self._in_use.discard(worker)
        self._wake()

    async def _close_all(self, workers: list[W]) -> None:
        """Kill `workers` at once, then release each; shielded and bounded."""
        if not workers:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT_S):
            for worker in workers:
                worker.kill()
            for worker in workers:
                await worker.aclose()
