"""The event bus: sinks see everything, subscriptions see what they asked for, and a full
subscription is dropped instead of slowing whoever publishes."""

from __future__ import annotations

import logging

import pytest
import trio

from conduit.daemon.events import BusEvent, EventBus, EventType


def _event(
    kind: EventType = EventType.EXECUTION_STARTED, principal: str | None = "alice"
) -> BusEvent:
    return BusEvent(kind, {"execution_id": "ex_1"}, principal)


def test_sinks_receive_every_event_in_order() -> None:
    bus = EventBus()
    seen: list[BusEvent] = []
    bus.add_sink(seen.append)
    events = [_event(kind) for kind in (EventType.EXECUTION_STARTED, EventType.TOOL_CALLED)]
    for event in events:
        bus.publish(event)
    assert seen == events


def test_a_failing_sink_costs_nothing_but_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    bus = EventBus()
    seen: list[BusEvent] = []

    def broken(event: BusEvent) -> None:
        raise RuntimeError("disk on fire")

    bus.add_sink(broken)
    bus.add_sink(seen.append)
    with caplog.at_level(logging.ERROR, logger="conduit.events"):
        bus.publish(_event())
    assert len(seen) == 1
    assert "event sink failed" in caplog.text


async def test_a_subscription_sees_only_its_types_and_its_principal() -> None:
    bus = EventBus()
    with bus.subscribe([EventType.TOOL_CALLED], principal="alice") as mine:
        bus.publish(_event(EventType.EXECUTION_STARTED, "alice"))
        bus.publish(_event(EventType.TOOL_CALLED, "bob"))
        wanted = _event(EventType.TOOL_CALLED, "alice")
        bus.publish(wanted)
        bus.publish(_event(EventType.UPSTREAM_DOWN, None))
        with trio.fail_after(5):
            assert await mine.__anext__() is wanted
        assert mine.dropped is None


async def test_the_master_view_sees_the_daemons_own_events() -> None:
    bus = EventBus()
    with bus.subscribe() as everything:
        down = _event(EventType.UPSTREAM_DOWN, None)
        bus.publish(down)
        with trio.fail_after(5):
            assert await everything.__anext__() is down


async def test_a_full_subscription_is_dropped_and_told_why() -> None:
    bus = EventBus(buffer=3)
    subscription = bus.subscribe()
    for _ in range(10):
        bus.publish(_event())  # never waits, however far behind the reader is
    assert bus.subscribers == 0
    assert subscription.dropped is not None
    assert "more than 3 events" in subscription.dropped
    received = [event async for event in subscription]
    assert len(received) == 3  # what was buffered is still delivered, then it ends


async def test_closing_ends_iteration_without_a_reason() -> None:
    bus = EventBus()
    subscription = bus.subscribe()
    subscription.close()
    assert [event async for event in subscription] == []
    assert subscription.dropped is None
    bus.publish(_event())  # publishing to nobody is fine


def test_wire_form_carries_type_time_and_data() -> None:
    event = BusEvent(EventType.TOOL_CALLED, {"tool": "echo__echo"}, "alice", ts=12.5)
    assert event.to_wire() == {"type": "tool.called", "ts": 12.5, "tool": "echo__echo"}
