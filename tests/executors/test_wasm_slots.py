"""CPU slots (`wasm_slots`): who gets one, in what order, and when a waiting guest's
slot goes to another."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from conduit.executors import wasm
from conduit.executors.base import Job, Limits, Outcome, Status
from conduit.executors.wasm_python import WasmPythonExecutor
from conduit.executors.wasm_slots import CpuSlots, Seat
from tests.sandboxes import WAIT_S, NoBridge


async def test_seats_beyond_the_total_wait_and_get_a_slot_as_one_is_released() -> None:
    slots = CpuSlots(2)
    first, second, third = Seat(), Seat(), Seat()
    assert slots.take_nowait(first) and slots.take_nowait(second)
    assert not slots.take_nowait(third)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(slots.take, third)
        await trio.testing.wait_all_tasks_blocked()
        assert slots.statistics().starting == 1 and not third.held
        slots.release(first)
        await trio.testing.wait_all_tasks_blocked()
    assert third.held and not first.held
    assert slots.statistics().running == 2
    slots.release(first)  # releasing a seat that holds nothing changes nothing
    assert slots.statistics().running == 2


async def test_guests_back_from_a_wait_go_before_guests_not_started() -> None:
    slots = CpuSlots(1)
    holder, starting, resuming = Seat(), Seat(), Seat()
    assert slots.take_nowait(holder)
    order: list[str] = []

    async def take(seat: Seat, name: str, resuming: bool) -> None:
        await slots.take(seat, resuming=resuming)
        order.append(name)
        slots.release(seat)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(take, starting, "starting", False)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(take, resuming, "resuming", True)
        await trio.testing.wait_all_tasks_blocked()
        # A new guest does not jump the queue either, even when a slot is free.
        slots.release(holder)
    assert order == ["resuming", "starting"]


async def test_a_wait_cancelled_as_its_slot_comes_passes_the_slot_on() -> None:
    slots = CpuSlots(1)
    holder, cancelled, next_in_line = Seat(), Seat(), Seat()
    assert slots.take_nowait(holder)
    scope = trio.CancelScope()

    async def take_then_give_up() -> None:
        with scope:
            await slots.take(cancelled)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(take_then_give_up)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(slots.take, next_in_line)
        await trio.testing.wait_all_tasks_blocked()
        scope.cancel()  # `cancelled` will see it when it next runs...
        slots.release(holder)  # ...and is handed the slot before that
    assert not cancelled.held and next_in_line.held
    assert slots.statistics().running == 1


@pytest.mark.parametrize("waiting", [False, True])
async def test_the_slot_of_a_guest_not_seen_running_goes_to_one_that_waits(
    waiting: bool,
) -> None:
    slots = CpuSlots(1, stale_after_s=0.05, check_every_s=0.01)
    blocked, newcomer = Seat(), Seat()
    assert slots.take_nowait(blocked)
    blocked.beat = time.monotonic() - 1  # its guest has not run for a second
    async with trio.open_nursery() as nursery:
        await nursery.start(slots.serve)
        if waiting:
            with trio.fail_after(5):
                await slots.take(newcomer)
            assert newcomer.held and not blocked.held
            assert slots.taken == 1
        else:  # nobody waits: nothing is taken, and nothing is watched
            await trio.sleep(0.2)
            assert blocked.held and slots.taken == 0
        nursery.cancel_scope.cancel()


async def test_a_running_guest_keeps_its_slot_while_others_wait() -> None:
    slots = CpuSlots(1, stale_after_s=0.05, check_every_s=0.01)
    busy, waiting = Seat(), Seat()
    assert slots.take_nowait(busy)
    async with trio.open_nursery() as nursery:
        await nursery.start(slots.serve)
        nursery.start_soon(slots.take, waiting)
        for _ in range(20):  # its guest's thread marks it alive at every tick
            busy.beat = time.monotonic()
            await trio.sleep(0.01)
        assert busy.held and not waiting.held
        slots.release(busy)
        await trio.testing.wait_all_tasks_blocked()
        assert waiting.held
        nursery.cancel_scope.cancel()


class GateBridge:
    """A bridge whose every call waits until the test opens the gate."""

    session_token = "unused"
    callback = None

    def __init__(self) -> None:
        self.entered = trio.Event()
        self.gate = trio.Event()

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        self.entered.set()
        await self.gate.wait()
        return {"content": [], "structuredContent": {"ok": True}, "isError": False}


async def test_waiting_for_the_cpu_after_a_tool_call_is_queueing_not_the_programs_time(
    nursery: trio.Nursery, wasm_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One slot: a program's tool call returns while another computes. It waits for the
    slot, and that wait neither times it out nor shows on its own clock."""
    monkeypatch.setattr(wasm, "CONCURRENT_EXECUTIONS", 1)
    executor = WasmPythonExecutor(cache_dir=wasm_cache)
    await nursery.start(executor.serve)
    with trio.fail_after(WAIT_S):
        assert await executor.wait_ready(), executor.info().reason
    assert executor.info().pool["cpu_slots"] == 1
    bridge = GateBridge()
    waiting_code = (
        "import time\nt = time.monotonic()\ntools.gate.open()\nround(time.monotonic() - t, 3)"
    )
    # Three seconds of computing by its own clock, which stands still while it queues.
    busy_code = "import time\nend = time.monotonic() + 3\nwhile time.monotonic() < end: pass\n1"
    outcomes: dict[str, Outcome] = {}

    async def run(name: str, code: str, timeout_ms: int, bridge: Any) -> None:
        job = Job(name, "python", code, Limits(timeout_ms=timeout_ms))
        outcomes[name] = await executor.run(job, bridge)

    with trio.fail_after(WAIT_S):
        async with trio.open_nursery() as running:
            running.start_soon(run, "waiting", waiting_code, 1000, bridge)
            await bridge.entered.wait()  # in its tool call: its slot is free
            running.start_soon(run, "busy", busy_code, 20_000, NoBridge())
            while executor.info().pool["running_guests"] == 0:
                await trio.sleep(0.01)
            bridge.gate.set()  # back from its tool while the other computes
    waited, busy = outcomes["waiting"], outcomes["busy"]
    assert (busy.status, busy.result) == (Status.OK, 1), busy
    # Back from the tool, it queued behind the busy program, longer than its own
    # timeout allows, and still finished: the queueing is not its time...
    assert waited.status is Status.OK, waited
    assert waited.queue_s > 0
    # ...nor on its clock, which saw only its own run.
    assert waited.result < 1.0
