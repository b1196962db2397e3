"""`Executions` on its own, over a fake executor: the result's shape, queueing, cancel,
timeouts and how every execution ends. No daemon and no sandbox is started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from conduit.core.errors import (
    Forbidden,
    InvalidParams,
    NotFound,
    Overloaded,
    ToolLimitReached,
)
from conduit.core.files import FileData
from conduit.core.results import ExecutionResult
from conduit.daemon.auth import Principal
from conduit.daemon.config import JavaScriptPolicy, LimitsConfig, PolicyConfig, PythonPolicy
from conduit.daemon.executions import ExecutionRequest
from conduit.daemon.policy import Policy
from conduit.executors.base import ErrorInfo, Job, Outcome, Status, ToolBridge
from conduit.executors.deno import DenoExecutor
from conduit.executors.wasm_js import WasmJsExecutor
from tests.daemon.fakes import ALICE, BOB, OWNER, WAIT_S, ExecutionsFixture, FakeExecutor
from tests.parses import count_parses

REQUEST = ExecutionRequest(language="python", code="print(1)", inputs={"n": 1})
WIRE_KEYS = {
    "execution_id",
    "status",
    "result",
    "stdout",
    "stderr",
    "exit_code",
    "error",
    "truncated",
    "tool_calls",
    "duration_ms",
    "queue_ms",
    "executor",
    "memory_peak_bytes",
    "session_id",
    "session_reset",
    "files",
}


class Gate:
    """A script that holds each program until `release`, or until it is stopped."""

    def __init__(self) -> None:
        self.started = 0
        self._release = trio.Event()
        self._running = trio.Event()

    def release(self) -> None:
        self._release.set()

    async def wait_running(self) -> None:
        with trio.fail_after(WAIT_S):
            await self._running.wait()

    async def __call__(self, job: Job, bridge: ToolBridge) -> Outcome:
        self.started += 1
        self._running.set()
        stopped = trio.Event()
        with job.stop.calling(stopped.set):
            async with trio.open_nursery() as nursery:  # until released or stopped
                nursery.start_soon(_cancel_when, self._release, nursery.cancel_scope)
                nursery.start_soon(_cancel_when, stopped, nursery.cancel_scope)
        if stopped.is_set():
            return Outcome(Status.CANCELLED, stdout="partial\n")
        return Outcome(Status.OK, result="released", stdout="done\n")


async def _cancel_when(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def test_a_result_has_the_documented_shape_and_its_events(nursery: trio.Nursery) -> None:
    fx = ExecutionsFixture(FakeExecutor())
    result = await fx.executions.execute(REQUEST, ALICE)
    assert isinstance(result, ExecutionResult)
    wire = result.to_wire()
    assert set(wire) == WIRE_KEYS
    assert wire["execution_id"].startswith("ex_")
    assert (wire["status"], wire["result"], wire["stdout"]) == ("ok", {"n": 1}, "out\n")
    assert (wire["executor"], wire["tool_calls"], wire["error"]) == ("fake", 0, None)
    assert wire["truncated"] == {"stdout": False, "stderr": False}
    assert fx.types() == ["execution.started", "execution.finished"]
    record = fx.events[-1].record
    assert record is not None and record.execution_id == wire["execution_id"]
    assert (record.principal, record.allowed_tools) == ("alice", ("*",))
    [job] = fx.executor.jobs
    assert job.limits.timeout_ms == LimitsConfig().defaults.timeout_ms
    [bridge] = fx.bridges
    assert bridge.execution_id == job.execution_id and not bridge.open


async def test_requests_are_checked_before_anything_runs() -> None:
    fx = ExecutionsFixture(FakeExecutor())
    too_long = ExecutionRequest(language="python", code="x", limits={"timeout_ms": 10**9})
    with pytest.raises(InvalidParams) as caught:
        await fx.executions.execute(too_long, ALICE)
    assert caught.value.data["field"] == "limits.timeout_ms"
    with pytest.raises(InvalidParams, match="code is empty"):
        await fx.executions.execute(ExecutionRequest(language="python", code="  "), ALICE)
    bad = ExecutionRequest(language="python", code="x", allowed_tools=("no such!",))
    with pytest.raises(InvalidParams, match="allowed_tools"):
        await fx.executions.execute(bad, ALICE)
    session = Principal("session:ex_1", "session", frozenset({"tools"}), execution_id="ex_1")
    with pytest.raises(Forbidden, match="sandbox cannot start executions"):
        await fx.executions.execute(REQUEST, session)
    assert fx.executor.jobs == [] and fx.events == []


async def test_a_fenced_program_runs_as_its_code() -> None:
    fx = ExecutionsFixture(FakeExecutor())
    await fx.executions.execute(
        ExecutionRequest(language="python", code="```python\nprint(2)\n```"), ALICE
    )
    assert fx.executor.jobs[0].code.strip() == "print(2)"


async def test_the_policy_refuses_a_program_before_it_runs() -> None:
    fx = ExecutionsFixture(FakeExecutor())
    strict = Policy(PolicyConfig(python=PythonPolicy(forbidden_modules=("os",))))
    fx.executions.reconfigure(LimitsConfig(), strict)
    result = await fx.executions.execute(
        ExecutionRequest(language="python", code="import os"), ALICE
    )
    assert result.status == "refused"
    assert result.error is not None and result.error.type == "PolicyViolation"
    assert fx.executor.jobs == []
    assert fx.types() == ["policy.violation", "execution.failed"]


# ---- queueing ------------------------------------------------------------------------


async def test_past_its_slots_an_execution_queues_then_the_queue_refuses(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    gate = Gate()
    fx = ExecutionsFixture(FakeExecutor(gate), capacity=1, queue_size=1)
    results: list[ExecutionResult] = []

    async def run() -> None:
        results.append(await fx.executions.execute(REQUEST, ALICE))

    nursery.start_soon(run)
    await gate.wait_running()
    nursery.start_soon(run)
    await trio.testing.wait_all_tasks_blocked()
    assert fx.admission.statistics().waiting == 1
    with pytest.raises(Overloaded, match="1 executions running and 1 queued"):
        await fx.executions.execute(REQUEST, ALICE)
    await trio.sleep(5)
    gate.release()
    with trio.fail_after(WAIT_S):
        while len(results) < 2:
            await trio.sleep(1)
    assert [r.status for r in results] == ["ok", "ok"]
    assert results[1].queue_ms >= 5000  # it waited for the first, in virtual time
    assert gate.started == 2


async def test_a_queued_execution_gives_up_after_the_queue_timeout(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    gate = Gate()
    fx = ExecutionsFixture(FakeExecutor(gate), capacity=1, queue_timeout_s=2)
    nursery.start_soon(fx.executions.execute, REQUEST, ALICE)
    await gate.wait_running()
    with pytest.raises(Overloaded, match="waited 2 s for an execution slot"):
        await fx.executions.execute(REQUEST, ALICE)
    assert gate.started == 1
    gate.release()


async def test_a_draining_daemon_starts_nothing() -> None:
    fx = ExecutionsFixture(FakeExecutor())
    fx.executions.draining = True
    with pytest.raises(Overloaded, match="shutting down"):
        await fx.executions.execute(REQUEST, ALICE)
    assert fx.executor.jobs == []


# ---- cancel and timeout ----------------------------------------------------------------


async def _started(fx: ExecutionsFixture, gate: Gate, nursery: trio.Nursery, **request: Any) -> Any:
    """Start an execution in `nursery`; returns a getter of its result once ended."""
    done: list[ExecutionResult] = []
    principal = request.pop("principal", ALICE)
    execution = ExecutionRequest(language="python", code="x", **request)

    async def run() -> None:
        done.append(await fx.executions.execute(execution, principal))

    nursery.start_soon(run)
    await gate.wait_running()

    async def result() -> ExecutionResult:
        with trio.fail_after(WAIT_S):
            while not done:
                await trio.sleep(0.01)
        return done[0]

    return result


async def test_a_cancelled_execution_keeps_its_partial_output(nursery: trio.Nursery) -> None:
    gate = Gate()
    fx = ExecutionsFixture(FakeExecutor(gate))
    result = await _started(fx, gate, nursery)
    [running] = fx.executions.running()
    assert running["principal"] == "alice"
    with pytest.raises(NotFound):
        fx.executions.cancel(BOB, execution_id=running["execution_id"])  # not his
    assert fx.executions.cancel(ALICE, execution_id=running["execution_id"])
    ended = await result()
    assert (ended.status, ended.stdout) == ("cancelled", "partial\n")
    assert ended.error is not None and ended.error.type == "Cancelled"
    assert fx.executions.running() == []


async def test_an_execution_is_cancelled_by_the_request_that_started_it(
    nursery: trio.Nursery,
) -> None:
    gate = Gate()
    fx = ExecutionsFixture(FakeExecutor(gate))
    result = await _started(fx, gate, nursery, origin=(7, "req-1"), principal=BOB)
    with pytest.raises(NotFound):
        fx.executions.cancel(BOB, origin=(8, "req-1"))  # another connection's request
    fx.executions.cancel(OWNER, origin=(7, "req-1"))  # the master may cancel any
    assert (await result()).status == "cancelled"


async def test_an_executor_that_ignores_a_stop_is_cancelled_after_a_grace(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    running = trio.Event()

    async def stubborn(job: Job, bridge: ToolBridge) -> Outcome:
        running.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    fx = ExecutionsFixture(FakeExecutor(stubborn))
    done: list[ExecutionResult] = []

    async def run() -> None:
        done.append(await fx.executions.execute(REQUEST, ALICE))

    nursery.start_soon(run)
    await running.wait()
    fx.executions.cancel_all()
    with trio.fail_after(60):  # virtual seconds
        await fx.executions.wait_idle()
    await trio.testing.wait_all_tasks_blocked()
    assert [r.status for r in done] == ["cancelled"]
    assert fx.types()[-1] == "execution.failed"


async def test_a_timeout_is_a_result_with_its_output_and_event() -> None:
    async def slow(job: Job, bridge: ToolBridge) -> Outcome:
        error = ErrorInfo("Timeout", f"the program ran past {job.limits.timeout_ms} ms")
        return Outcome(Status.TIMEOUT, stdout="so far\n", error=error)

    fx = ExecutionsFixture(FakeExecutor(slow))
    request = ExecutionRequest(language="python", code="x", limits={"timeout_ms": 250})
    result = await fx.executions.execute(request, ALICE)
    assert (result.status, result.stdout) == ("timeout", "so far\n")
    assert result.error is not None and "250 ms" in result.error.message
    ended = fx.events[-1]
    assert (str(ended.type), ended.data["limit"]) == ("execution.timed_out", "timeout")


async def test_a_caller_that_goes_away_still_ends_its_execution(
    nursery: trio.Nursery,
) -> None:
    gate = Gate()
    fx = ExecutionsFixture(FakeExecutor(gate))
    with trio.CancelScope() as caller:
        nursery.start_soon(gate.wait_running)
        async with trio.open_nursery() as inner:
            inner.start_soon(fx.executions.execute, REQUEST, ALICE)
            await gate.wait_running()
            caller.cancel()
    assert fx.types() == ["execution.started", "execution.failed"]
    assert fx.events[-1].data["status"] == "cancelled"
    assert len(fx.executions) == 0
    with trio.fail_after(WAIT_S):
        await fx.executions.wait_idle()


async def test_an_executor_failure_is_recorded_as_crashed_and_raised() -> None:
    async def broken(job: Job, bridge: ToolBridge) -> Outcome:
        raise RuntimeError("the runtime fell over")

    fx = ExecutionsFixture(FakeExecutor(broken))
    with pytest.raises(RuntimeError, match="fell over"):
        await fx.executions.execute(REQUEST, ALICE)
    assert fx.events[-1].data["status"] == "crashed"


async def test_tool_calls_past_the_limit_stop_the_program() -> None:
    refused: list[Exception] = []

    async def greedy(job: Job, bridge: ToolBridge) -> Outcome:
        for _ in range(job.limits.tool_calls + 1):
            try:
                fx.executions.count_tool_call(job.execution_id)
            except ToolLimitReached as exc:
                refused.append(exc)
        assert job.stop.is_set()
        return Outcome(Status.ERROR, stderr="ToolLimit\n")

    fx = ExecutionsFixture(FakeExecutor(greedy))
    request = ExecutionRequest(language="python", code="x", limits={"tool_calls": 2})
    result = await fx.executions.execute(request, ALICE)
    assert (result.status, result.tool_calls) == ("tool_limit", 2)
    assert len(refused) == 1


async def test_the_calls_a_sandbox_wrote_before_answering_are_read_before_it_ends() -> None:
    """A worker answers having written three calls the daemon has not read yet: the
    execution stays open until they arrive (counted, within its limit, beyond it only
    refused: its answer stands)."""
    seen: list[tuple[int, bool]] = []

    async def arrive_late(execution_id: str) -> None:
        for _ in range(3):
            await trio.sleep(0.05)
            fx.executions.call_arrived(execution_id)
            try:
                fx.executions.count_tool_call(execution_id)
                seen.append((1, fx.executions.owner(execution_id) is not None))
            except ToolLimitReached:
                seen.append((0, fx.executions.owner(execution_id) is not None))

    async def answers_first(job: Job, bridge: ToolBridge) -> Outcome:
        nursery.start_soon(arrive_late, job.execution_id)
        return Outcome(Status.OK, result="sent", exit_code=0, calls_written=3)

    fx = ExecutionsFixture(FakeExecutor(answers_first))
    request = ExecutionRequest(language="python", code="x", limits={"tool_calls": 2})
    async with trio.open_nursery() as nursery:
        result = await fx.executions.execute(request, ALICE)
    assert (result.status, result.result, result.tool_calls) == ("ok", "sent", 2)
    assert seen == [(1, True), (1, True), (0, True)]  # each while it was still running


# ---- files in and out ------------------------------------------------------------------

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 8


async def _writes_out(job: Job, bridge: ToolBridge) -> Outcome:
    """Gives back what it was given, under its own names, and a chart."""
    outcome = Outcome(Status.OK, result="done", exit_code=0)
    outcome.files = [FileData("copy/" + f.path, f.data) for f in job.files]
    outcome.files.append(FileData("chart.png", PNG))
    return outcome


async def test_files_go_in_and_what_the_program_wrote_comes_back() -> None:
    fx = ExecutionsFixture(FakeExecutor(_writes_out))
    files = (FileData("data/in.csv", b"a,b\n1,2\n"),)
    result = await fx.executions.execute(
        ExecutionRequest(language="python", code="1", files=files), ALICE
    )
    [job] = fx.executor.jobs
    assert job.files == files
    wire = result.to_wire()
    assert [f["path"] for f in wire["files"]] == ["chart.png", "copy/data/in.csv"]
    chart, copy = result.files
    assert (chart.mime, chart.data, chart.truncated) == ("image/png", PNG, False)
    assert (copy.mime, copy.data) == ("text/csv", b"a,b\n1,2\n")
    record = fx.events[-1].record
    assert record is not None
    assert [(f.path, f.size) for f in record.files_in] == [("data/in.csv", 8)]
    assert [(f.path, f.size) for f in record.files_out] == [
        ("chart.png", len(PNG)),
        ("copy/data/in.csv", 8),
    ]


async def test_returned_files_share_the_results_bytes_and_the_rest_are_listed() -> None:
    fx = ExecutionsFixture(FakeExecutor(_writes_out))
    big = (FileData("big.bin", b"x" * 3000),)
    request = ExecutionRequest(
        language="python", code="1", files=big, limits={"result_bytes": 2000}
    )
    result = await fx.executions.execute(request, ALICE)
    by_path = {f.path: f for f in result.files}
    assert by_path["copy/big.bin"].truncated and by_path["copy/big.bin"].size == 3000
    assert not by_path["chart.png"].truncated


async def test_input_files_past_the_disk_limit_are_refused_before_anything_runs() -> None:
    fx = ExecutionsFixture(FakeExecutor(_writes_out))
    files = (FileData("a.bin", b"x" * (1024 * 1024 + 1)),)
    request = ExecutionRequest(language="python", code="1", files=files, limits={"disk_mb": 1})
    with pytest.raises(InvalidParams, match="disk_mb"):
        await fx.executions.execute(request, ALICE)
    assert fx.executor.jobs == []


# ---- one parse a request ---------------------------------------------------------------

# Every reader reads it: wasm-js's check for `Intl` (the registry), the policy's for
# nesting and globals, and the executor's preparation of its module.
INTL = "const format = new Intl.NumberFormat('en');\nformat.format(1234)"
READING_POLICY = PolicyConfig(
    max_nesting_depth=64, javascript=JavaScriptPolicy(forbidden_globals=("Deno",))
)
# Over every reader's limit for reading on the event loop.
FILLER = "".join(f"const v{i} = [{i}, {{ k: `${{{i}}}` }}];\n" for i in range(300))


def _javascript_fixture(tmp_path: Path, **options: Any) -> ExecutionsFixture:
    """wasm-js (the default for JavaScript, lacking `Intl`) and Deno, whose stand-in
    prepares its program as the Deno executor does and answers with the module."""
    deno = DenoExecutor(cache_dir=tmp_path / "deno")

    async def prepare(job: Job, bridge: ToolBridge) -> Outcome:
        fields = await trio.to_thread.run_sync(deno.program_fields, job)
        return Outcome(Status.OK, result=fields["module"])

    stand_ins = [
        FakeExecutor(
            name="wasm-js", languages=frozenset({"javascript"}), lacks=WasmJsExecutor.lacks
        ),
        FakeExecutor(prepare, name="deno", languages=frozenset({"javascript", "typescript"})),
    ]
    return ExecutionsFixture(
        FakeExecutor(),
        policy=READING_POLICY,
        others=stand_ins,
        defaults={"javascript": "wasm-js", "typescript": "deno"},
        **options,
    )


@pytest.mark.parametrize(
    ("language", "code"),
    [
        ("javascript", INTL),
        ("javascript", FILLER + INTL),
        ("typescript", "const n: number = 2;\nn * 21"),
        ("typescript", FILLER + "const n: number = 2;\nn * 21"),
    ],
)
async def test_a_request_parses_its_program_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, language: str, code: str
) -> None:
    fx = _javascript_fixture(tmp_path)
    parses = count_parses(monkeypatch)
    request = ExecutionRequest(language=language, code=code)
    result = await fx.executions.execute(request, ALICE)
    assert (result.status, result.executor) == ("ok", "deno"), result.error
    assert result.result.startswith("export default async function () {")
    assert [(parse.code, parse.dialect) for parse in parses.made] == [(code, language)]
    if len(code) > len(FILLER):
        assert not parses.made[0].on_event_loop_thread


async def test_a_program_refused_by_the_policy_is_parsed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fx = _javascript_fixture(tmp_path)
    parses = count_parses(monkeypatch)
    request = ExecutionRequest(language="javascript", code=f"{INTL};\nDeno.exit(1)")
    result = await fx.executions.execute(request, ALICE)
    assert result.status == "refused"
    assert len(parses.made) == 1


async def test_a_program_waiting_for_a_slot_does_not_hold_its_parse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nursery: trio.Nursery
) -> None:
    """Its parse is let go before the wait (a tree can be far larger than its program)
    and made again by the executor once a slot is free."""
    fx = _javascript_fixture(tmp_path, capacity=1)
    parses = count_parses(monkeypatch)
    release = trio.Event()
    results: list[ExecutionResult] = []

    async def hold_the_slot(task_status: trio.TaskStatus[None]) -> None:
        async with fx.admission.slot():
            task_status.started()
            await release.wait()

    async def run() -> None:
        request = ExecutionRequest(language="javascript", code=INTL)
        results.append(await fx.executions.execute(request, ALICE))

    assert fx.admission.has_free_slot()
    await nursery.start(hold_the_slot)
    assert not fx.admission.has_free_slot()
    nursery.start_soon(run)
    with trio.fail_after(WAIT_S):
        while not fx.admission.statistics().waiting:
            await trio.sleep(0.01)
    assert len(parses.made) == 1  # the registry's, before the wait
    release.set()
    with trio.fail_after(WAIT_S):
        while not results:
            await trio.sleep(0.01)
    assert results[0].status == "ok"
    assert len(parses.made) == 2


def _guest_request_fixture(tmp_path: Path) -> ExecutionsFixture:
    """wasm-js, the default for both languages, whose stand-in answers with the request
    its guest would be handed, and deno's stand-in (as in `_javascript_fixture`)."""
    wasm_js = WasmJsExecutor(cache_dir=tmp_path / "wasm-js")
    deno = DenoExecutor(cache_dir=tmp_path / "deno")

    async def guest_request(job: Job, bridge: ToolBridge) -> Outcome:
        return Outcome(Status.OK, result=wasm_js.request_for(job))

    async def module(job: Job, bridge: ToolBridge) -> Outcome:
        return Outcome(Status.OK, result=deno.program_fields(job)["module"])

    return ExecutionsFixture(
        FakeExecutor(),
        others=[
            FakeExecutor(
                guest_request,
                name="wasm-js",
                languages=WasmJsExecutor.languages,
                lacks=WasmJsExecutor.lacks,
            ),
            FakeExecutor(module, name="deno", languages=frozenset({"javascript", "typescript"})),
        ],
        defaults={"javascript": "wasm-js", "typescript": "wasm-js"},
    )


