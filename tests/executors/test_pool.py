"""WarmPool on its own, with workers that only wait: refills are timed, on a virtual clock."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from conduit.executors.pool import SHRINK_AFTER_S, PoolState, WarmPool

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

    worker = await pool.acquire(within_s=0)
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


async def test_a_miss_waits_for_the_start_under_way_and_the_pool_grows(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """Back to back faster than workers start: each request that finds none takes the
    start already under way (sooner than one of its own), and the pool aims higher."""
    pool: WarmPool[_Worker] = WarmPool(_spawn, size=1, max_size=3, name="fake")
    await nursery.start(pool.run)
    first = await pool.acquire(within_s=1)
    assert first is not None
    await first.aclose()
    began = trio.current_time()
    second = await pool.acquire(within_s=1)  # the refill is under way: waited for
    assert second is not None
    assert trio.current_time() - began < START_S + 0.1  # not a start of its own after it
    stats = pool.statistics()
    assert (stats.cold_starts, stats.waited_for_start, stats.size) == (1, 1, 2)
    await second.aclose()
    with trio.fail_after(5):
        while pool.statistics().idle < 2:
            await trio.sleep(0.01)


async def test_a_miss_with_no_start_under_way_is_left_to_the_caller(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    pool: WarmPool[_Worker] = WarmPool(_spawn, size=0, max_size=0, name="fake")
    await nursery.start(pool.run)
    assert await pool.acquire(within_s=1) is None
    assert trio.current_time() == 0  # not waited for: nothing was starting
    assert pool.statistics().size == 0  # and no room to grow


async def test_growth_stops_at_the_cap_or_when_memory_is_short(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    room = [True]
    pool: WarmPool[_Worker] = WarmPool(
        _spawn, size=1, max_size=3, may_grow=lambda: room[0], name="fake"
    )
    await nursery.start(pool.run)
    for _ in range(5):
        await pool.acquire(within_s=0)
    assert pool.statistics().size == 3
    shrinking: WarmPool[_Worker] = WarmPool(
        _spawn, size=1, max_size=3, may_grow=lambda: room[0], name="short"
    )
    await nursery.start(shrinking.run)
    room[0] = False
    for _ in range(3):
        await shrinking.acquire(within_s=0)
    assert shrinking.statistics().size == 1


async def test_a_quiet_minute_takes_one_worker_back(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    pool: WarmPool[_Worker] = WarmPool(_spawn, size=1, max_size=4, name="fake")
    await nursery.start(pool.run)
    for _ in range(4):
        await pool.acquire(within_s=0)
    assert pool.statistics().size == 4
    await trio.sleep(SHRINK_AFTER_S + 1)
    assert pool.statistics().size == 3
    await trio.sleep(2 * SHRINK_AFTER_S + 1)
    stats = pool.statistics()
    assert stats.size == 1 and stats.idle == 1  # back to its base, idle ones closed


async def test_a_burst_beyond_max_starting_is_left_to_start_its_own(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """Sixteen at once: two wait for the pool's starts, the rest start their own at
    once rather than queue behind them."""
    pool: WarmPool[_Worker] = WarmPool(_spawn, size=0, max_size=4, max_starting=2, name="f")
    await nursery.start(pool.run)
    got: list[_Worker | None] = []

    async def one() -> None:
        got.append(await pool.acquire(within_s=5))

    async with trio.open_nursery() as burst:
        for _ in range(16):
            burst.start_soon(one)
    assert sum(worker is not None for worker in got) == 2
    assert pool.statistics().waited_for_start == 2
