"""Giving a program back to run elsewhere: a Wasmtime guest that computes for long.

SpiderMonkey runs interpreted inside WebAssembly: a program that mostly computes (a
loop over a large input, a deep recursion) takes several times as long on `wasm-js` as
on `deno`, while one that mostly calls tools starts ten times sooner there. The text
does not say which a program is, so a program the daemon chose the executor for may be
watched (`Job.move_after_cpu_s`): once its guest has spent that much CPU time on its
own thread, and nothing it did was seen outside its sandbox (no call reached the
daemon, no output was streamed), it is stopped with `StopReason.MOVED` and the daemon
runs it again from the start where computing is fast. The first run leaves nothing:
its instance, its working directory and its output go with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from conduit.executors._wasmtime import StopReason

__all__ = ["MOVE_CHECK_EVERY_S", "MoveWatch"]

# How often the guest's CPU time is read (a system call, on the guest's thread).
MOVE_CHECK_EVERY_S = 0.005


class MoveWatch:
    """An interrupt's watch (`Interrupt.watch`) that answers `StopReason.MOVED` once
    the thread that made it, which runs the guest, has spent `after_s` of CPU time
    since, unless `seen()` says something of the program already reached the outside;
    either way it says nothing more after. `clock` reads the thread's CPU time."""

    def __init__(
        self,
        after_s: float,
        seen: Callable[[], bool],
        clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self._after_s = after_s
        self._seen = seen
        self._clock = clock
        self._began = clock()
        self._done = False

    def __call__(self) -> StopReason | None:
        if self._done:
            return None
        if self._clock() - self._began < self._after_s:
            return None
        self._done = True
        return None if self._seen() else StopReason.MOVED
