"""The daemon's own CPU budget for a worker between programs (`cpu_watch`), on real
processes: one that computes is killed once past its budget, one whose watch is
called off (its next program started) is left alone."""

from __future__ import annotations

import signal
import sys

import trio

from conduit.executors import cpu_watch
from conduit.executors.process import cpu_seconds

SPIN = [sys.executable, "-c", "while True: pass"]


async def test_a_process_past_its_budget_is_killed() -> None:
    process = await trio.lowlevel.open_process(SPIN)
    budget_s = cpu_seconds(process.pid) + 0.3
    try:
        with trio.fail_after(30):
            await cpu_watch.watch(process, budget_s, process.kill, trio.CancelScope())
            await process.wait()
        assert process.returncode == -signal.SIGKILL
    finally:
        process.kill()
        await process.wait()


async def test_a_watch_called_off_kills_nothing() -> None:
    process = await trio.lowlevel.open_process(SPIN)
    scope = trio.CancelScope()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cpu_watch.watch, process, 0.0, process.kill, scope)
            scope.cancel()  # before its first look
        await trio.sleep(3 * cpu_watch.WATCH_S)
        assert process.returncode is None
    finally:
        process.kill()
        await process.wait()


async def test_a_process_that_ended_ends_the_watch() -> None:
    process = await trio.lowlevel.open_process([sys.executable, "-c", "pass"])
    await process.wait()
    killed: list[bool] = []
    with trio.fail_after(5):
        await cpu_watch.watch(process, 0.0, lambda: killed.append(True), trio.CancelScope())
    assert killed == []
