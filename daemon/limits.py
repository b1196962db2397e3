"""Admission control: connection slots, execution slots and a per-principal rate limit.

`ConnectionBudget` holds one listener kind's connection slots (the Unix socket, TCP and
the sandboxes' callback socket each have their own, so filling one never locks the
others out) and caps, per peer, the connections not yet authenticated. `Admission`
caps how many executions are under way at once, waits on tools and timers included
(how many of them compute at once is the executors' own bound: their CPU slots), and
how many may wait; a full queue is refused at once with `Overloaded`, never left to
pile up. `RateLimiter` is a token bucket per
principal name. Neither of the last two ever sees a sandbox's own tool calls: those
travel under session tokens and never take an execution slot (a program holding the
only slot must still be able to call its tools).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from conduit.core.errors import Overloaded, RateLimited

__all__ = [
    "Admission",
    "AdmissionStatistics",
    "BudgetStatistics",
    "ConnectionBudget",
    "ConnectionSlot",
    "RateLimiter",
]

# Slots past `capacity` that only a reserved peer (the daemon's own uid on the Unix
# socket) may take: enough for an operator's CLI and a relay or two when the rest is full.
_RESERVE = 32


@dataclass(frozen=True, slots=True)
class BudgetStatistics:
    open: int
    unauthenticated: int
    capacity: int
    per_peer_unauthenticated: int


class ConnectionSlot:
    """One admitted connection's hold on its budget; `release()` is idempotent."""

    __slots__ = ("_budget", "_peer", "_pending", "_released")

    def __init__(self, budget: ConnectionBudget, peer: Hashable, *, pending: bool) -> None:
        self._budget = budget
        self._peer = peer
        self._pending = pending
        self._released = False

    def authenticated(self) -> None:
        """The peer has proved who it is: it no longer counts against its peer's cap."""
        if self._pending:
            self._pending = False
            self._budget._forget_pending(self._peer)

    def release(self) -> None:
        """The connection has closed: give its slot back."""
        if not self._released:
            self._released = True
            self.authenticated()
            self._budget._open -= 1


class ConnectionBudget:
    """Slots for one listener kind's connections, and a cap per peer on those that have
    not authenticated yet (a source IP on TCP, a uid on the Unix socket).

    Counting only: nothing here waits or closes anything. The caller refuses a
    connection `admit` returns None for, and releases the slot of one it admitted.
    """

    def __init__(self, capacity: int, per_peer_unauthenticated: int | None) -> None:
        self._open = 0
        self._pending: dict[Hashable, int] = {}
        self.reconfigure(capacity, per_peer_unauthenticated)

    def reconfigure(self, capacity: int, per_peer_unauthenticated: int | None) -> None:
        """New caps, for connections admitted from now on (open ones stay)."""
        self._capacity = capacity
        self._per_peer = per_peer_unauthenticated

    def admit(
        self, peer: Hashable, *, authenticated: bool, reserved: bool = False
    ) -> ConnectionSlot | str:
        """A slot for a new connection from `peer`, or why there is none.

        `reserved` peers may also take the few slots kept past `capacity`.
        """
        limit = self._capacity + (_RESERVE if reserved else 0)
        if self._open >= limit:
            return f"too many connections ({self._open} open)"
        if not authenticated and self._per_peer is not None:
            pending = self._pending.get(peer, 0)
            if pending >= self._per_peer:
                return f"too many unauthenticated connections from this peer ({pending})"
            self._pending[peer] = pending + 1
        self._open += 1
        return ConnectionSlot(self, peer, pending=not authenticated and self._per_peer is not None)

    def _forget_pending(self, peer: Hashable) -> None:
        left = self._pending[peer] - 1
        if left:
            self._pending[peer] = left
        else:
            del self._pending[peer]

    def statistics(self) -> BudgetStatistics:
        return BudgetStatistics(
            open=self._open,
            unauthenticated=sum(self._pending.values()),
            capacity=self._capacity,
            per_peer_unauthenticated=self._per_peer or 0,
        )


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

    def has_free_slot(self) -> bool:
        """Whether `slot` would be held at once, without waiting in the queue."""
        return self._limiter.available_tokens >= 1 and not self._waiting

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
