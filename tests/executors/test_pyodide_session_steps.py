"""`PyodideSession` and `SessionRegistry` on their own, with stand-in hosts: when a
session keeps its process and when it drops it, closing at any moment, and the cap.
Real Pyodide sessions are tried in tests/executors/test_pyodide_sessions.py."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from conduit.core.errors import Overloaded, SandboxCrashed
from conduit.executors.base import Job, Outcome, SessionSpec, Status, ToolBridge
from conduit.executors.pyodide_host import Kept
from conduit.executors.pyodide_sessions import PyodideSession, SessionRegistry
from tests.sandboxes import NoBridge

WAITED_S = 0.25


class FakeHost:
    """Stands in for a `PyodideHost`: alive until killed; rests as told."""

    def __init__(self) -> None:
        self.killed = False
        self.restful = True

    @property
    def alive(self) -> bool:
        return not self.killed

    def kill(self) -> None:
        self.killed = True

    def data_bytes(self) -> int:
        return 1000

    def rest(self) -> bool:
        return self.restful and self.alive


class Runner:
    """A `StepRunner` whose steps end as `ends` says, in turn: a status and whether
    the host may go on; `hold` makes a step wait until it is set."""

    def __init__(self) -> None:
        self.hosts: list[FakeHost] = []
        self.ends: list[tuple[Status, bool]] = []
        self.kept: list[Kept | None] = []
        self.hold: trio.Event | None = None

    async def host_for(self, job: Job, *, keep: bool) -> tuple[Any, float]:
        assert keep
        self.hosts.append(FakeHost())
        return self.hosts[-1], WAITED_S

    async def run_on(
        self, host: Any, job: Job, bridge: ToolBridge, kept: Kept | None
    ) -> tuple[Outcome, bool]:
        self.kept.append(kept)
        if self.hold is not None:
            await self.hold.wait()
        status, going_on = self.ends.pop(0) if self.ends else (Status.OK, True)
        return Outcome(status), going_on and host.alive


@pytest.fixture
def runner() -> Runner:
    return Runner()


def open_one(runner: Runner, registry: SessionRegistry | None = None) -> PyodideSession:
    registry = registry or SessionRegistry(4)
    return registry.open(SessionSpec("se_test", "python", 64), runner)


async def step(session: PyodideSession) -> Outcome:
    return await session.run(Job("ex_step", "python", "pass"), NoBridge())


async def test_a_session_keeps_its_host_until_a_step_cannot_go_on(runner: Runner) -> None:
    session = open_one(runner)
    assert not session.holds_process  # none until its first step
    first = await step(session)
    assert (first.session_reset, first.queue_s) == (False, WAITED_S)
    second = await step(session)
    assert (second.session_reset, second.queue_s) == (False, 0.0)
    assert len(runner.hosts) == 1 and runner.kept == [Kept(1000)] * 2
    runner.ends.append((Status.TIMEOUT, False))
    assert (await step(session)).session_reset
    assert runner.hosts[0].killed and not session.holds_process
    assert not (await step(session)).session_reset
    assert len(runner.hosts) == 2


@pytest.mark.parametrize("why", ["memory", "restless"])
async def test_a_host_that_answered_is_dropped_after_memory_or_a_failed_rest(
    runner: Runner, why: str
) -> None:
    session = open_one(runner)
    await step(session)
    if why == "memory":
        runner.ends.append((Status.MEMORY_LIMIT, True))
    else:
        runner.hosts[0].restful = False
    assert (await step(session)).session_reset
    assert runner.hosts[0].killed


async def test_a_host_lost_between_steps_is_a_crash_that_resets(runner: Runner) -> None:
    session = open_one(runner)
    await step(session)
    runner.hosts[0].kill()
    lost = await step(session)
    assert (lost.status, lost.session_reset) == (Status.CRASHED, True)
    assert len(runner.kept) == 1  # the step did not run
    assert not (await step(session)).session_reset and len(runner.hosts) == 2


async def test_a_cancelled_step_kills_the_host(runner: Runner, autojump_clock: Any) -> None:
    session = open_one(runner)
    runner.hold = trio.Event()
    with trio.move_on_after(1):
        await step(session)
    assert runner.hosts[0].killed and not session.holds_process


async def test_closing_during_a_step_kills_the_host_and_refuses_later_steps(
    runner: Runner, nursery: trio.Nursery
) -> None:
    registry = SessionRegistry(4)
    session = open_one(runner, registry)
    runner.hold = trio.Event()
    ended: list[Outcome] = []

    async def one_step() -> None:
        ended.append(await step(session))

    nursery.start_soon(one_step)
    await trio.testing.wait_all_tasks_blocked()
    assert registry.statistics() == {"open": 1, "processes": 1, "max": 4}
    await session.aclose()
    await session.aclose()
    assert runner.hosts[0].killed
    assert registry.statistics() == {"open": 0, "processes": 0, "max": 4}
    runner.hold.set()
    await trio.testing.wait_all_tasks_blocked()
    assert ended[0].session_reset  # the killed host could not go on
    with pytest.raises(SandboxCrashed):
        await step(session)


async def test_the_registry_holds_at_most_its_limit(runner: Runner) -> None:
    registry = SessionRegistry(1)
    first = open_one(runner, registry)
    with pytest.raises(Overloaded):
        open_one(runner, registry)
    await first.aclose()
    open_one(runner, registry)
