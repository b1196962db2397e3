"""Runner threads: each keeps one instance ready and runs the work it is handed.

A runner is one worker thread for its whole life, looping: make an instance
(`Instances.standby`), report ready, wait for work, hand the work the instance, and
again. The work (the executor's, for one execution) runs the program, answers, and
closes the store; the runner then makes its next instance while nobody waits for it.
Where the thread may leave the idle scheduling class again (`thread_priority`), the
work puts it there once it has answered, and the runner takes it out before reporting
ready; an execution that has to wait for a runner hurries them all out of it.

Handing an execution to a thread that already waits with an instance it made is the
short way to a running guest: one put on the runner's queue, no task to spawn and no
`trio.to_thread` round per execution, and the guest runs where its instance was made.
Through a daemon on a two-core VM that took 0.05 to 0.15 ms of event-loop CPU and
3 to 5% of the latency off each trivial execution (alternated blocks against a thread
and a task per execution).

Each runner's thread is a task in `Runners.serve`'s nursery, started through
`trio.to_thread` behind the executor's thread limiter. Work that returns False retires
its runner (its thread ends after it): the executor does that when it gave up on the
execution, whose guest may still be blocked, and starts a replacement with `add`.
When `serve` is cancelled, every runner is told to stop and their threads are waited
for, briefly: a guest blocked in a WASI call may keep one a moment longer.

A runner makes its instances with the executor's `Instances`, or, given `own_instances`,
with `Instances` of its own, made as its thread starts: where a guest is stopped by
moving its engine's epoch, no other runner's store may share that engine (see
`_wasmtime.Interrupt`).

A runner runs one execution from start to end, waits included: a guest waiting on a
tool or a timer keeps its thread and its store. So `Runners` keeps `count` runners,
and starts more, up to `limit`, when every one it has is taken and somebody waits for
one; a runner beyond `count` that stays unused for `IDLE_RETIRE_S` retires, closing
its instance. What each costs is its thread (a stack of mostly untouched virtual
memory) and its store (the guest's memory, see `wasm_instances`).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol

import trio

from conduit.executors import thread_priority
from conduit.executors.wasm_instances import Instance, Instances

__all__ = ["Runner", "Runners", "Work"]

log = logging.getLogger(__name__)

# What a runner hands its instance to (None when it could not make one): runs in the
# runner's thread, owns the instance from then on, and says whether the runner may go
# on to its next instance.
Work = Callable[[Instance | None], bool]
# How long stopping waits for runner threads: closing a store takes a millisecond; a
# guest blocked in a WASI call is not waited for.
STOP_WAIT_S = 1.0
# How long a runner beyond the kept count waits unused before it retires: long enough
# that a steady load of waiting programs keeps its runners, rather than starting a
# thread and an instance for each.
IDLE_RETIRE_S = 10.0


class _Owner(Protocol):
    """What a runner reports to (`Runners`), from its own thread."""

    def on_ready(self, runner: Runner) -> None:
        """`runner` has its instance and waits for work."""

    def done(self, runner: Runner, go_on: bool) -> bool:
        """`runner`'s work has ended, saying whether it may go on; whether it does."""

    def idle_timeout(self) -> float | None:
        """How long a ready runner may wait for work before `let_go` (None: for ever)."""

    def let_go(self, runner: Runner) -> bool:
        """Whether `runner`, unused for `idle_timeout`, retires (then it is no longer
        ready: nobody can take it)."""


