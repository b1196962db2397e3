"""The session table and steps through `Executions`, over a fake executor: ownership,
caps, expiry, resets and turns. No daemon and no sandbox is started."""

from __future__ import annotations

import base64

import pytest
import trio
import trio.testing

from conduit.core.errors import InvalidParams, NotFound, Overloaded, RateLimited
from conduit.daemon.config import LimitsConfig, LimitValues, SessionsConfig
from conduit.daemon.dispatcher import Dispatcher
from conduit.daemon.events import EventBus
from conduit.daemon.executions import ExecutionRequest
from conduit.daemon.methods import method_table
from conduit.daemon.sessions import CloseReason, LiveSession
from conduit.executors.base import Job, Outcome, Status, ToolBridge
from tests.daemon.fakes import ALICE, BOB, ExecutionsFixture, FakeExecutor


def step(session: LiveSession, code: str = "x += 1", **limits: int) -> ExecutionRequest:
    return ExecutionRequest(language=session.language, code=code, limits=limits, session=session)


async def _counting(job: Job, bridge: ToolBridge) -> Outcome:
    """A step's result is how many steps its sandbox ran; `reset` asks for a reset."""
    if job.code == "sleep":
        await trio.sleep(20)
    outcome = Outcome(Status.OK, result=job.code, exit_code=0)
    outcome.session_reset = job.code == "reset"
    return outcome


def fixture(**config: float) -> ExecutionsFixture:
    return ExecutionsFixture(FakeExecutor(_counting), sessions=SessionsConfig(**config))


async def test_steps_run_in_the_sandbox_the_session_opened() -> None:
    fx = fixture()
    session, created = await fx.sessions.create("alice", "python", limits={"memory_mb": 64})
    assert created and session.session_id.startswith("ses_")
    [sandbox] = fx.executor.sandboxes
    assert (sandbox.spec.session_id, sandbox.spec.memory_mb) == (session.session_id, 64)
    first = await fx.executions.execute(step(session, "x = 1"), ALICE)
    second = await fx.executions.execute(step(session, "x += 1", timeout_ms=500), ALICE)
    assert [job.code for job in sandbox.jobs] == ["x = 1", "x += 1"]
    assert sandbox.jobs[1].limits.timeout_ms == 500
    assert sandbox.jobs[1].limits.memory_mb == 64
    assert not fx.executor.jobs  # nothing ran in a fresh sandbox
    assert (first.session_id, second.session_id) == (session.session_id,) * 2
    assert not second.session_reset and session.steps == 2
    started = [e for e in fx.events if e.type == "execution.started"]
    assert all(e.data["session_id"] == session.session_id for e in started)


async def test_a_session_is_nobody_elses_and_looks_like_no_session_to_them() -> None:
    fx = fixture()
    session, _ = await fx.sessions.create("alice", "python")
    with pytest.raises(NotFound) as theirs:
        fx.sessions.get("bob", session.session_id)
    with pytest.raises(NotFound) as unknown:
        fx.sessions.get("bob", "ses_0000000000000000")
    assert (theirs.value.message, theirs.value.code) == (unknown.value.message, -32001)
    with pytest.raises(NotFound):
        await fx.sessions.close("bob", session.session_id)
    assert fx.sessions.of("bob") == [] and fx.sessions.of("alice") == [session]
    assert not fx.executor.sandboxes[0].closed


async def test_past_a_cap_creating_is_refused_and_no_live_session_ends() -> None:
    fx = fixture(max_per_principal=2, max_total=3)
    mine = [(await fx.sessions.create("alice", "python"))[0] for _ in range(2)]
    for _ in range(1000):  # a principal asking again and again gets nowhere
        with pytest.raises(Overloaded, match="max_per_principal"):
            await fx.sessions.create("alice", "python")
    await fx.sessions.create("bob", "python")
    with pytest.raises(Overloaded, match="max_total"):
        await fx.sessions.create("bob", "python")
    assert len(fx.sessions) == 3 and len(fx.executor.sandboxes) == 3
    assert not any(sandbox.closed for sandbox in fx.executor.sandboxes)
    await fx.sessions.close("alice", mine[0].session_id)
    await fx.sessions.create("alice", "python")  # room again


