"""Which reader gets each notification: output to its `execute`, events to their subscription.

Sans-I/O and never blocking: the connection's reader calls `Router.reply` for every
reply and `Router.notify` for every notification, in the order they arrived, and the
router hands items to `Sink`s (a Trio memory channel for `AsyncClient`, a deque for
`Client`) without waiting.

Routing `execution/output`. A notification names its `execution_id`; the client learns
that id only from the first chunk or the final reply, so a chunk is matched by, in turn:
its `request_id` (the id of the `execute` request, if the daemon sends it), an execution
id already bound to a stream, or, failing both, the one stream not yet bound. The
clients keep that last case unambiguous by never having two unbound streams at once
(see `AsyncClient.stream`); once the daemon has been seen to send `request_id`,
`names_requests` is set and that precaution is no longer needed.

Routing `event`. An event naming its `subscription` goes to that subscription; one
naming none goes to every subscription whose types it matches. A
`subscription.dropped` event ends the subscription with `SubscriptionDropped`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from conduit.client.errors import SubscriptionDropped
from conduit.client.results import OutputChunk
from conduit.client.wire import Notification, Reply
from conduit.core.events import SUBSCRIPTION_DROPPED, Event

__all__ = ["Router", "Sink"]

log = logging.getLogger("conduit.client")


class Sink(Protocol):
    """Where routed items go. Neither method may block."""

    def put(self, item: Any) -> bool:
        """Queue `item`; False if the sink is full (the router then ends it)."""
        ...

    def close(self, error: BaseException | None = None) -> None:
        """No more items; the reader sees `error` raised after the last one, if given."""
        ...


@dataclass(slots=True)
class _Stream:
    sink: Sink
    on_bound: Callable[[], None] | None
    execution_id: str | None = None

    def bind(self, execution_id: str) -> None:
        if self.execution_id is None:
            self.execution_id = execution_id
        self.release()

    def release(self) -> None:
        """Its execution id is known, or it ended: tell the client, once."""
        on_bound, self.on_bound = self.on_bound, None
        if on_bound is not None:
            on_bound()


@dataclass(slots=True)
class _Subscription:
    sink: Sink
    types: frozenset[str] | None

    def wants(self, event: Event) -> bool:
        return self.types is None or event.type in self.types or event.type == SUBSCRIPTION_DROPPED


class Router:
    """Routes one connection's notifications; see the module docstring for the rules."""

    def __init__(self) -> None:
        self._streams: dict[Any, _Stream] = {}  # by request id
        self._pending_subscriptions: dict[Any, _Subscription] = {}  # by request id
        self._subscriptions: dict[str, _Subscription] = {}  # by subscription id
        # Set once an `execution/output` notification carried `request_id`.
        self.names_requests = False

    def expect_output(
        self, request_id: Any, sink: Sink, on_bound: Callable[[], None] | None = None
    ) -> None:
        """Route output of the execution `request_id` starts to `sink` until its reply.

        `on_bound` is called once, when the execution id is known (first chunk or
        reply) or the request was answered with an error.
        """
        self._streams[request_id] = _Stream(sink, on_bound)

    def expect_events(self, request_id: Any, sink: Sink, types: Iterable[str] | None) -> None:
        """Route events to `sink` once the `events/subscribe` request `request_id` is
        answered with a subscription id."""
        wanted = frozenset(types) if types is not None else None
        self._pending_subscriptions[request_id] = _Subscription(sink, wanted)

    def forget(self, request_id: Any) -> None:
        """The caller gave up on `request_id`: route nothing more to it."""
        self._streams.pop(request_id, None)
        self._pending_subscriptions.pop(request_id, None)

    def unsubscribe(self, subscription_id: str) -> None:
        self._subscriptions.pop(subscription_id, None)

    @property
    def unbound_streams(self) -> int:
        return sum(1 for stream in self._streams.values() if stream.execution_id is None)

    def reply(self, reply: Reply) -> None:
        """A reply arrived: finish the stream it ends, or start the subscription it opens."""
        result = reply.message.get("result")
        stream = self._streams.pop(reply.id, None)
        if stream is not None:
            if isinstance(result, dict) and isinstance(result.get("execution_id"), str):
                stream.bind(result["execution_id"])
            stream.release()
            stream.sink.close()
        subscription = self._pending_subscriptions.pop(reply.id, None)
        if subscription is not None:
            if isinstance(result, dict) and isinstance(result.get("subscription"), str):
                self._subscriptions[result["subscription"]] = subscription
            else:
                subscription.sink.close()

    def notify(self, notification: Notification) -> None:
        """Hand a notification to its reader; one that cannot be read is logged and
        dropped, never raised into the connection's reader."""
        try:
            if notification.method == "execution/output":
                self._output(notification.params)
            elif notification.method == "event":
                self._event(Event.from_wire(notification.params))
            else:
                log.debug("notification ignored", extra={"method": notification.method})
        except (TypeError, ValueError, AttributeError) as exc:
            log.warning(
                "malformed notification dropped",
                extra={"method": notification.method, "error": str(exc)},
            )

    def close_all(self, error: BaseException) -> None:
        """The connection is gone: end every stream and subscription with `error`."""
        sinks = [s.sink for s in self._streams.values()]
        sinks += [s.sink for s in self._pending_subscriptions.values()]
        sinks += [s.sink for s in self._subscriptions.values()]
        self._streams.clear()
        self._pending_subscriptions.clear()
        self._subscriptions.clear()
        for sink in sinks:
            sink.close(error)

    def _output(self, params: Any) -> None:
        chunk = OutputChunk.from_wire(params)
        stream = self._stream_for(params.get("request_id"), chunk.execution_id)
        if stream is None:
            log.debug("output for no stream of ours", extra={"execution_id": chunk.execution_id})
            return
        stream.bind(chunk.execution_id)
        # Output is bounded by the execution's own output limit, so sinks take it all.
        stream.sink.put(chunk)

    def _stream_for(self, request_id: Any, execution_id: str) -> _Stream | None:
        if request_id is not None:
            self.names_requests = True
            return self._streams.get(request_id)
        for stream in self._streams.values():
            if stream.execution_id == execution_id:
                return stream
        unbound = [s for s in self._streams.values() if s.execution_id is None]
        return unbound[0] if len(unbound) == 1 else None

    def _event(self, event: Event) -> None:
        if event.subscription is not None:
            found = self._subscriptions.get(event.subscription)
            targets = {event.subscription: found} if found is not None else {}
        else:
            targets = dict(self._subscriptions)
        for subscription_id, subscription in targets.items():
            if not subscription.wants(event):
                continue
            if event.type == SUBSCRIPTION_DROPPED:
                reason = event.data.get("reason") or event.data.get("message")
                self._end(subscription_id, SubscriptionDropped(str(reason or _DROPPED)))
            elif not subscription.sink.put(event):
                self._end(subscription_id, SubscriptionDropped(_FELL_BEHIND))

    def _end(self, subscription_id: str, error: SubscriptionDropped) -> None:
        subscription = self._subscriptions.pop(subscription_id, None)
        if subscription is not None:
            subscription.sink.close(error)


_DROPPED = "the daemon dropped this subscription; subscribe again"
_FELL_BEHIND = (
    "dropped by the client: too many events were waiting to be read; "
    "read faster or subscribe to fewer types"
)