class Runner:
    """One worker thread's loop (`loop`), and how the Trio side hands it work.

    `instances` is what the runner makes its instances with: `Instances`, or a function
    making them, called in the runner's thread as it starts (a runner whose call fails
    retires, logged). Once it has reported ready, `instances` is the `Instances`.
    """

    def __init__(self, instances: Instances | Callable[[], Instances], owner: _Owner) -> None:
        self._make_instances = instances
        self.instances: Instances | None = instances if isinstance(instances, Instances) else None
        self._owner = owner
        self._mailbox: queue.SimpleQueue[Work | None] = queue.SimpleQueue()
        self._stopping = False
        # The thread's scheduling, once its loop has started.
        self._priority: thread_priority.ThreadPriority | None = None
        # Set by the thread when the loop starts and ends: one whose task was cancelled
        # while waiting for the thread limiter never starts, and is not waited for.
        self.started = False
        self.finished = threading.Event()
        # Kept by `Runners` (under its lock): whether it is taken, and whether it no
        # longer counts among the runners kept.
        self.taken = False
        self.retired = False

    def __repr__(self) -> str:
        state = "finished" if self.finished.is_set() else "stopping" if self._stopping else "on"
        return f"<Runner {state}>"

    def hand(self, work: Work) -> None:
        """Give a runner that reported itself ready its next work (any thread)."""
        self._mailbox.put(work)

    def hurry(self) -> None:
        """Out of the idle scheduling class until its next answer (any thread):
        somebody waits for the instance it is making."""
        if self._priority is not None:
            self._priority.hurry()

    def stop(self) -> None:
        """End the loop once the runner is done with its current work (any thread);
        that work leaves the idle scheduling class, so a busy machine cannot hold the
        stop up."""
        self._stopping = True
        self._mailbox.put(None)
        self.hurry()

    def loop(self) -> None:
        """The runner's thread: make an instance, report ready, run the work handed over."""
        self.started = True
        self._priority = thread_priority.manage()
        work: Work | None = None
        instance = None
        try:
            instances = self._start()
            while instances is not None and not self._stopping:
                instance = instances.standby()
                self._priority.restore()  # the work lowered it once it had answered
                self._owner.on_ready(self)
                work = self._wait_for_work()
                if work is None:
                    if instance is not None:
                        instance.close()
                    return
                try:
                    go_on = work(instance)
                except BaseException:
                    self._owner.done(self, False)
                    raise
                if not self._owner.done(self, go_on):
                    return
        finally:
            thread_priority.release()  # the thread goes back to Trio's cache
            # Nothing of the executor stays reachable from this thread once it says it
            # is finished: it may take a while yet to unwind on a busy machine.
            work = instance = instances = None
            self.instances = self._make_instances = self._owner = None  # type: ignore[assignment]
            self.finished.set()

    def _start(self) -> Instances | None:
        """The runner's `Instances`, made now if it has its own; None (logged, and the
        runner retired) if that failed."""
        if self.instances is not None:
            return self.instances
        try:
            self.instances = self._make_instances()  # type: ignore[operator]
        except Exception:
            log.exception("a Wasmtime runner could not load its component; it retires")
            self._owner.done(self, False)
            return None
        return self.instances

    def _wait_for_work(self) -> Work | None:
        """The next work, or None to stop (told to, or let go while idle)."""
        while True:
            try:
                return self._mailbox.get(timeout=self._owner.idle_timeout())
            except queue.Empty:
                if self._owner.let_go(self):
                    return None


