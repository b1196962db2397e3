"""The daemon's event bus: typed events, published without waiting, to sinks and subscribers.

```
Executions, ToolAccess, gateway ──publish(BusEvent)──▶ EventBus
                                                        ├─ sinks: audit store, metrics (sync, cheap)
                                                        └─ subscriptions: one bounded buffer each
```

`publish` never blocks and never fails: a sink is a plain callable that must only hand
the event on (a `send_nowait`, a counter), and a subscriber whose buffer is full is
dropped on the spot, with a reason it is told once, rather than allowed to slow the
daemon. This module knows nothing about connections or the wire beyond `BusEvent.to_wire`,
which gives an event the wire form the client reads (`conduit.core.events.Event`).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import trio

from conduit.core.events import Event
from conduit.daemon.records import ExecutionRecord, SessionRecord

__all__ = ["BusEvent", "BusSubscription", "EventBus", "EventType", "Sink"]

log = logging.getLogger("conduit.events")

# Events one subscriber may have waiting before it counts as too slow and is dropped.
SUBSCRIBER_BUFFER = 1024


class EventType(enum.StrEnum):
    """Every kind of event, by its wire name."""

    EXECUTION_STARTED = "execution.started"
    EXECUTION_MOVED = "execution.moved"
    EXECUTION_FINISHED = "execution.finished"
    EXECUTION_FAILED = "execution.failed"
    EXECUTION_TIMED_OUT = "execution.timed_out"
    LIMIT_EXCEEDED = "limit.exceeded"
    POLICY_VIOLATION = "policy.violation"
    TOOL_CALLED = "tool.called"
    UPSTREAM_UP = "upstream.up"
    UPSTREAM_DOWN = "upstream.down"
    SESSION_CREATED = "session.created"
    SESSION_RESET = "session.reset"
    SESSION_ENDED = "session.ended"


# Events about one principal's executions; every other kind is about the daemon.
PRINCIPAL_EVENTS = frozenset(
    {
        EventType.EXECUTION_STARTED,
        EventType.EXECUTION_MOVED,
        EventType.EXECUTION_FINISHED,
        EventType.EXECUTION_FAILED,
        EventType.EXECUTION_TIMED_OUT,
        EventType.LIMIT_EXCEEDED,
        EventType.POLICY_VIOLATION,
        EventType.TOOL_CALLED,
        EventType.SESSION_CREATED,
        EventType.SESSION_RESET,
        EventType.SESSION_ENDED,
    }
)


@dataclass(frozen=True, slots=True)
class BusEvent:
    """Something that happened, as the bus carries it. `principal` owns it (None: the
    daemon's own events).

    `record` is the ended execution for the events that end one, for in-process sinks;
    `data` is what subscribers are sent.
    """

    type: EventType
    data: dict[str, Any]
    principal: str | None = None
    ts: float = field(default_factory=time.time)
    record: ExecutionRecord | None = field(default=None, compare=False)
    # An execution that has just started, as the audit store keeps it until it ends
    # (status `running`); not an ended execution, so no sink counts it as one.
    started: ExecutionRecord | None = field(default=None, compare=False)
    # A session created or ended, as the audit store keeps it.
    session: SessionRecord | None = field(default=None, compare=False)

    def to_wire(self, subscription: str | None = None) -> dict[str, Any]:
        """The `event` notification's params for `subscription`: the wire `Event`, its
        time to the microsecond; who owns it and its record stay here."""
        return Event(str(self.type), round(self.ts, 6), self.data, subscription).to_wire()


Sink = Callable[[BusEvent], None]


class BusSubscription:
    """One subscriber's bounded view of the bus; iterate it with `async for`.

    Iteration ends when the subscription is closed or dropped; `dropped` then says why
    it was dropped (None if it was closed by its owner).
    """

    def __init__(
        self,
        bus: EventBus,
        types: frozenset[EventType] | None,
        principal: str | None,
        buffer: int,
    ) -> None:
        self._bus = bus
        self.types = types
        # None: sees every event (the master); else only this principal's own.
        self.principal = principal
        self.buffer = buffer
        self._send, self._receive = trio.open_memory_channel[BusEvent](buffer)
        self.dropped: str | None = None

    def wants(self, event: BusEvent) -> bool:
        if self.types is not None and event.type not in self.types:
            return False
        return self.principal is None or event.principal == self.principal

    def offer(self, event: BusEvent) -> None:
        """Queue `event` without waiting; a full buffer drops the subscriber."""
        try:
            self._send.send_nowait(event)
        except trio.WouldBlock:
            self.dropped = (
                f"dropped: more than {self.buffer} events were waiting; "
                "read faster or subscribe to fewer types"
            )
            self.close()
        except trio.ClosedResourceError:
            pass

    def close(self) -> None:
        self._bus.unsubscribe(self)
        self._send.close()

    def __aiter__(self) -> BusSubscription:
        return self

    async def __anext__(self) -> BusEvent:
        try:
            return await self._receive.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    def __enter__(self) -> BusSubscription:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class EventBus:
    """Fans events out to sinks and subscriptions; `publish` never waits."""

    def __init__(self, *, buffer: int = SUBSCRIBER_BUFFER) -> None:
        self.buffer = buffer
        self._sinks: list[Sink] = []
        self._subscriptions: set[BusSubscription] = set()

    def __repr__(self) -> str:
        return f"<EventBus sinks={len(self._sinks)} subscriptions={len(self._subscriptions)}>"

    def add_sink(self, sink: Sink) -> None:
        """Hand every event to `sink`, synchronously; it must not block or yield."""
        self._sinks.append(sink)

    def subscribe(
        self, types: Iterable[EventType] | None = None, *, principal: str | None = None
    ) -> BusSubscription:
        """A new subscription to `types` (all if None), seeing only `principal`'s events
        unless `principal` is None. Close it (or use it as a context manager)."""
        chosen = frozenset(types) if types is not None else None
        subscription = BusSubscription(self, chosen, principal, self.buffer)
        self._subscriptions.add(subscription)
        return subscription

    def unsubscribe(self, subscription: BusSubscription) -> None:
        self._subscriptions.discard(subscription)

    @property
    def subscribers(self) -> int:
        return len(self._subscriptions)

    def publish(self, event: BusEvent) -> None:
        """Give `event` to every sink and every subscription that wants it."""
        for sink in self._sinks:
            try:
                sink(event)
            except Exception:
                # A broken sink must not cost the execution that published the event.
                log.exception("event sink failed", extra={"event": str(event.type)})
        for subscription in list(self._subscriptions):
            if subscription.wants(event):
                subscription.offer(event)
