"""A runner thread's priority: lowered for its background work, where it can be raised
again.

After a runner has handed over its execution's answer, what it does next (closing the
store, which copies the memory image back over the pool slot, and making its next
instance) is work nobody waits for. At nice +10 it takes the CPU the event loop and
the next guest leave, instead of competing with them: through a daemon on a 2-core VM,
trivial executions took 10% (wasm-js, 6/8 alternated blocks) and 20% (wasm-python,
6/6) less at p50.

Lowering a thread's priority needs no privilege; raising it back does (`CAP_SYS_NICE`,
or an `RLIMIT_NICE` of at least 20 minus the base nice value: the systemd unit in
deploy/ sets `LimitNICE=20`). Where that is not allowed, a thread lowered once would
stay low, so `available()` probes it once, in a thread of its own, and the runners do
nothing without it. Only Linux takes a thread's id where setpriority wants a process.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading

__all__ = ["BACKGROUND_INCREMENT", "available", "background", "foreground", "forget", "remember"]

# How far below its base value a runner's background work runs.
BACKGROUND_INCREMENT = 10

# The base nice value of each thread that called `remember`.
_base = threading.local()


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def _set_nice(value: int) -> None:
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), value)


@functools.cache
def available() -> bool:
    """Whether a thread may lower its priority and raise it back (probed once)."""
    if sys.platform != "linux":
        return False
    answer: list[bool] = []

    def probe() -> None:  # in a thread of its own: it may end up lowered
        try:
            base = _nice()
            _set_nice(base + 1)
            _set_nice(base)
            answer.append(_nice() == base)
        except OSError:
            answer.append(False)

    thread = threading.Thread(target=probe, name="conduit priority probe")
    thread.start()
    thread.join()
    return answer == [True]


def remember() -> None:
    """Note the calling thread's priority as the one `foreground` goes back to; until
    then, `background` and `foreground` do nothing in it."""
    if available():
        _base.value = _nice()


def background() -> None:
    """Run the calling thread `BACKGROUND_INCREMENT` below its remembered priority."""
    base = getattr(_base, "value", None)
    if base is not None:
        with contextlib.suppress(OSError):  # then at its usual priority
            _set_nice(base + BACKGROUND_INCREMENT)


def foreground() -> None:
    """Run the calling thread at its remembered priority again."""
    base = getattr(_base, "value", None)
    if base is not None and _nice() != base:
        with contextlib.suppress(OSError):  # the limit changed since the probe
            _set_nice(base)


def forget() -> None:
    """`foreground`, then stop managing the calling thread (it may serve others next)."""
    foreground()
    _base.__dict__.pop("value", None)
