"""Sessions on the Wasmtime executors: real Wasmtime, the real guests, state kept
from one step to the next in an instance of the session's own."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.core.errors import Overloaded, SandboxCrashed
from conduit.executors import wasm as wasm_module
from conduit.executors import wasm_runners
from conduit.executors.base import ExecutorSession, Job, Limits, Outcome, SessionSpec, Status
from conduit.executors.wasm_js import WasmJsExecutor
from conduit.executors.wasm_python import WasmPythonExecutor
from conduit.executors.wasm_sessions import WasmSession
from tests.executors.conftest import open_wasm_session
from tests.sandboxes import WAIT_S, NoBridge


class EchoBridge:
    """Answers every tool call with its own arguments."""

    session_token = "unused"
    callback = None

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        return {"value": {"echoed": params.get("arguments")}}


async def step(
    session: ExecutorSession,
    code: str,
    *,
    language: str = "python",
    bridge: Any = None,
    **limits: Any,
) -> Outcome:
    job = Job("ex_step", language, code, Limits(**limits))
    with trio.fail_after(WAIT_S):
        return await session.run(job, bridge or NoBridge())


@pytest.fixture
async def js_session(wasm_js: WasmJsExecutor) -> AsyncIterator[ExecutorSession]:
    session = await open_wasm_session(wasm_js)
    try:
        yield session
    finally:
        await session.aclose()


async def js_step(session: ExecutorSession, code: str, **limits: Any) -> Outcome:
    return await step(session, code, language="javascript", **limits)


# -- state kept -------------------------------------------------------------------------


async def test_python_variables_persist_between_steps(py_session: ExecutorSession) -> None:
    first = await step(py_session, "x = 1")
    assert (first.status, first.session_reset) == (Status.OK, False), first
    second = await step(py_session, "x += 1\nx")
    assert (second.status, second.result) == (Status.OK, 2), second


async def test_python_functions_imports_and_files_persist(py_session: ExecutorSession) -> None:
    first = await step(
        py_session,
        "import textwrap\n"
        "def shout(s):\n    return s.upper() + '!'\n"
        "open('notes.txt', 'w').write('kept')",
    )
    assert first.status is Status.OK, first
    second = await step(
        py_session, "[shout('hi'), textwrap.dedent('  a'), open('notes.txt').read()]"
    )
    assert second.result == ["HI!", "a", "kept"], second


async def test_a_step_s_result_is_its_own(py_session: ExecutorSession) -> None:
    assert (await step(py_session, "40 + 2")).result == 42
    # No final expression: no result, rather than the last step's.
    assert (await step(py_session, "y = 3")).result is None


async def test_a_step_s_inputs_are_its_own(py_session: ExecutorSession) -> None:
    job = Job("ex_in", "python", "seen = inputs\nseen", Limits(), inputs={"n": 1})
    with trio.fail_after(WAIT_S):
        assert (await py_session.run(job, NoBridge())).result == {"n": 1}
    assert (await step(py_session, "[seen, inputs]")).result == [{"n": 1}, None]


async def test_js_globals_persist_between_steps(js_session: ExecutorSession) -> None:
    first = await js_step(js_session, "globalThis.x = 1")
    assert first.status is Status.OK, first
    second = await js_step(js_session, "x + 1")
    assert (second.status, second.result) == (Status.OK, 2), second
    awaited = await js_step(js_session, "await new Promise((r) => setTimeout(r, 1));\nx * 10")
    assert awaited.result == 10, awaited


async def test_a_js_step_with_an_uncaught_error_fails_and_the_session_goes_on(
    js_session: ExecutorSession,
) -> None:
    failed = await js_step(
        js_session,
        "globalThis.kept = 1;\nqueueMicrotask(() => { throw new Error('in a callback') });\n"
        "await null;\nkept",
    )
    assert failed.status is Status.ERROR and not failed.session_reset, failed
    assert failed.error is not None and failed.error.message == "in a callback"
    after = await js_step(js_session, "kept + 1")
    assert (after.status, after.result, after.session_reset) == (Status.OK, 2, False), after


async def test_js_declarations_persist_between_steps(js_session: ExecutorSession) -> None:
    first = await js_step(
        js_session,
        "let x = 1;\nconst { a, b: [c] } = { a: 2, b: [3] };\nfunction bump(n) { return x + n; }",
    )
    assert first.status is Status.OK, first
    second = await js_step(js_session, "x += 1;\n[bump(a), c]")
    # `bump` sees the x this step changed: the declarations are the global object's.
    assert (second.status, second.result) == (Status.OK, [4, 3]), second


async def test_js_steps_pass_through_session_source(
    wasm_js: WasmJsExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wasm_js, "session_source", lambda code: f"globalThis.seen = 7;\n{code}")
    session = await open_wasm_session(wasm_js)
    try:
        assert (await js_step(session, "seen")).result == 7
    finally:
        await session.aclose()
    # A fresh execution's source is the program's own.
    job = Job("ex_fresh", "javascript", "typeof seen", Limits())
    with trio.fail_after(WAIT_S):
        assert (await wasm_js.run(job, NoBridge())).result == "undefined"


# -- what ends a session's state, and what does not -----------------------------------


async def test_a_program_error_keeps_the_state(py_session: ExecutorSession) -> None:
    await step(py_session, "x = 5")
    failed = await step(py_session, "raise ValueError('no')")
    assert (failed.status, failed.session_reset) == (Status.ERROR, False), failed
    assert (await step(py_session, "x")).result == 5


async def test_a_js_error_keeps_the_state(js_session: ExecutorSession) -> None:
    await js_step(js_session, "globalThis.x = 5")
    failed = await js_step(js_session, "throw new Error('no')")
    assert (failed.status, failed.session_reset) == (Status.ERROR, False), failed
    assert (await js_step(js_session, "x")).result == 5


async def test_a_timeout_resets_the_session(py_session: ExecutorSession) -> None:
    await step(py_session, "x = 5")
    spun = await step(py_session, "print('spin')\nwhile True: pass", timeout_ms=500)
    assert (spun.status, spun.stdout, spun.session_reset) == (Status.TIMEOUT, "spin\n", True)
    after = await step(py_session, "'x' in globals()")
    assert (after.status, after.result, after.session_reset) == (Status.OK, False, False)
    assert (await step(py_session, "x = 1\nx")).result == 1


async def test_a_stop_resets_the_js_session(js_session: ExecutorSession) -> None:
    await js_step(js_session, "globalThis.x = 5")
    job = Job("ex_stop", "javascript", "while (true) {}", Limits(timeout_ms=20_000))

    async def stop_soon() -> None:
        await trio.sleep(0.3)
        job.stop.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop_soon)
        with trio.fail_after(WAIT_S):
            stopped = await js_session.run(job, NoBridge())
    assert (stopped.status, stopped.session_reset) == (Status.CANCELLED, True), stopped
    assert (await js_step(js_session, "typeof x")).result == "undefined"


async def test_memory_is_capped_across_steps(wasm: WasmPythonExecutor) -> None:
    session = await wasm.open_session(SessionSpec("ses_mem", "python", 64))
    try:
        # Each step's own limit is far above the session's cap: the cap holds.
        kept = await step(session, "held = bytearray(24 << 20)\nlen(held)", memory_mb=1024)
        assert kept.status is Status.OK, kept
        grown = await step(session, "more = bytearray(48 << 20)", memory_mb=1024)
        assert (grown.status, grown.session_reset) == (Status.MEMORY_LIMIT, True), grown
        assert (await step(session, "'held' in globals()")).result is False
    finally:
        await session.aclose()


async def test_a_step_has_its_own_output_and_tool_limits(py_session: ExecutorSession) -> None:
    flood = await step(py_session, "while True: print('x' * 99)", output_bytes=5_000)
    assert (flood.status, len(flood.stdout)) == (Status.OUTPUT_LIMIT, 5_000), flood
    assert flood.session_reset
    called = await step(py_session, "tools.echo.say(text='a')", bridge=EchoBridge())
    assert (called.result, called.tool_calls) == ({"echoed": {"text": "a"}}, 1), called
    again = await step(py_session, "tools.echo.say(text='b')", bridge=EchoBridge())
    assert again.tool_calls == 1, again


# -- isolation --------------------------------------------------------------------------


async def test_two_sessions_and_fresh_runs_are_isolated(wasm: WasmPythonExecutor) -> None:
    one, two = await open_wasm_session(wasm, "ses_a"), await open_wasm_session(wasm, "ses_b")
    try:
        await step(one, "x = 'one'\nopen('f.txt', 'w').write('one')")
        await step(two, "x = 'two'")
        assert (await step(one, "x")).result == "one"
        assert (await step(two, "x")).result == "two"
        assert (await step(two, "import os\nos.listdir('.')")).result == []
        fresh = Job("ex_fresh", "python", "['x' in globals(), 'os' in globals()]", Limits())
        with trio.fail_after(WAIT_S):
            assert (await wasm.run(fresh, NoBridge())).result == [False, False]
        fresh = Job("ex_files", "python", "import os\nos.listdir('.')", Limits())
        with trio.fail_after(WAIT_S):
            assert (await wasm.run(fresh, NoBridge())).result == []
    finally:
        await one.aclose()
        await two.aclose()


# -- what a session holds ---------------------------------------------------------------


async def test_aclose_gives_the_runner_back(wasm: WasmPythonExecutor) -> None:
    before = wasm.info().pool
    assert (before["sessions"], before["taken_runners"]) == (0, 0)
    session = await open_wasm_session(wasm)
    await step(session, "x = 1")
    held = wasm.info().pool
    # Idle between steps: a runner held, no CPU slot.
    assert (held["sessions"], held["taken_runners"], held["running_guests"]) == (1, 1, 0)
    await session.aclose()
    await session.aclose()  # idempotent
    after = wasm.info().pool
    assert (after["sessions"], after["taken_runners"]) == (0, 0)
    with pytest.raises(SandboxCrashed):
        await step(session, "1")


async def test_aclose_under_cancellation_still_closes_the_store(
    wasm: WasmPythonExecutor,
) -> None:
    session = await open_wasm_session(wasm)
    assert isinstance(session, WasmSession)
    sandbox = session.sandbox
    assert sandbox is not None
    with trio.CancelScope() as scope:
        scope.cancel()
        await session.aclose()
    assert sandbox.closed.is_set()
    assert (wasm.info().pool["sessions"], wasm.info().pool["taken_runners"]) == (0, 0)


async def test_aclose_stops_a_running_step(wasm: WasmPythonExecutor) -> None:
    session = await open_wasm_session(wasm)
    outcomes: list[Outcome] = []

    async def spin() -> None:
        outcomes.append(await step(session, "while True: pass", timeout_ms=20_000))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(spin)
        await trio.sleep(0.3)
        with trio.fail_after(5):
            await session.aclose()
    assert (outcomes[0].status, outcomes[0].session_reset) == (Status.CANCELLED, True)
    assert wasm.info().pool["taken_runners"] == 0


async def test_a_cancelled_step_leaves_a_fresh_sandbox(py_session: ExecutorSession) -> None:
    await step(py_session, "x = 1")
    with trio.move_on_after(0.3) as scope:
        await step(py_session, "while True: pass", timeout_ms=20_000)
    assert scope.cancelled_caught
    after = await step(py_session, "'x' in globals()")
    assert (after.status, after.result) == (Status.OK, False), after


async def test_sessions_are_capped(
    wasm: WasmPythonExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wasm_module, "MAX_SESSIONS", 1)
    session = await open_wasm_session(wasm)
    try:
        with pytest.raises(Overloaded):
            await open_wasm_session(wasm, "ses_2")
        # Fresh executions still run.
        with trio.fail_after(WAIT_S):
            fresh = await wasm.run(Job("ex", "python", "1", Limits()), NoBridge())
        assert fresh.result == 1
    finally:
        await session.aclose()
    await (await open_wasm_session(wasm, "ses_3")).aclose()


async def test_stopping_the_executor_ends_its_open_sessions(
    wasm_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Were a session's thread left waiting for steps, stopping would wait this long.
    monkeypatch.setattr(wasm_runners, "STOP_WAIT_S", 60.0)
    executor = WasmPythonExecutor(cache_dir=wasm_cache)
    with trio.fail_after(WAIT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(executor.serve)
            assert await executor.wait_ready()
            session = await open_wasm_session(executor)
            assert (await step(session, "x = 1\nx")).result == 1
            nursery.cancel_scope.cancel()


async def test_a_sessions_runner_waits_for_its_next_step_in_the_usual_class(
    py_session: ExecutorSession,
) -> None:
    # Idling a runner is for the teardown after a fresh execution's answer; a session's
    # runner has none, and would start its next step from the idle class.
    assert isinstance(py_session, WasmSession)
    for _ in range(2):
        outcome = await step(py_session, "x = 1")
        assert outcome.status is Status.OK, outcome.error
        assert py_session.runner is not None
        priority = py_session.runner._priority
        assert priority is not None and not priority.lowered
