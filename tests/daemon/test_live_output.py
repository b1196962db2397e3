"""An execution's output hook: numbered notifications, and a bound on a stuck client."""

from __future__ import annotations

from typing import Any

import trio

from conduit.daemon.executions import OUTPUT_STALL_S, LiveOutput


async def test_pieces_are_numbered_in_order() -> None:
    sent: list[dict[str, Any]] = []

    async def sink(params: dict[str, Any]) -> None:
        sent.append(params)

    live = LiveOutput("ex_1", sink)
    await live("stdout", "a")
    await live("stderr", "b")
    assert sent == [
        {"execution_id": "ex_1", "stream": "stdout", "text": "a", "seq": 0},
        {"execution_id": "ex_1", "stream": "stderr", "text": "b", "seq": 1},
    ]


async def test_a_client_that_takes_nothing_holds_the_program_up_once_and_briefly(
    autojump_clock: trio.abc.Clock,
) -> None:
    offered: list[str] = []

    async def stuck(params: dict[str, Any]) -> None:
        offered.append(params["text"])
        await trio.sleep_forever()  # the connection's outbox is full

    live = LiveOutput("ex_1", stuck)
    started = trio.current_time()
    # Shielded, as OutputCapture.pump awaits the hook: only the hook's own bound helps.
    with trio.CancelScope(shield=True):
        await live("stdout", "first")
    assert trio.current_time() - started == OUTPUT_STALL_S
    assert live.stalled
    with trio.CancelScope(shield=True):
        await live("stdout", "second")
    assert trio.current_time() - started == OUTPUT_STALL_S  # not waited for again
    assert offered == ["first"]


async def test_pieces_wait_their_turn(autojump_clock: trio.abc.Clock) -> None:
    """Two streams' pumps call the hook at once; the second waits for the first."""
    sent: list[int] = []

    async def slow(params: dict[str, Any]) -> None:
        await trio.sleep(0.1)
        sent.append(params["seq"])

    live = LiveOutput("ex_1", slow)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(live, "stdout", "a")
        nursery.start_soon(live, "stderr", "b")
    assert sent == [0, 1]