class Runners:
    """An executor's runners: `count` of them while `serve` runs, up to `limit` while
    every one is taken (see the module docstring), and which are ready. Each makes its
    instances with `instances`, or with `own_instances()` if given.

    `take` (Trio side) gives a ready runner, waiting for one if none is; each runner
    runs one execution at a time, so the caller bounds how many it takes at once. A
    runner taken is handed work (`Runner.hand`), then `release`d once its taker no
    longer waits for it, or given back unused (`give_back`).
    """

    def __init__(
        self,
        instances: Instances,
        *,
        count: int,
        threads: trio.CapacityLimiter,
        limit: int | None = None,
        idle_retire_s: float = IDLE_RETIRE_S,
        own_instances: Callable[[], Instances] | None = None,
    ) -> None:
        # What each runner makes its instances with (see the module docstring).
        self._instances: Instances | Callable[[], Instances] = own_instances or instances
        self._count = count
        self._limit = max(count, limit if limit is not None else count)
        self._threads = threads
        self._idle_retire_s = idle_retire_s
        self._token = trio.lowlevel.current_trio_token()
        # Guards `_ready`, `_members` and `_taken`: runners report from their threads.
        self._lock = threading.Lock()
        self._ready: collections.deque[Runner] = collections.deque()
        # Runners started and not retiring, and how many of them are taken.
        self._members = 0
        self._taken = 0
        # Every runner whose thread may still be running, for `_stop` to wait for.
        self._alive: set[Runner] = set()
        # Set by a `take` that waits: the next runner to report ready wakes it.
        self._waiter: trio.Event | None = None
        self._takers = 0  # `take` calls waiting
        self._nursery: trio.Nursery | None = None
        self._stopping = False

    def __repr__(self) -> str:
        return f"<Runners {len(self._ready)}/{len(self._alive)} ready>"

    @property
    def alive(self) -> int:
        """How many runner threads may still be running (lingering ones included)."""
        return len(self._alive)

    @property
    def ready(self) -> int:
        """How many runners wait with an instance made."""
        return len(self._ready)

    @property
    def taken(self) -> int:
        """How many runners are taken: running an execution, or about to."""
        return self._taken

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the runners and keep them until cancelled; then stop them all."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for _ in range(self._count):
                    self.add()
                task_status.started()
                await trio.sleep_forever()  # runners come and go; this serves on
        finally:
            self._nursery = None
            await self._stop()

    def add(self) -> bool:
        """Start one more runner (the replacement for one that is retiring, say);
        whether one was started: none is before `serve` runs, or once it stops."""
        if self._nursery is None or self._stopping:
            return False
        with self._lock:
            self._members += 1
        self._nursery.start_soon(self._run, Runner(self._instances, self))
        return True

    def replenish(self) -> None:
        """Start a runner if none is ready or on its way, within the limit: one was just
        taken for long (a session's, see `wasm_sessions`), and the next execution
        should not have to wait for an instance to be made."""
        with self._lock:
            if self._members > self._taken or self._members >= self._limit:
                return
        self.add()

    def take_nowait(self) -> Runner | None:
        """A ready runner, the longest ready first; None if none is."""
        with self._lock:
            if not self._ready:
                return None
            runner = self._ready.popleft()
            runner.taken = True
            self._taken += 1
            return runner

    def give_back(self, runner: Runner) -> None:
        """Return a runner taken but not handed work: it is ready again, first in line."""
        with self._lock:
            self._untake(runner)
            if self._stopping:
                return
            self._ready.appendleft(runner)
        if self._waiter is not None:
            self._waiter.set()

    def release(self, runner: Runner, *, retiring: bool = False) -> None:
        """The taker is done with `runner`, whose work goes on without it: the runner
        will be ready again soon (it closes its store and makes its next instance), or,
        `retiring`, it ends once its work does (its guest outlived the execution)."""
        with self._lock:
            self._untake(runner)
            if retiring:
                self._retire(runner)

    async def take(self) -> Runner:
        """A ready runner, the longest ready first; waits for one if none is, starting
        runners up to the limit and hurrying the busy ones meanwhile (see
        `thread_priority`)."""
        while True:
            runner = self.take_nowait()
            if runner is not None:
                return runner
            self._takers += 1
            try:
                self._grow()
                for busy in self._alive:
                    busy.hurry()
                if self._waiter is None:
                    self._waiter = trio.Event()
                waiter = self._waiter
                # Announced before looking again: a runner that reports ready from now
                # on sees the waiter (see `on_ready`).
                if not self._ready:
                    await waiter.wait()
                if self._waiter is waiter:
                    self._waiter = None
            finally:
                self._takers -= 1

    def _grow(self) -> None:
        """Start runners while fewer are ready or on their way than `take` calls wait."""
        while True:
            with self._lock:
                coming = self._members - self._taken
                if coming >= self._takers or self._members >= self._limit:
                    return
            if not self.add():
                return

    # -- what runners report, from their threads ----------------------------------------

    def on_ready(self, runner: Runner) -> None:
        """A runner has its instance and waits for work."""
        with self._lock:
            if self._stopping:
                return
            self._ready.append(runner)
        waiter = self._waiter
        if waiter is not None:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(waiter.set)

    def done(self, runner: Runner, go_on: bool) -> bool:
        """A runner's work has ended, saying whether the runner may go on; whether it
        does (it retires otherwise)."""
        with self._lock:
            self._untake(runner)
            if not go_on:
                self._retire(runner)
            return go_on

    def idle_timeout(self) -> float | None:
        with self._lock:
            return self._idle_retire_s if self._members > self._count else None

    def let_go(self, runner: Runner) -> bool:
        with self._lock:
            if self._members <= self._count or runner not in self._ready:
                return False
            self._ready.remove(runner)
            self._retire(runner)
            return True

    def _untake(self, runner: Runner) -> None:
        """`runner` is no longer taken (the lock is held)."""
        if runner.taken:
            runner.taken = False
            self._taken -= 1

    def _retire(self, runner: Runner) -> None:
        """`runner` no longer counts among the runners kept (the lock is held)."""
        if not runner.retired:
            runner.retired = True
            self._members -= 1

    async def _run(self, runner: Runner) -> None:
        self._alive.add(runner)
        try:
            await trio.to_thread.run_sync(
                runner.loop, limiter=self._threads, abandon_on_cancel=True
            )
        except trio.Cancelled:
            runner.stop()
            raise
        except Exception:  # a fault of ours: keep the executor's capacity
            log.exception("a Wasmtime runner thread failed; starting another")
            with self._lock:
                self._retire(runner)
                if runner in self._ready:
                    self._ready.remove(runner)
            self.add()
        finally:
            if runner.finished.is_set():
                self._alive.discard(runner)

    async def _stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._ready.clear()
        runners = list(self._alive)
        for runner in runners:
            runner.stop()
        # A runner whose thread starts from now on sees it is stopped before anything.
        runners = [runner for runner in runners if runner.started]
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(_wait_finished, runners, STOP_WAIT_S)
        self._alive.difference_update(r for r in runners if r.finished.is_set())


def _wait_finished(runners: Iterable[Runner], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for runner in runners:
        runner.finished.wait(max(0.0, deadline - time.monotonic()))
