"""`HostPool` on its own, with stand-in hosts: handing out only ready hosts, recycling
them after a program, replacing the ones that may not run another, growing while
programs wait on busy hosts and shrinking back. The real hosts are tried in
tests/executors/test_pyodide.py."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from conduit.executors.pyodide_host import HostBroken
from conduit.executors.pyodide_pool import GROW_CHECK_S, SURPLUS_IDLE_S, HostPool


class FakeHost:
    """Stands in for a `PyodideHost`: alive until killed; `recycle` as told."""

    def __init__(self, number: int, recycles: list[str]) -> None:
        self.number = number
        self.jobs = 0
        self.killed = trio.Event()
        self._recycles = recycles

    @property
    def alive(self) -> bool:
        return not self.killed.is_set()

    def kill(self) -> None:
        self.killed.set()

    async def aclose(self) -> None:
        self.kill()

    async def recycle(self, timeout_s: float) -> None:
        await trio.sleep(0.2)  # making the next interpreter
        if self._recycles and self._recycles.pop(0) == "broken":
            raise HostBroken("a program's code outlived it")


class Starter:
    """A pool's `start`: each call is one new FakeHost, or a failure when told."""

    def __init__(self) -> None:
        self.hosts: list[FakeHost] = []
        self.failures: list[str] = []
        self.recycles: list[str] = []

    async def __call__(self, *, task_status: Any) -> None:
        await trio.sleep(1.0)  # compiling Pyodide, making the first interpreter
        if self.failures:
            raise OSError(self.failures.pop(0))
        host = FakeHost(len(self.hosts) + 1, self.recycles)
        self.hosts.append(host)
        task_status.started(host)
        await host.killed.wait()


@pytest.fixture
async def started(nursery: trio.Nursery) -> tuple[HostPool, Starter]:
    starter = Starter()
    pool = HostPool(starter, size=1, max_size=2, recycle_timeout_s=5)
    await nursery.start(pool.run)
    return pool, starter


async def run_one(pool: HostPool, *, reusable: bool = True) -> FakeHost:
    host = await pool.acquire(within_s=30)
    assert isinstance(host, FakeHost)
    host.jobs += 1
    pool.release(host, reusable)  # type: ignore[arg-type]
    return host


async def test_a_host_is_reused_once_its_next_interpreter_is_ready(
    started: tuple[HostPool, Starter], autojump_clock: Any
) -> None:
    pool, starter = started
    first = await run_one(pool)
    assert pool.statistics()["idle"] == 0  # making its next interpreter
    second = await run_one(pool)
    assert second is first and first.alive
    stats = pool.statistics()
    assert (stats["handed_out"], stats["discarded"], stats["processes"]) == (2, 0, 1)
    assert len(starter.hosts) == 1


async def test_a_host_that_may_not_run_another_program_is_replaced(
    started: tuple[HostPool, Starter], autojump_clock: Any
) -> None:
    pool, starter = started
    first = await run_one(pool, reusable=False)
    assert not first.alive
    starter.recycles.append("broken")
    second = await run_one(pool)
    assert second is not first
    third = await run_one(pool)
    assert third is not second and not second.alive
    stats = pool.statistics()
    assert (stats["discarded"], stats["deaths"], len(starter.hosts)) == (2, 0, 3)


async def test_programs_waiting_on_busy_hosts_get_a_new_one_then_it_retires(
    started: tuple[HostPool, Starter], autojump_clock: Any
) -> None:
    pool, starter = started
    busy = await pool.acquire(within_s=30)  # a program that waits on a tool
    began = trio.current_time()
    other = await pool.acquire(within_s=30)
    assert other is not None and other is not busy
    assert trio.current_time() - began >= GROW_CHECK_S
    assert pool.statistics()["processes"] == 2
    pool.release(other, True)  # beyond `size`, and nobody waits: retired
    pool.release(busy, True)  # type: ignore[arg-type]
    assert not other.alive  # type: ignore[union-attr]
    await trio.sleep(1)
    stats = pool.statistics()
    assert (stats["processes"], stats["idle"], len(starter.hosts)) == (1, 1, 2)


