"""`StopSignal`: how the daemon asks an executor to stop a program."""

from __future__ import annotations

from conduit.executors.base import StopSignal


def test_callbacks_run_once_in_order_while_their_block_lasts() -> None:
    stop, called = StopSignal(), []
    with stop.calling(lambda: called.append("first")), stop.calling(lambda: called.append("2nd")):
        stop.set()
        stop.set()
    assert called == ["first", "2nd"]
    assert stop.is_set()


def test_a_block_that_ended_is_not_called() -> None:
    stop, called = StopSignal(), []
    with stop.calling(lambda: called.append("gone")):
        pass
    stop.set()
    assert called == []


def test_a_signal_set_already_calls_back_at_once() -> None:
    stop, called = StopSignal(), []
    stop.set()
    with stop.calling(lambda: called.append("now")):
        assert called == ["now"]
    assert called == ["now"]
