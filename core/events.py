"""An event as the wire carries it: one model for the daemon's `event` notifications
and the client's parsed view of them.

The daemon sends `to_wire()` as the params of an `event` notification; the client reads
them back with `from_wire()`. What the daemon knows about an event beyond its wire form
(whose it is, the execution record it ends) stays in the daemon's bus. This module does
no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SUBSCRIPTION_DROPPED", "Event"]

# The last notification of a subscription the daemon dropped; not an event of its bus.
SUBSCRIPTION_DROPPED = "subscription.dropped"
# Members the notification itself uses; every other member is the event's data.
_ENVELOPE = ("type", "ts", "subscription")


@dataclass(frozen=True, slots=True)
class Event:
    """One event from `events/subscribe`: its `type` (`execution.finished`, ...) and data.

    `ts` is when it happened (seconds since the epoch); `subscription` is the id of the
    subscription it was sent on.
    """

    type: str
    ts: float | None = None
    data: Mapping[str, Any] = field(default_factory=dict)
    subscription: str | None = None

    def to_wire(self) -> dict[str, Any]:
        """The `event` notification's params: the envelope, then the data's members."""
        head = {} if self.subscription is None else {"subscription": self.subscription}
        return {**head, "type": self.type, "ts": self.ts, **self.data}

    @classmethod
    def from_wire(cls, params: Mapping[str, Any]) -> Event:
        data = {k: v for k, v in params.items() if k not in _ENVELOPE}
        ts = params.get("ts")
        return cls(
            type=str(params.get("type", "")),
            ts=float(ts) if isinstance(ts, int | float) else None,
            data=data,
            subscription=params.get("subscription"),
        )
