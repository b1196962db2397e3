"""Runner threads (`wasm_runners`) on the real JS component: ready instances, hand-over,
retiring, and that stopping leaves no thread behind."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable

import trio
import trio.testing

from conduit.executors import _wasmtime, thread_priority
from conduit.executors.wasm_instances import Instance, Instances
from conduit.executors.wasm_runners import Runners
from tests.sandboxes import WAIT_S

SUM = json.dumps({"function": "(async function () { return 6 * 7 })", "line_offset": 0})


class Recorder:
    """Work that runs SUM in the instance it is handed, noting where and what."""

    def __init__(self, *, keep_going: bool = True) -> None:
        self.keep_going = keep_going
        self.answers: list[str] = []
        self.threads: list[int] = []
        self.done = threading.Event()

    def __call__(self, instance: Instance | None) -> bool:
        assert instance is not None
        try:
            instance.install(_wasmtime.Interrupt(WAIT_S))
            self.answers.append(instance.run(instance.store, SUM))
            self.threads.append(threading.get_ident())
        finally:
            instance.close()
            self.done.set()
        return self.keep_going


async def wait_ready(runners: Runners, count: int) -> None:
    with trio.fail_after(WAIT_S):
        while runners.ready < count:
            await trio.sleep(0.005)


async def wait_done(work: Recorder) -> None:
    with trio.fail_after(WAIT_S):
        while not work.done.is_set():
            await trio.sleep(0.005)


async def test_each_runner_readies_an_instance_and_runs_what_it_is_handed(
    js_instances: Instances,
) -> None:
    async with trio.open_nursery() as nursery:
        runners = Runners(js_instances, count=2, threads=trio.CapacityLimiter(4))
        await nursery.start(runners.serve)
        await wait_ready(runners, 2)
        first, second = Recorder(), Recorder()
        (await runners.take()).hand(first)
        (await runners.take()).hand(second)
        await wait_done(first)
        await wait_done(second)
        assert [json.loads(a) for a in first.answers + second.answers] == [{"result": 42}] * 2
        assert first.threads != second.threads  # two threads, one execution each
        await wait_ready(runners, 2)  # each made its next instance after its work
        nursery.cancel_scope.cancel()
    assert runners.ready == 0


async def test_take_waits_for_a_runner_to_be_ready(js_instances: Instances) -> None:
    async with trio.open_nursery() as nursery:
        runners = Runners(js_instances, count=1, threads=trio.CapacityLimiter(2))
        await nursery.start(runners.serve)
        first = Recorder()
        with trio.fail_after(WAIT_S):
            only = await runners.take()
            assert runners.take_nowait() is None  # its only runner is taken
            only.hand(first)
            runner = await runners.take()  # the same runner, once it has its next instance
        second = Recorder()
        runner.hand(second)
        await wait_done(second)
        assert first.threads == second.threads
        nursery.cancel_scope.cancel()


async def test_work_that_returns_false_retires_its_runner(js_instances: Instances) -> None:
    threads = trio.CapacityLimiter(1)
    async with trio.open_nursery() as nursery:
        runners = Runners(js_instances, count=1, threads=threads)
        await nursery.start(runners.serve)
        retiring = Recorder(keep_going=False)
        with trio.fail_after(WAIT_S):
            retired = await runners.take()
        retired.hand(retiring)
        await wait_done(retiring)
        with trio.fail_after(WAIT_S):
            while threads.borrowed_tokens:  # its thread has ended
                await trio.sleep(0.005)
        assert runners.ready == 0
        runners.add()  # the replacement the executor starts
        after = Recorder()
        with trio.fail_after(WAIT_S):
            replacement = await runners.take()
        replacement.hand(after)
        await wait_done(after)
        assert replacement is not retired and retired.finished.is_set()
        assert json.loads(after.answers[0]) == {"result": 42}
        nursery.cancel_scope.cancel()


async def test_stopping_ends_every_runner_thread(js_instances: Instances) -> None:
    async with trio.open_nursery() as nursery:
        runners = Runners(js_instances, count=3, threads=trio.CapacityLimiter(3))
        await nursery.start(runners.serve)
        await wait_ready(runners, 3)
        waiting = [await runners.take() for _ in range(2)]  # taken, never handed work
        busy = Recorder()
        (await runners.take()).hand(busy)
        await wait_done(busy)
        nursery.cancel_scope.cancel()
    # `serve` returns only once every runner's thread has ended its loop.
    assert all(runner.finished.is_set() for runner in waiting)
    assert runners.ready == 0
    assert repr(runners) == "<Runners 0/0 ready>"


async def test_a_runner_is_out_of_the_idle_class_before_its_next_work(
    js_instances: Instances,
) -> None:
    """Work idles its thread once it has answered (as the executor's does); the runner
    takes it out again before it reports ready for the next."""
    seen: list[tuple[int, int]] = []

    def lowering(work: Recorder) -> Callable[[Instance | None], bool]:
        def run(instance: Instance | None) -> bool:
            at_start = os.sched_getscheduler(0)
            thread_priority.background()
            seen.append((at_start, os.sched_getscheduler(0)))
            return work(instance)

        return run

    async with trio.open_nursery() as nursery:
        runners = Runners(js_instances, count=1, threads=trio.CapacityLimiter(1))
        await nursery.start(runners.serve)
        first, second = Recorder(), Recorder()
        with trio.fail_after(WAIT_S):
            (await runners.take()).hand(lowering(first))
            await wait_done(first)
            # Taken only once ready: a `take` that found none would hurry the runner,
            # which is then left in its usual class through the next work too.
            while not runners.ready:
                await trio.sleep(0.01)
            (await runners.take()).hand(lowering(second))
            await wait_done(second)
        nursery.cancel_scope.cancel()
    idle = os.SCHED_IDLE if thread_priority.available() else os.SCHED_OTHER
    assert first.threads == second.threads
    assert seen == [(os.SCHED_OTHER, idle), (os.SCHED_OTHER, idle)]


async def test_waiting_for_a_runner_hurries_the_busy_ones(js_instances: Instances) -> None:
    """An execution that finds no runner ready takes the runners out of the idle class:
    somebody now waits for what they are doing."""
    lowered, go_on = threading.Event(), threading.Event()
    thread_ids: list[int] = []

    def idle_and_blocked(instance: Instance | None) -> bool:
        thread_ids.append(threading.get_native_id())
        thread_priority.background()
        lowered.set()
        go_on.wait(WAIT_S)
        return Recorder()(instance)

    async with trio.open_nursery() as nursery:
        runners = Runners(js_instances, count=1, threads=trio.CapacityLimiter(1))
        await nursery.start(runners.serve)
        with trio.fail_after(WAIT_S):
            (await runners.take()).hand(idle_and_blocked)
            await trio.to_thread.run_sync(lowered.wait)
            before = os.sched_getscheduler(thread_ids[0])
            taken: list[object] = []

            async def take() -> None:
                taken.append(await runners.take())

            nursery.start_soon(take)
            await trio.testing.wait_all_tasks_blocked()
            during = os.sched_getscheduler(thread_ids[0])
            go_on.set()
            while not taken:
                await trio.sleep(0.005)
        nursery.cancel_scope.cancel()
    idle = os.SCHED_IDLE if thread_priority.available() else os.SCHED_OTHER
    assert (before, during) == (idle, os.SCHED_OTHER)


async def test_runners_grow_to_the_limit_while_all_are_taken_then_shrink_back(
    js_instances: Instances,
) -> None:
    """Waiting programs each hold a runner: more are started, up to the limit, and
    those beyond the kept count retire once unused."""
    async with trio.open_nursery() as nursery:
        runners = Runners(
            js_instances, count=1, limit=3, threads=trio.CapacityLimiter(3), idle_retire_s=0.05
        )
        await nursery.start(runners.serve)
        with trio.fail_after(WAIT_S):
            taken = [await runners.take() for _ in range(3)]
        assert len(set(taken)) == 3 and runners.taken == 3
        # At the limit, a taker waits for one to come back.
        late: list[object] = []

        async def take_late() -> None:
            late.append(await runners.take())

        nursery.start_soon(take_late)
        await trio.testing.wait_all_tasks_blocked()
        assert late == [] and runners.alive == 3
        runners.give_back(taken[0])
        with trio.fail_after(WAIT_S):
            while not late:
                await trio.sleep(0.005)
        assert late == [taken[0]]
        works = [Recorder() for _ in taken]
        for runner, work in zip(taken, works, strict=True):
            runner.hand(work)
        for work in works:
            await wait_done(work)
        assert all(json.loads(w.answers[0]) == {"result": 42} for w in works)
        with trio.fail_after(WAIT_S):  # the two beyond the kept one retire, unused
            while runners.alive > 1:
                await trio.sleep(0.01)
        assert runners.taken == 0
        await wait_ready(runners, 1)
        nursery.cancel_scope.cancel()


async def test_replenish_starts_a_runner_in_place_of_one_held(js_instances: Instances) -> None:
    async with trio.open_nursery() as nursery:
        runners = Runners(js_instances, count=1, limit=2, threads=trio.CapacityLimiter(4))
        await nursery.start(runners.serve)
        await wait_ready(runners, 1)
        held = await runners.take()
        runners.replenish()
        await wait_ready(runners, 1)  # another, while the first is held
        runners.replenish()  # one is ready: nothing to do
        second = await runners.take()
        runners.replenish()  # at the limit
        await trio.testing.wait_all_tasks_blocked()
        assert (runners.alive, runners.taken, runners.ready) == (2, 2, 0)
        runners.give_back(held)
        runners.give_back(second)
        nursery.cancel_scope.cancel()
