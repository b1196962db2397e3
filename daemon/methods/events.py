"""`events/subscribe` and `events/unsubscribe`: the event bus, as notifications on a connection.

Each subscription is one task of the caller's connection (`Peer.start_stream`)
that takes events from a bounded `BusSubscription` and sends each one as

    {"jsonrpc": "2.0", "method": "event",
     "params": {"subscription": "sub_…", "type": "execution.finished", "ts": …, …}}

The bus never waits for it. When the client stops reading, the connection's outbox
fills, the task waits on it, the subscription's buffer (`events.subscriber_buffer`)
fills and the bus drops the subscription. The task then sends what was already
buffered and one last notification, `{"type": "subscription.dropped", "subscription",
"reason"}`, queued behind it, and ends. A subscription also ends with
`events/unsubscribe` and with its connection (when the client closes or half-closes).

Scope: the master (admin scope) sees every event, the daemon's own (`upstream.*`)
included; anyone else sees only the events of their own executions and tool calls.
"""

from __future__ import annotations

import secrets
import time
from functools import partial
from typing import TYPE_CHECKING, Any

import trio
from pydantic import Field

from conduit.core.errors import Forbidden, InvalidParams, InvalidRequest, NotFound
from conduit.core.events import SUBSCRIPTION_DROPPED, Event
from conduit.daemon.dispatcher import CallContext, MethodRouter, Params
from conduit.daemon.events import PRINCIPAL_EVENTS, BusSubscription, EventType

router = MethodRouter()

if TYPE_CHECKING:
    from conduit.daemon.dispatcher import Peer

__all__ = ["SubscribeParams", "UnsubscribeParams"]

# A client needs one or two; each may hold `subscriber_buffer` events in memory.
MAX_SUBSCRIPTIONS_PER_CONNECTION = 16


class SubscribeParams(Params):
    types: list[str] | None = Field(
        None,
        description="event types to receive (default: every type you may see): "
        + ", ".join(EventType),
    )


class UnsubscribeParams(Params):
    subscription: str = Field(description="the id events/subscribe answered")


def _chosen_types(requested: list[str] | None, *, admin: bool) -> frozenset[EventType]:
    """The types asked for, checked: `InvalidParams` naming an unknown one, `Forbidden`
    for the daemon's own events unless the caller is the master."""
    visible = frozenset(EventType) if admin else PRINCIPAL_EVENTS
    if requested is None:
        return visible
    known = {str(kind) for kind in EventType}
    for name in requested:
        if name not in known:
            raise InvalidParams(
                f"invalid params for events/subscribe: types has an unknown type {name!r}; "
                f"the types are {', '.join(EventType)}",
                {"field": "types", "reason": f"unknown type {name!r}", "valid": list(EventType)},
            )
    chosen = frozenset(EventType(name) for name in requested)
    hidden = sorted(chosen - visible)
    if hidden:
        raise Forbidden(
            f"forbidden: {', '.join(hidden)} are the daemon's own events; subscribing to "
            "them needs the admin scope",
            {"types": hidden},
        )
    return chosen


@router.method("events/subscribe", params=SubscribeParams, scope="executions")
async def subscribe(params: SubscribeParams, ctx: CallContext) -> dict[str, Any]:
    """Receive events as `event` notifications on this connection until unsubscribed."""
    principal = ctx.require_principal()
    connection = ctx.peer
    if connection is None:
        raise InvalidRequest("invalid request: events/subscribe needs a client connection")
    if len(connection.subscriptions) >= MAX_SUBSCRIPTIONS_PER_CONNECTION:
        raise InvalidRequest(
            f"invalid request: a connection may hold {MAX_SUBSCRIPTIONS_PER_CONNECTION} "
            "subscriptions; call events/unsubscribe on one, or ask for more types in one"
        )
    types = _chosen_types(params.types, admin=principal.is_admin)
    subscription = ctx.events.subscribe(
        types, principal=None if principal.is_admin else principal.name
    )
    ident = "sub_" + secrets.token_hex(6)
    scope = trio.CancelScope()
    connection.subscriptions[ident] = scope
    try:
        connection.start_stream(partial(_forward, connection, ident, subscription, scope))
    except RuntimeError:
        del connection.subscriptions[ident]
        subscription.close()
        raise InvalidRequest("invalid request: this connection is closing") from None
    return {"subscription": ident, "types": sorted(types)}


async def _forward(
    connection: Peer, ident: str, subscription: BusSubscription, scope: trio.CancelScope
) -> None:
    """Send the subscription's events until it ends; then, if dropped, say so once."""
    try:
        with scope, subscription:
            async for event in subscription:
                await connection.notify("event", event.to_wire(ident))
            if subscription.dropped is not None:
                reason = {"reason": subscription.dropped}
                final = Event(SUBSCRIPTION_DROPPED, round(time.time(), 6), reason, ident)
                await connection.notify("event", final.to_wire())
    finally:
        connection.subscriptions.pop(ident, None)


@router.method("events/unsubscribe", params=UnsubscribeParams, scope="executions")
async def unsubscribe(params: UnsubscribeParams, ctx: CallContext) -> dict[str, Any]:
    """End a subscription of this connection's; no event of it follows the answer."""
    subscriptions = ctx.peer.subscriptions if ctx.peer is not None else {}
    scope = subscriptions.pop(params.subscription, None)
    if scope is None:
        raise NotFound(
            f"not found: this connection has no subscription {params.subscription!r}; "
            "it may have been dropped already",
            {"subscription": params.subscription},
        )
    scope.cancel()
    return {"unsubscribed": params.subscription}
