"""WarmPool on its own, with workers that only wait: refills are timed, on a virtual clock."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from conduit.executors.pool import PoolState, WarmPool

# How long each fake worker takes to become ready (virtual seconds).
START_S = 0.25


class _Worker:
    def __init__(self) -> None:
        self.done = trio.Event()

    def kill(self) -> None:
        self.done.set()

    async def aclose(self) -> None:
        self.done.set()


async def _spawn(*, task_status: trio.TaskStatus[_Worker]) -> None:
    await trio.sleep(START_S)
    worker = _Worker()
    task_status.started(worker)
    await worker.done.wait()


async def test_refills_are_timed_from_spawn_to_ready(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    pool: WarmPool[_Worker] = WarmPool(_spawn, size=2, name="fake")
    assert pool.statistics().last_refill_s is None
    await nursery.start(pool.run)
    first = pool.statistics()
    assert (first.state, first.idle, first.refills) == (PoolState.READY, 2, 2)
    assert first.refill_seconds_total == pytest.approx(2 * START_S)
    assert first.last_refill_s == pytest.approx(START_S)

    worker = pool.acquire_nowait()
    assert worker is not None
    await worker.aclose()
    with trio.fail_after(5):  # virtual seconds: the refill delay and one start
        while pool.statistics().refills < 3:
            await trio.sleep(0.01)
    after = pool.statistics()
    assert (after.idle, after.refills, after.handed_out) == (2, 3, 1)
    assert after.refill_seconds_total == pytest.approx(3 * START_S)
    assert after.last_refill_s == pytest.approx(START_S)


async def test_failed_starts_are_not_refills(nursery: trio.Nursery, autojump_clock: Any) -> None:
    async def failing(*, task_status: trio.TaskStatus[_Worker]) -> None:
        await trio.sleep(START_S)
        raise OSError("no runtime")

    pool: WarmPool[_Worker] = WarmPool(failing, size=1, name="broken")
    await nursery.start(pool.run)
    stats = pool.statistics()
    assert (stats.refills, stats.start_failures) == (0, 1)
    assert (stats.refill_seconds_total, stats.last_refill_s) == (0.0, None)
