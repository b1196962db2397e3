"""A program its executor gives back (`Outcome.moved`) runs again, from the start, on
the executor's successor (wasm-js: deno), over fake executors: what the second run is
given, what the result and the record say, and when no move is planned at all. The real
runtimes on both sides are in tests/e2e/test_moves.py."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import trio
import trio.testing

from conduit.core.errors import SandboxCrashed
from conduit.core.results import ExecutionResult
from conduit.daemon.config import ExecutorPolicies, JavaScriptPolicy, LimitsConfig, PolicyConfig
from conduit.daemon.executions import ExecutionRequest
from conduit.executors import outcomes
from conduit.executors.base import ErrorInfo, Job, Outcome, Status, ToolBridge
from conduit.executors.syntax_memo import SyntaxMemo
from tests.daemon.fakes import ALICE, ExecutionsFixture, FakeExecutor, Script

JS = frozenset({"javascript", "typescript"})
AFTER_S = 0.05
SPENT_S = 0.3
REQUEST = ExecutionRequest(language="javascript", code="heavy()", inputs={"n": 1})
TIMEOUT_MS = LimitsConfig().defaults.timeout_ms


async def _gives_back(job: Job, bridge: ToolBridge) -> Outcome:
    await trio.sleep(SPENT_S)
    return Outcome(Status.CANCELLED, stdout="seen by nobody\n", moved=True)


async def _answers(job: Job, bridge: ToolBridge) -> Outcome:
    return Outcome(Status.OK, result=job.inputs, stdout="out\n", exit_code=0)


def _fixture(
    first: Script = _gives_back,
    then: Script = _answers,
    *,
    policy: PolicyConfig | None = None,
    successor_down: bool = False,
) -> tuple[ExecutionsFixture, FakeExecutor, FakeExecutor]:
    """wasm-js (moving its programs to deno after AFTER_S) and deno, for javascript."""
    wasm_js = FakeExecutor(first, name="wasm-js", languages=JS)
    wasm_js.moves_to = "deno"  # type: ignore[attr-defined]
    wasm_js.moves = lambda code, syntax: None if "fs" in code else AFTER_S  # type: ignore[attr-defined]
    deno = FakeExecutor(then, name="deno", languages=JS)
    deno.unavailable_reason = "down" if successor_down else None
    fx = ExecutionsFixture(
        FakeExecutor(), others=[wasm_js, deno], defaults={"javascript": "wasm-js"}, policy=policy
    )
    return fx, wasm_js, deno


def _moves_of(jobs: Sequence[Job]) -> list[float | None]:
    return [job.move_after_cpu_s for job in jobs]


async def test_a_program_given_back_runs_again_on_the_successor_with_the_time_left(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fx, wasm_js, deno = _fixture()
    result = await fx.executions.execute(REQUEST, ALICE)
    assert (result.status, result.executor, result.result) == ("ok", "deno", {"n": 1})
    assert result.stdout == "out\n"  # nothing of the first run
    [first], [again] = wasm_js.jobs, deno.jobs
    assert (first.move_after_cpu_s, again.move_after_cpu_s) == (AFTER_S, None)
    assert again.execution_id == first.execution_id and again.stop is first.stop
    assert again.limits.timeout_ms == TIMEOUT_MS - SPENT_S * 1000
    assert again.limits.memory_mb == first.limits.memory_mb
    # One execution, one bridge, one record: the one that answered is named in it, and
    # the move is told as it happens (its running row names deno from then on).
    assert len(fx.bridges) == 1
    assert fx.types() == ["execution.started", "execution.moved", "execution.finished"]
    started, moved = fx.events[0], fx.events[1]
    assert moved.data == {**started.data, "executor": "deno", "from": "wasm-js"}
    assert moved.started is not None and moved.started.executor == "deno"
    assert moved.started.status == "running"
    record = fx.events[-1].record
    assert record is not None and record.executor == "deno"
    assert result.duration_ms >= SPENT_S * 1000  # the first run's time is the program's


async def test_a_moved_program_that_times_out_is_told_its_own_limit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def spins(job: Job, bridge: ToolBridge) -> Outcome:
        await trio.sleep(job.limits.timeout_ms / 1000)
        return outcomes.timed_out(Outcome(Status.OK), job.limits)

    fx, _, deno = _fixture(then=spins)
    result = await fx.executions.execute(REQUEST, ALICE)
    assert (result.status, result.executor) == ("timeout", "deno")
    assert result.error is not None and f"within {TIMEOUT_MS} ms" in result.error.message
    assert deno.jobs[0].limits.timeout_ms < TIMEOUT_MS


async def test_where_the_policy_refuses_the_successor_the_program_stays(
    autojump_clock: trio.testing.MockClock,
) -> None:
    only_deno = JavaScriptPolicy(forbidden_globals=("heavy",))
    policy = PolicyConfig(executors=ExecutorPolicies(deno=only_deno))
    runs: list[Job] = []

    async def once_then_answer(job: Job, bridge: ToolBridge) -> Outcome:
        runs.append(job)
        return await (_gives_back if len(runs) == 1 else _answers)(job, bridge)

    fx, wasm_js, deno = _fixture(once_then_answer, policy=policy)
    result = await fx.executions.execute(REQUEST, ALICE)
    assert (result.status, result.executor) == ("ok", "wasm-js")
    assert deno.jobs == []
    assert _moves_of(wasm_js.jobs) == [AFTER_S, None]  # never given back twice


async def test_no_move_is_planned_where_none_could_be_made() -> None:
    fx, wasm_js, _ = _fixture(_answers)
    await fx.executions.execute(ExecutionRequest(language="javascript", code="fs.x()"), ALICE)
    named = ExecutionRequest(language="javascript", code="heavy()", executor="wasm-js")
    await fx.executions.execute(named, ALICE)
    assert _moves_of(wasm_js.jobs) == [None, None]  # `fs` is wasm-js's; a named executor
    down, wasm_js, _ = _fixture(_answers, successor_down=True)
    await down.executions.execute(REQUEST, ALICE)
    assert _moves_of(wasm_js.jobs) == [None]


async def test_a_session_step_is_never_moved() -> None:
    fx, wasm_js, _ = _fixture(_answers)
    session, _ = await fx.sessions.create("alice", "javascript")
    step = ExecutionRequest(language="javascript", code="heavy()", session=session)
    result = await fx.executions.execute(step, ALICE)
    assert result.executor == "wasm-js"
    assert _moves_of(wasm_js.sandboxes[0].jobs) == [None]


async def test_a_program_cancelled_on_its_successor_ends_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    started = trio.Event()

    async def waits(job: Job, bridge: ToolBridge) -> Outcome:
        stopped = trio.Event()
        started.set()
        with job.stop.calling(stopped.set):
            await stopped.wait()
        return Outcome(Status.CANCELLED, stdout="partial\n")

    fx, _, _ = _fixture(then=waits)
    async with trio.open_nursery() as nursery:
        results: list[object] = []

        async def execute() -> None:
            results.append(await fx.executions.execute(REQUEST, ALICE))

        nursery.start_soon(execute)
        await started.wait()
        [running] = fx.executions.running()
        assert running["executor"] == "deno"
        fx.executions.cancel(ALICE, execution_id=running["execution_id"])
    [result] = results
    assert (result.status, result.executor) == ("cancelled", "deno")  # type: ignore[attr-defined]


async def test_a_recursion_that_overflows_the_successor_unseen_runs_where_it_began(
    autojump_clock: trio.testing.MockClock,
) -> None:
    overflowed = ErrorInfo("RangeError", "Maximum call stack size exceeded")
    runs: list[Job] = []

    async def answers_second(job: Job, bridge: ToolBridge) -> Outcome:
        runs.append(job)
        return await (_gives_back if len(runs) == 1 else _answers)(job, bridge)

    async def overflows(job: Job, bridge: ToolBridge) -> Outcome:
        await trio.sleep(SPENT_S)
        return Outcome(Status.ERROR, error=overflowed, exit_code=1)

    fx, wasm_js, deno = _fixture(answers_second, then=overflows)
    result = await fx.executions.execute(REQUEST, ALICE)
    assert (result.status, result.executor, result.result) == ("ok", "wasm-js", {"n": 1})
    assert _moves_of(wasm_js.jobs) == [AFTER_S, None]  # never given back twice
    assert wasm_js.jobs[1].limits.timeout_ms == TIMEOUT_MS - 2 * SPENT_S * 1000
    record = fx.events[-1].record
    assert record is not None and record.executor == "wasm-js"

    async def overflows_seen(job: Job, bridge: ToolBridge) -> Outcome:
        return Outcome(Status.ERROR, error=overflowed, exit_code=1, calls_written=1)

    runs.clear()
    fx, wasm_js, _ = _fixture(answers_second, then=overflows_seen)
    result = await fx.executions.execute(REQUEST, ALICE)
    assert (result.status, result.executor) == ("error", "deno")  # a call was sent there
    assert len(wasm_js.jobs) == 1


async def test_a_successor_that_fails_is_named_in_the_record(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def breaks(job: Job, bridge: ToolBridge) -> Outcome:
        raise SandboxCrashed("a Deno worker failed to start")

    fx, _, _ = _fixture(then=breaks)
    with pytest.raises(SandboxCrashed):
        await fx.executions.execute(REQUEST, ALICE)
    record = fx.events[-1].record
    assert record is not None and (record.status, record.executor) == ("crashed", "deno")


async def test_a_program_stopped_as_it_is_given_back_never_starts_again() -> None:
    async def stopped_meanwhile(job: Job, bridge: ToolBridge) -> Outcome:
        job.stop.set()  # as a cancel arriving between the two runs does
        return Outcome(Status.CANCELLED, moved=True)

    fx, _, deno = _fixture(stopped_meanwhile)
    result = await fx.executions.execute(REQUEST, ALICE)
    assert (result.status, deno.jobs) == ("cancelled", [])


def _once_then_answers() -> Script:
    """A script that gives the program back the first time, and answers after."""
    runs: list[Job] = []

    async def script(job: Job, bridge: ToolBridge) -> Outcome:
        runs.append(job)
        return await (_gives_back if len(runs) == 1 else _answers)(job, bridge)

    return script


def _starting(deno: FakeExecutor, settles: trio.Event, *, fails: bool = False) -> None:
    """Make `deno` one still starting until `settles` is set (then failed, or ready)."""

    async def wait_ready() -> bool:
        await settles.wait()
        deno.unavailable_reason = "deno is broken" if fails else None
        deno.preparing = False  # type: ignore[attr-defined]
        return not fails

    deno.unavailable_reason = "the executor has not been started"
    deno.preparing = True  # type: ignore[attr-defined]
    deno.wait_ready = wait_ready  # type: ignore[attr-defined]


async def _acting_meanwhile(
    fx: ExecutionsFixture, after_s: float, act: Callable[[], None]
) -> ExecutionResult:
    """The result of executing REQUEST, having called `act()` `after_s` into it."""
    results = []
    async with trio.open_nursery() as nursery:

        async def execute() -> None:
            results.append(await fx.executions.execute(REQUEST, ALICE))

        nursery.start_soon(execute)
        await trio.sleep(after_s)
        act()
    [result] = results
    return result


@pytest.mark.parametrize("fails", [False, True], ids=["ready", "failed"])
async def test_a_successor_still_starting_is_waited_for_as_queueing(
    autojump_clock: trio.testing.MockClock, fails: bool
) -> None:
    """The first requests after a start: a program moves to a deno still probing its
    runtime once it is ready, the wait counted as queueing, not the program's time; to
    one that fails, never: it runs again where it began."""
    fx, wasm_js, deno = _fixture(_once_then_answers())
    settles = trio.Event()
    _starting(deno, settles, fails=fails)
    result = await _acting_meanwhile(fx, SPENT_S + 2.0, settles.set)
    assert (result.status, result.result) == ("ok", {"n": 1})
    assert result.queue_ms == pytest.approx(2000)
    if fails:
        assert (result.executor, deno.jobs) == ("wasm-js", [])
        assert _moves_of(wasm_js.jobs) == [AFTER_S, None]  # never given back twice
    else:
        assert (result.executor, len(deno.jobs)) == ("deno", 1)
        assert deno.jobs[0].limits.timeout_ms == TIMEOUT_MS - SPENT_S * 1000


async def test_a_successor_not_started_within_the_queueing_time_is_not_waited_for(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fx, _, deno = _fixture(_once_then_answers())
    _starting(deno, trio.Event())  # never settles
    result = await fx.executions.execute(REQUEST, ALICE)
    assert (result.status, result.executor, deno.jobs) == ("ok", "wasm-js", [])
    within_s = min(TIMEOUT_MS / 1000 - SPENT_S, LimitsConfig().queue_timeout_s)
    assert result.queue_ms == pytest.approx(within_s * 1000)


async def test_a_program_waiting_for_its_successor_is_stopped_at_once(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel while the moved program waits for a deno still starting ends it then,
    not after the stop's grace; the wait is queueing, and the parse is not held
    through it."""
    forgotten: list[SyntaxMemo] = []
    monkeypatch.setattr(SyntaxMemo, "forget", lambda memo: forgotten.append(memo))  # noqa: PLW0108
    fx, _, deno = _fixture(_once_then_answers())
    _starting(deno, trio.Event())  # never settles
    cancelled_at: list[float] = []

    def cancel() -> None:
        assert len(forgotten) == 1  # as it began to wait
        [running] = fx.executions.running()
        cancelled_at.append(trio.current_time())
        fx.executions.cancel(ALICE, execution_id=running["execution_id"])

    result = await _acting_meanwhile(fx, SPENT_S + 1.0, cancel)
    assert (result.status, result.executor, deno.jobs) == ("cancelled", "wasm-js", [])
    assert trio.current_time() - cancelled_at[0] < 0.1
    assert result.queue_ms == pytest.approx(1000)
    assert result.duration_ms == pytest.approx(SPENT_S * 1000)