async def test_no_interpreter_in_time_is_none_and_a_failing_start_says_why(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    starter = Starter()
    starter.failures += ["deno is broken"] * 3
    pool = HostPool(starter, size=1, max_size=1, recycle_timeout_s=5)
    await nursery.start(pool.run)
    assert await pool.acquire(within_s=2) is None
    assert pool.last_failure == "deno is broken" and pool.processes == 0
    host = await pool.acquire(within_s=60)  # the back-off ends, a start succeeds
    assert host is not None and pool.last_failure is None
    assert pool.statistics()["start_failures"] == 3


async def test_a_pool_of_none_starts_a_host_per_program(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    starter = Starter()
    pool = HostPool(starter, size=0, max_size=2, recycle_timeout_s=5)
    await nursery.start(pool.run)
    assert pool.processes == 0
    first = await run_one(pool)
    second = await run_one(pool)
    assert second is not first and not first.alive


async def test_a_taken_host_is_the_pools_no_more(
    started: tuple[HostPool, Starter], autojump_clock: Any
) -> None:
    pool, starter = started
    taken = await pool.take(within_s=30)
    assert isinstance(taken, FakeHost)
    assert pool.processes == 0
    await trio.sleep(1.5)
    assert pool.processes == 1  # the pool started another in its place
    other = await run_one(pool)
    assert other is not taken and taken.alive
    taken.kill()  # its owner is done with it: neither a death nor a discard
    await trio.sleep(1)
    assert await run_one(pool) is other
    stats = pool.statistics()
    counts = ("taken", "deaths", "discarded", "processes")
    assert tuple(stats[count] for count in counts) == (1, 0, 0, 1)
    assert len(starter.hosts) == 2


async def test_a_host_that_dies_while_idle_is_not_counted_idle(
    started: tuple[HostPool, Starter], autojump_clock: Any
) -> None:
    pool, starter = started
    await trio.sleep(2)  # the first host is ready
    [first] = starter.hosts
    first.kill()  # exits on its own while nobody has it
    await trio.sleep(2)  # and is replaced
    stats = pool.statistics()
    assert (stats["processes"], stats["idle"], stats["deaths"]) == (1, 1, 1), stats
    assert await run_one(pool) is starter.hosts[1]


async def test_a_host_started_for_a_program_served_meanwhile_retires_unused(
    started: tuple[HostPool, Starter], autojump_clock: Any
) -> None:
    """A program waited on a busy host, so another was started (a second of CPU); the
    busy one was done first and served it. The new one, beyond `size`, serves the next
    program that comes soon, and retires once none has for `SURPLUS_IDLE_S`, rather
    than idle for ever beside the first."""
    pool, starter = started

    async def served_meanwhile() -> None:
        busy = await pool.acquire(within_s=30)
        assert busy is not None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_one, pool)
            await trio.sleep(GROW_CHECK_S + 0.1)  # the pool has started another host
            assert pool.statistics()["starting"] == 1
            pool.release(busy, True)
        await trio.sleep(2)  # the other host is ready by now
        assert pool.statistics()["processes"] == pool.statistics()["idle"] == 2

    await served_meanwhile()
    await trio.sleep(SURPLUS_IDLE_S / 2)
    # A burst that comes soon finds both: nothing is started or killed for it.
    async with trio.open_nursery() as nursery:
        for _ in range(2):
            nursery.start_soon(run_one, pool)
    await trio.sleep(SURPLUS_IDLE_S / 2 + 1)
    assert (len(starter.hosts), pool.statistics()["discarded"]) == (2, 1)
    await served_meanwhile()  # and once more; this time none comes
    await trio.sleep(SURPLUS_IDLE_S + 1)
    stats = pool.statistics()
    assert (stats["processes"], stats["idle"]) == (1, 1), stats
    assert sum(host.alive for host in starter.hosts) == 1
