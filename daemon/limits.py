"""Admission control for executions and a per-principal rate limit.

`Admission` caps how many executions run at once and how many may wait; a full queue
is refused at once with `Overloaded`, never left to pile up. `RateLimiter` is a token
bucket per principal name. Neither ever sees a sandbox's own tool calls: those travel
under session tokens and never take an execution slot (a program holding the only slot
must still be able to call its tools).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from conduit.daemon.errors import Overloaded, RateLimited

__all__ = ["Admission", "AdmissionStatistics", "RateLimiter"]


@dataclass(frozen=True, slots=True)
class AdmissionStatistics:
    running: int
    waiting: int
    capacity: int
    queue_size: int


class Admission:
    """Execution slots plus a bounded queue in front of them."""

    def __init__(self, capacity: int, queue_size: int, queue_timeout_s: float) -> None:
        self._limiter = trio.CapacityLimiter(capacity)
        self._queue_size = queue_size
        self._queue_timeout_s = queue_timeout_s
        self._waiting = 0

    def reconfigure(self, capacity: int, queue_size: int, queue_timeout_s: float) -> None:
        self._limiter.total_tokens = capacity
        self._queue_size = queue_size
        self._queue_timeout_s = queue_timeout_s

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[float]:
        """Hold an execution slot; yields how long the caller waited, in seconds.

        Raises `Overloaded` at once when the queue is full, or after `queue_timeout_s`.
        """
        started = trio.current_time()
        try:
            self._limiter.acquire_nowait()
        except trio.WouldBlock:
            await self._wait_in_queue()
        try:
            yield trio.current_time() - started
        finally:
            self._limiter.release()

    async def _wait_in_queue(self) -> None:
        if self._waiting >= self._queue_size:
            raise Overloaded(
                f"overloaded: {self._limiter.borrowed_tokens} executions running and "
                f"{self._waiting} queued; retry later",
                {"running": self._limiter.borrowed_tokens, "queued": self._waiting},
            )
        self._waiting += 1
        try:
            with trio.move_on_after(self._queue_timeout_s) as scope:
                await self._limiter.acquire()
        finally:
            self._waiting -= 1
        if scope.cancelled_caught:
            raise Overloaded(
                f"overloaded: waited {self._queue_timeout_s:g} s for an execution slot; retry later"
            )

    def statistics(self) -> AdmissionStatistics:
        return AdmissionStatistics(
            running=self._limiter.borrowed_tokens,
            waiting=self._waiting,
            capacity=int(self._limiter.total_tokens),
            queue_size=self._queue_size,
        )


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """A token bucket per principal name; `per_minute == 0` turns it off."""

    def __init__(self, per_minute: float, burst: int) -> None:
        self._buckets: dict[str, _Bucket] = {}
        self.reconfigure(per_minute, burst)

    def reconfigure(self, per_minute: float, burst: int) -> None:
        self._rate_per_s = per_minute / 60.0
        self._burst = burst
        self._buckets.clear()

    def check(self, principal_name: str) -> None:
        """Spend one token for `principal_name` or raise `RateLimited`."""
        if self._rate_per_s <= 0:
            return
        now = trio.current_time()
        bucket = self._buckets.setdefault(principal_name, _Bucket(self._burst, now))
        bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.updated) * self._rate_per_s)
        bucket.updated = now
        if bucket.tokens < 1:
            retry_after_s = (1 - bucket.tokens) / self._rate_per_s
            raise RateLimited(
                f"rate limited: {principal_name} may start {self._rate_per_s * 60:g} "
                f"executions a minute; retry in {retry_after_s:.1f} s",
                {"retry_after_s": round(retry_after_s, 3)},
            )
        bucket.tokens -= 1