@pytest.mark.parametrize(
    ("language", "code", "executor"),
    [
        ("typescript", "const n: number = 2;\nn * 21", "wasm-js"),
        ("typescript", "enum E { A }\nE.A", "deno"),
        ("javascript", "const n = 2;\nn * 21", "wasm-js"),
        ("javascript", INTL, "deno"),
    ],
)
async def test_a_program_its_principal_runs_again_is_not_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, language: str, code: str, executor: str
) -> None:
    """What reading decided (the route, the guest's program) is kept for the same
    principal's same program; its inputs are still the request's. Another principal's
    request reads it afresh: its time tells nothing of what others ran."""
    fx = _guest_request_fixture(tmp_path)
    parses = count_parses(monkeypatch)

    async def run(principal: Principal, inputs: dict[str, Any]) -> tuple[str, Any]:
        request = ExecutionRequest(language=language, code=code, inputs=inputs)
        result = await fx.executions.execute(request, principal)
        assert (result.status, result.executor) == ("ok", executor), result.error
        return result.result, len(parses.made)

    first, read = await run(ALICE, {"n": 1})
    assert read >= 1
    again, read_again = await run(ALICE, {"n": 2})
    assert read_again == read  # not parsed again
    assert again == first.replace('"n":1', '"n":2')
    if executor == "wasm-js":
        assert '"n":2' in again  # the request's own inputs
    elsewhere, read_elsewhere = await run(BOB, {"n": 1})
    assert elsewhere == first
    assert read_elsewhere == 2 * read


async def test_a_client_named_as_the_master_does_not_share_its_readings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fx = _guest_request_fixture(tmp_path)
    parses = count_parses(monkeypatch)
    scopes = frozenset({"execute"})
    request = ExecutionRequest(language="typescript", code="const n: number = 2;\nn * 21")
    for principal in (Principal("master", "master", scopes), Principal("master", "client", scopes)):
        result = await fx.executions.execute(request, principal)
        assert result.status == "ok", result.error
    assert len(parses.of(request.code)) == 2