async def test_an_idle_session_expires_but_never_while_a_step_runs(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    fx = fixture()
    await nursery.start(fx.sessions.serve)
    session, _ = await fx.sessions.create("alice", "python", idle_timeout_s=5)
    [sandbox] = fx.executor.sandboxes
    await trio.sleep(4)
    # A step of 20 s: far past the idle timeout, and the session is in use all along.
    result = await fx.executions.execute(step(session, "sleep", timeout_ms=60_000), ALICE)
    assert result.status == "ok" and not sandbox.closed
    await trio.sleep(4)
    assert not sandbox.closed
    await trio.sleep(2)
    assert sandbox.closed and len(fx.sessions) == 0
    ended = [e for e in fx.events if e.type == "session.ended"]
    assert [e.data["reason"] for e in ended] == [CloseReason.EXPIRED]
    # What the audit store keeps of its life.
    [record] = [e.session for e in ended]
    assert record is not None and record.session_id == session.session_id
    assert (record.end_reason, record.steps) == (CloseReason.EXPIRED, 1)
    assert record.ended_at is not None and record.ended_at >= record.created_at
    with pytest.raises(NotFound):
        fx.sessions.get("alice", session.session_id)


async def test_a_step_that_resets_the_sandbox_says_so_and_the_session_goes_on() -> None:
    fx = fixture()
    session, _ = await fx.sessions.create("alice", "python")
    result = await fx.executions.execute(step(session, "reset"), ALICE)
    assert result.session_reset and result.status == "ok"
    assert [e.type for e in fx.events if e.type.startswith("session.")] == [
        "session.created",
        "session.reset",
    ]
    after = await fx.executions.execute(step(session), ALICE)
    assert not after.session_reset and session.resets == 1 and session.steps == 2


async def test_steps_of_one_session_take_turns(nursery: trio.Nursery) -> None:
    fx = fixture()
    session, _ = await fx.sessions.create("alice", "python")
    results = []

    async def run(code: str) -> None:
        results.append(await fx.executions.execute(step(session, code), ALICE))

    async with trio.open_nursery() as steps:
        for code in ("a", "b", "c"):
            steps.start_soon(run, code)
    [sandbox] = fx.executor.sandboxes
    assert len(sandbox.jobs) == 3 and not sandbox.overlapped
    assert {r.status for r in results} == {"ok"}


async def test_a_step_cannot_change_the_sessions_memory() -> None:
    fx = fixture()
    session, _ = await fx.sessions.create("alice", "python", limits={"memory_mb": 64})
    with pytest.raises(InvalidParams, match="memory"):
        await fx.executions.execute(step(session, memory_mb=512), ALICE)
    assert fx.executor.sandboxes[0].jobs == []


async def test_a_named_session_is_answered_again_by_its_name() -> None:
    fx = fixture()
    first, created = await fx.sessions.create("alice", "python", name="notebook")
    again, created_again = await fx.sessions.create("alice", "python", name="notebook")
    assert created and not created_again and again is first
    theirs, _ = await fx.sessions.create("bob", "python", name="notebook")
    assert theirs is not first  # names are each principal's own
    with pytest.raises(InvalidParams, match="runs python"):
        await fx.sessions.create("alice", "javascript", name="notebook")


async def test_an_idle_timeout_past_the_maximum_is_refused() -> None:
    fx = fixture(max_idle_timeout_s=60)
    with pytest.raises(InvalidParams, match="max_idle_timeout_s"):
        await fx.sessions.create("alice", "python", idle_timeout_s=61)
    assert fx.executor.sandboxes == []


async def test_the_daemon_stopping_ends_every_session() -> None:
    fx = fixture()
    for principal in ("alice", "bob", "bob"):
        await fx.sessions.create(principal, "python")
    await fx.sessions.close_all()
    assert all(sandbox.closed for sandbox in fx.executor.sandboxes) and len(fx.sessions) == 0
    ended = [e.data["reason"] for e in fx.events if e.type == "session.ended"]
    assert ended == [CloseReason.DAEMON_STOPPED] * 3


async def test_a_step_in_a_session_closed_while_it_waited_is_not_found(
    nursery: trio.Nursery,
) -> None:
    fx = fixture()
    session, _ = await fx.sessions.create("alice", "python")
    gate = trio.Event()

    async def held(job: Job, bridge: ToolBridge) -> Outcome:
        await gate.wait()
        return Outcome(Status.OK, exit_code=0)

    fx.executor.sandboxes[0].script = held
    nursery.start_soon(fx.executions.execute, step(session), ALICE)
    await trio.testing.wait_all_tasks_blocked()
    waiting = trio.Event()
    refused: list[BaseException] = []

    async def second() -> None:
        waiting.set()
        try:
            await fx.executions.execute(step(session), ALICE)
        except NotFound as exc:
            refused.append(exc)

    nursery.start_soon(second)
    await waiting.wait()
    await trio.testing.wait_all_tasks_blocked()
    session.closed = True  # as `close` marks it, before the sandbox is gone
    gate.set()
    await trio.testing.wait_all_tasks_blocked()
    assert len(refused) == 1


async def test_a_listed_session_says_what_it_runs_and_how_it_is_used() -> None:
    fx = fixture()
    session, _ = await fx.sessions.create("alice", "python", name="nb")
    await fx.executions.execute(step(session, "1"), ALICE)
    wire = session.to_wire()
    assert (wire["language"], wire["name"], wire["steps"], wire["running"]) == (
        "python",
        "nb",
        1,
        False,
    )
    assert wire["idle_timeout_s"] == SessionsConfig().idle_timeout_s
    assert "sandbox" not in wire and "principal" not in wire


# ---- a session's files between steps ---------------------------------------------------


def dispatcher(fx: ExecutionsFixture) -> Dispatcher:
    """The real method table over the fixture's executions and sessions."""
    return Dispatcher(
        method_table(),
        executions=fx.executions,
        tools=None,  # type: ignore[arg-type]
        events=EventBus(),
        audit=None,  # type: ignore[arg-type]
        admission=fx.admission,
        control=None,  # type: ignore[arg-type]
        sessions=fx.sessions,
        count_request=lambda name, outcome: None,
    )


async def test_files_go_into_a_session_and_come_out_as_its_own() -> None:
    fx = fixture()
    rpc = dispatcher(fx).dispatch
    session, _ = await fx.sessions.create("alice", "python", limits={"disk_mb": 1})
    put = {"session_id": session.session_id, "files": [{"path": "d/a.csv", "text": "a\n1\n"}]}
    assert (await rpc("files/put", put, principal=ALICE))["put"] == [{"path": "d/a.csv", "size": 4}]
    listed = await rpc("files/list", {"session_id": session.session_id}, principal=ALICE)
    assert listed == {"files": [{"path": "d/a.csv", "size": 4}], "truncated": False}
    got = await rpc(
        "files/get", {"session_id": session.session_id, "path": "d/a.csv"}, principal=ALICE
    )
    assert (got["mime"], base64.b64decode(got["base64"])) == ("text/csv", b"a\n1\n")
    with pytest.raises(NotFound):
        await rpc("files/get", {"session_id": session.session_id, "path": "nope"}, principal=ALICE)
    # Someone else's session is no session; a bad path names itself; the disk is bounded.
    with pytest.raises(NotFound):
        await rpc("files/list", {"session_id": session.session_id}, principal=BOB)
    with pytest.raises(InvalidParams, match=r"\.\./x"):
        await rpc("files/get", {"session_id": session.session_id, "path": "../x"}, principal=ALICE)
    too_big = {"path": "big.bin", "base64": base64.b64encode(b"x" * (1 << 20)).decode()}
    with pytest.raises(InvalidParams, match="disk_mb"):
        await rpc(
            "files/put", {"session_id": session.session_id, "files": [too_big]}, principal=ALICE
        )
    assert list(fx.executor.sandboxes[0].files) == ["d/a.csv"]


async def test_creating_sessions_spends_the_principals_rate() -> None:
    charged: list[str] = []

    def charge(principal: str) -> None:
        charged.append(principal)
        if len(charged) > 2:
            raise RateLimited("rate limited", {"retry_after_s": 1})

    fx = fixture()
    fx.sessions._charge = charge
    await fx.sessions.create("alice", "python", name="a")
    await fx.sessions.create("alice", "python", name="a")  # answered again: no charge
    await fx.sessions.create("alice", "python")
    with pytest.raises(RateLimited):
        await fx.sessions.create("alice", "python")
    assert len(fx.executor.sandboxes) == 2


async def test_a_step_is_held_to_todays_maxima_after_a_reload() -> None:
    fx = fixture()
    session, _ = await fx.sessions.create("alice", "python", limits={"timeout_ms": 60_000})
    lowered = LimitsConfig(maxima=LimitValues(timeout_ms=5_000))
    fx.executions.reconfigure(lowered, fx.executions.policy)
    await fx.executions.execute(step(session), ALICE)
    assert fx.executor.sandboxes[0].jobs[-1].limits.timeout_ms == 5_000


async def test_moving_files_is_use(autojump_clock: trio.testing.MockClock) -> None:
    fx = fixture()
    session, _ = await fx.sessions.create("alice", "python", idle_timeout_s=10)
    await trio.sleep(8)
    async with session.turn(1.0):
        pass
    assert session.expires_at() == pytest.approx(trio.current_time() + 10)
