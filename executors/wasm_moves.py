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

The CPU time counted is the guest thread's, less what it spent collecting garbage:
Python's collector runs on whichever thread allocates when a collection is due, and a
full one walks every object of the daemon (~0.1 s with the GIL held), which is nobody's
program's doing.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable

from conduit.executors._wasmtime import StopReason

__all__ = ["MOVE_CHECK_EVERY_S", "MoveWatch", "program_cpu_s"]

# How often the guest's CPU time is read (a system call, on the guest's thread).
MOVE_CHECK_EVERY_S = 0.005
# Each thread's CPU time spent in collections, and when the one under way began.
_COLLECTING = threading.local()


def _on_collection(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _COLLECTING.began = time.thread_time()
        return
    began = getattr(_COLLECTING, "began", None)
    if began is not None:
        spent = time.thread_time() - began
        _COLLECTING.spent = getattr(_COLLECTING, "spent", 0.0) + spent
        _COLLECTING.began = None


gc.callbacks.append(_on_collection)


def program_cpu_s() -> float:
    """This thread's CPU time, less what it spent collecting garbage."""
    return time.thread_time() - getattr(_COLLECTING, "spent", 0.0)


class MoveWatch:
    """An interrupt's watch (`Interrupt.watch`) that answers `StopReason.MOVED` once
    the thread that made it, which runs the guest, has spent `after_s` of CPU time
    since, unless `seen()` says something of the program already reached the outside;
    either way it says nothing more after. `clock` reads the thread's CPU time
    (`program_cpu_s`)."""

    def __init__(
        self,
        after_s: float,
        seen: Callable[[], bool],
        clock: Callable[[], float] = program_cpu_s,
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
