"""How many runner threads, and how much store memory, executions may leave behind.

An execution that is given up on before its runner is done (cancelled, or its guest
late past the grace, see `wasm.py`) leaves the runner finishing on its own: a thread,
and a store that may hold up to the execution's `memory_mb`. Guest waits end by the
execution's deadline (`wasm_clock`), so each is freed by then, but until it is, it
counts here: per principal, so one caller cannot take the whole budget, and in total.
At a cap, new executions are refused at once with a message saying why, rather than
queueing behind threads that are not theirs; they are admitted again as soon as a
lingering runner finishes.

Thread-safe: runners finish in their own threads.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass

__all__ = ["LingerBudget", "LingerStatistics"]

# Threads one principal's executions may leave behind: enough for a few cancelled
# runs at once, far below the total.
MAX_THREADS_PER_PRINCIPAL = 8
# Store memory one principal's lingering runners may hold: two default-sized runs'
# worth (128 MB each) twice over.
MAX_MEMORY_MB_PER_PRINCIPAL = 512
# Memory all lingering runners may hold at once: a quarter of a small host's 8 GB.
MAX_MEMORY_MB = 2048
# Who an execution is charged to when the job names nobody.
ANONYMOUS = ""


@dataclass(frozen=True, slots=True)
class LingerStatistics:
    threads: int
    memory_mb: int
    principals: int


class LingerBudget:
    """Counts lingering runners (`charge`, `release`) and refuses new executions
    past the caps (`refusal`). `max_threads` is the total thread cap."""

    def __init__(
        self,
        *,
        max_threads: int,
        max_memory_mb: int = MAX_MEMORY_MB,
        max_threads_per_principal: int = MAX_THREADS_PER_PRINCIPAL,
        max_memory_mb_per_principal: int = MAX_MEMORY_MB_PER_PRINCIPAL,
    ) -> None:
        self._max_threads = max_threads
        self._max_memory_mb = max_memory_mb
        self._max_threads_each = min(max_threads_per_principal, max_threads)
        self._max_memory_mb_each = min(max_memory_mb_per_principal, max_memory_mb)
        self._lock = threading.Lock()
        self._threads: Counter[str] = Counter()
        self._memory_mb: Counter[str] = Counter()

    def __repr__(self) -> str:
        stats = self.statistics()
        return f"<LingerBudget {stats.threads}/{self._max_threads} threads, {stats.memory_mb} MB>"

    def statistics(self) -> LingerStatistics:
        with self._lock:
            return LingerStatistics(
                threads=self._threads.total(),
                memory_mb=self._memory_mb.total(),
                principals=len(self._threads),
            )

    def refusal(self, principal: str | None, memory_mb: int) -> str | None:
        """Why an execution of `principal` that may hold `memory_mb` cannot start now
        (it could not linger within the caps); None if it can."""
        who = principal or ANONYMOUS
        with self._lock:
            threads, memory = self._threads.total(), self._memory_mb.total()
            if threads >= self._max_threads or _over(memory, memory_mb, self._max_memory_mb):
                scope = "the executor's"
            elif self._threads[who] >= self._max_threads_each or _over(
                self._memory_mb[who], memory_mb, self._max_memory_mb_each
            ):
                scope = "this caller's"
            else:
                return None
        return (
            f"{scope} earlier executions that were cancelled or timed out are still "
            f"winding down ({threads} sandboxes, {memory} MB); they end by their own "
            "deadlines: try again in a few seconds"
        )

    def charge(self, principal: str | None, memory_mb: int) -> None:
        """An execution's runner now lingers, holding up to `memory_mb`."""
        who = principal or ANONYMOUS
        with self._lock:
            self._threads[who] += 1
            self._memory_mb[who] += memory_mb

    def release(self, principal: str | None, memory_mb: int) -> None:
        """The runner `charge` counted has finished and closed its store."""
        who = principal or ANONYMOUS
        with self._lock:
            self._threads[who] -= 1
            self._memory_mb[who] -= memory_mb
            if self._threads[who] <= 0:
                del self._threads[who]
                self._memory_mb.pop(who, None)


def _over(held_mb: int, memory_mb: int, cap_mb: int) -> bool:
    """Whether an execution that may hold `memory_mb` would take `held_mb` past
    `cap_mb`. With nothing held it never does: an execution as large as the limits
    allow must be able to run once nothing of its caller's lingers."""
    return held_mb > 0 and held_mb + memory_mb > cap_mb
