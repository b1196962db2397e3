"""One event model: what the daemon's bus sends is what the client reads."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from conduit.client import Event as ClientEvent
from conduit.core.events import SUBSCRIPTION_DROPPED, Event
from conduit.daemon.events import BusEvent, EventType

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
# The envelope's members are not the event's data: the wire form keeps them apart.
data_keys = st.text().filter(lambda key: key not in ("type", "ts", "subscription"))
events = st.builds(
    Event,
    type=st.text(),
    ts=st.none() | st.floats(allow_nan=False, allow_infinity=False),
    data=st.dictionaries(data_keys, json_scalars, max_size=4),
    subscription=st.none() | st.text(),
)


@given(events)
def test_an_event_round_trips_through_its_wire_form(event: Event) -> None:
    assert Event.from_wire(event.to_wire()) == event


def test_the_client_reads_the_core_event() -> None:
    assert ClientEvent is Event


def test_the_bus_sends_an_event_the_client_reads_back() -> None:
    published = BusEvent(EventType.TOOL_CALLED, {"tool": "echo__echo"}, "alice", ts=12.5)
    wire = published.to_wire("sub_1")
    assert wire == {
        "subscription": "sub_1",
        "type": "tool.called",
        "ts": 12.5,
        "tool": "echo__echo",
    }
    assert Event.from_wire(wire) == Event("tool.called", 12.5, {"tool": "echo__echo"}, "sub_1")


def test_a_dropped_subscription_is_told_in_an_event() -> None:
    wire = Event(SUBSCRIPTION_DROPPED, 1.0, {"reason": "too slow"}, "sub_1").to_wire()
    assert wire == {
        "subscription": "sub_1",
        "type": SUBSCRIPTION_DROPPED,
        "ts": 1.0,
        "reason": "too slow",
    }
