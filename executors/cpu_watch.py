"""A CPU budget the daemon enforces itself, for a worker between its programs.

A soft `RLIMIT_CPU` ends a process with SIGXCPU, but a sandboxed runtime is the first
process of its PID namespace (`os_sandbox`, bwrap's `--as-pid-1`), and the kernel does
not deliver a signal whose action is the default to that process: past its soft
limit it runs on, up to the hard limit, which for a long-lived worker is its whole
life's. So where a budget must end a worker that is between programs (a session's
timer left computing after its step), `watch` reads the worker's CPU time and kills
it once past the budget; the soft limit stays for where it works (no sandbox).
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from conduit.executors.process import Limited, cpu_seconds

__all__ = ["WATCH_S", "watch"]

# How often the CPU time is read: a budget is overrun by at most this much.
WATCH_S = 0.25


async def watch(
    limited: Limited, budget_s: float, kill: Callable[[], None], scope: trio.CancelScope
) -> None:
    """Call `kill` once `limited` has used `budget_s` of CPU in all, unless `scope` is
    cancelled first (its next program starts) or the process has ended."""
    with scope:
        while True:
            await trio.sleep(WATCH_S)
            if limited.returncode is not None:
                return  # reaped: its pid may be anyone's now
            try:
                used = cpu_seconds(limited.pid)
            except ProcessLookupError:
                return
            if used >= budget_s:
                kill()
                return
