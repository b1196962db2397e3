"""A runner thread's scheduling: idle-class for the work nobody waits for yet, where the
thread may leave that class again.

After a runner has handed over its execution's answer, what it does next (closing the
store, which copies the memory image back over the pool slot, and making its next
instance) is work nobody waits for. Under `SCHED_IDLE` it runs on CPU time nothing
else wants, and the kernel preempts it as soon as the event loop or a guest wakes,
rather than having them share the cores with it (having lowered itself, the thread
yields the CPU once: the event loop its answer woke may be queued behind it, and
would otherwise wait there for the scheduler's next tick, half a millisecond at the
median on a 2-core VM). Through a daemon on a 2-core VM,
trivial executions took 30% less at p50 on wasm-js (1.10 against 1.57 ms, faster in 10
of 10 alternated blocks) and 25% less on wasm-python (1.73 against 2.30 ms, 8 of 8),
for the same executions/s under 8 clients. (Nice +10 instead was faster in one series
and slower in the next: a woken thread does not always preempt a nice one at once.)

Somebody may wait for that work after all: an execution that finds no runner ready.
Then `Runners.take` hurries the runners (`ThreadPriority.hurry`, from the Trio
thread), which puts them back in their usual class at once, until their next answer.
So a burst of executions, or a machine busy with other processes, never leaves the
daemon's refills to idle time.

Entering `SCHED_IDLE` needs no privilege; leaving it does (`CAP_SYS_NICE`, or an
`RLIMIT_NICE` of at least 20 minus the thread's nice value: the systemd unit in deploy/
sets `LimitNICE=20`). Where that is not allowed, a thread lowered once would stay low,
so `available()` probes it once, in a thread of its own, and nothing is changed
without it. A thread that runs under another policy than `SCHED_OTHER` (one chosen
for the daemon by whoever started it) is left alone too.
"""

from __future__ import annotations

import functools
import logging
import os
import threading

__all__ = ["ThreadPriority", "available", "background", "foreground", "manage", "release"]

log = logging.getLogger(__name__)

# The ThreadPriority of the calling thread, while `manage` has it managed.
_current = threading.local()


@functools.cache
def available() -> bool:
    """Whether a thread may enter `SCHED_IDLE` and leave it again (probed once)."""
    if not hasattr(os, "SCHED_IDLE"):  # Linux only
        return False
    answer: list[bool] = []

    def probe() -> None:  # in a thread of its own: it may end up idle-class
        try:
            _set_policy(0, os.SCHED_IDLE)
            _set_policy(0, os.SCHED_OTHER)
            answer.append(os.sched_getscheduler(0) == os.SCHED_OTHER)
        except OSError:
            answer.append(False)

    thread = threading.Thread(target=probe, name="conduit scheduling probe")
    thread.start()
    thread.join()
    return answer == [True]


def _set_policy(thread_id: int, policy: int) -> None:
    os.sched_setscheduler(thread_id, policy, os.sched_param(0))


class ThreadPriority:
    """The scheduling of the thread that made it: `lower` and `restore` in that thread,
    `hurry` from any. Does nothing where `available()` is false, or for a thread that
    was not under `SCHED_OTHER` to begin with."""

    def __init__(self) -> None:
        self._thread_id = threading.get_native_id()
        self._managed = available() and os.sched_getscheduler(0) == os.SCHED_OTHER
        # `hurry` comes from another thread: the state changes under the lock, so a
        # thread never lowers itself just after it was hurried.
        self._lock = threading.Lock()
        self._lowered = False
        self._hurried = False

    def __repr__(self) -> str:
        state = "idle" if self._lowered else "hurried" if self._hurried else "usual"
        return f"<ThreadPriority {self._thread_id} {state}>"

    @property
    def lowered(self) -> bool:
        return self._lowered

    def lower(self) -> None:
        """Run the thread under `SCHED_IDLE`, unless it was hurried since its last
        `restore`."""
        with self._lock:
            if self._managed and not (self._lowered or self._hurried):
                self._lowered = self._set(os.SCHED_IDLE)
        if self._lowered:
            # The thread it has just woken (the event loop, with the answer) may be
            # queued on this CPU, and the kernel does not preempt a running thread
            # for having lowered itself: it would wait for the next tick.
            os.sched_yield()

    def restore(self) -> None:
        """Back to `SCHED_OTHER`; the thread may be lowered again from now on."""
        with self._lock:
            self._hurried = False
            self._raise()

    def hurry(self) -> None:
        """Back to `SCHED_OTHER` at once (any thread), and kept there until `restore`."""
        with self._lock:
            self._hurried = True
            self._raise()

    def _raise(self) -> None:
        if self._lowered:
            self._lowered = not self._set(os.SCHED_OTHER)

    def _set(self, policy: int) -> bool:
        try:
            _set_policy(self._thread_id, policy)
        except OSError as exc:  # the limit changed since the probe: leave it at that
            log.warning("could not change a runner thread's scheduling: %s", exc)
            self._managed = False
            return False
        return True


def manage() -> ThreadPriority:
    """Manage the calling thread (a runner's, as its loop starts) until `release`:
    `background` lowers it meanwhile."""
    priority = ThreadPriority()
    _current.priority = priority
    return priority


def background() -> None:
    """Lower the calling thread if it is managed: what it does next, nobody waits for."""
    priority: ThreadPriority | None = getattr(_current, "priority", None)
    if priority is not None:
        priority.lower()


def foreground() -> None:
    """Restore the calling thread if it is managed: somebody waits for what it does
    next (a session's runner, handed its next step)."""
    priority: ThreadPriority | None = getattr(_current, "priority", None)
    if priority is not None:
        priority.restore()


def release() -> None:
    """Restore the calling thread and stop managing it (it may serve others next)."""
    priority: ThreadPriority | None = getattr(_current, "priority", None)
    if priority is not None:
        priority.restore()
        del _current.priority
