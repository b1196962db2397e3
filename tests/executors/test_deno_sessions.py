"""Deno sessions with real Deno: state kept across steps, resets, isolation, closing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.core.errors import Overloaded, SandboxCrashed
from conduit.executors import deno as deno_module
from conduit.executors.base import CallbackAddress, Job, Limits, Outcome, SessionSpec, Status
from conduit.executors.deno import INLINE_PREPARE_CHARS, DenoExecutor
from conduit.executors.deno_session import DenoSession
from tests.processes import deno_children
from tests.sandboxes import WAIT_S, NoBridge, wait_for


@pytest.fixture
async def deno(nursery: trio.Nursery, tmp_path: Path) -> DenoExecutor:
    executor = DenoExecutor(cache_dir=tmp_path / "deno", pool_size=0, max_sessions=2)
    with trio.fail_after(WAIT_S):
        await nursery.start(executor.serve)
    return executor


async def open_session(
    executor: DenoExecutor, language: str = "typescript", memory_mb: int = 128
) -> DenoSession:
    with trio.fail_after(WAIT_S):
        return await executor.open_session(SessionSpec("ses_test", language, memory_mb))


async def step(
    session: DenoSession, code: str, *, language: str = "typescript", **limits: Any
) -> Outcome:
    job = Job("ex_step", language, code, Limits(**limits))
    with trio.fail_after(WAIT_S):
        return await session.run(job, NoBridge())


def host_pid(session: DenoSession) -> int:
    """The pid of the session's Deno process on the host (inside its sandbox's PID
    namespace, `Deno.pid` is 1)."""
    worker = session._worker
    assert worker is not None
    return worker.limited.pid


async def results(session: DenoSession, *codes: str, language: str = "typescript") -> list[Any]:
    """Each step's result; every step must succeed and keep the session."""
    values = []
    for code in codes:
        outcome = await step(session, code, language=language)
        assert (outcome.status, outcome.session_reset) == (Status.OK, False), outcome
        values.append(outcome.result)
    return values


# -- state kept between steps -------------------------------------------------------------


@pytest.mark.parametrize(
    ("language", "declare"),
    [("typescript", "let x: number = 1"), ("javascript", "let x = 1")],
)
async def test_a_variable_lives_on_into_the_next_step(
    deno: DenoExecutor, language: str, declare: str
) -> None:
    session = await open_session(deno, language)
    assert await results(session, declare, "x += 1; x", "x", language=language) == [None, 2, 2]


async def test_a_function_sees_what_later_steps_assign(deno: DenoExecutor) -> None:
    session = await open_session(deno)
    codes = ("const base = 1\nfunction scaled(k: number) { return base * k }", "base = 7")
    await results(session, *codes)
    assert await results(session, "scaled(3)") == [21]


async def test_classes_destructuring_and_imports_persist(deno: DenoExecutor) -> None:
    session = await open_session(deno)
    await results(
        session,
        'import * as path from "node:path"\nimport { sep as separator } from "node:path"',
        "class Point { constructor(public x: number) {} }",
        "const { a, b: [first, ...rest] } = { a: 1, b: [2, 3, 4] }",
    )
    code = "[path.join('a', 'b'), separator, new Point(5).x, a, first, rest]"
    assert await results(session, code) == [["a/b", "/", 5, 1, 2, [3, 4]]]


async def test_top_level_await_and_inputs_work_per_step(deno: DenoExecutor) -> None:
    session = await open_session(deno)
    job = Job("ex_1", "typescript", "const v = await Promise.resolve(inputs.n)", inputs={"n": 4})
    with trio.fail_after(WAIT_S):
        assert (await session.run(job, NoBridge())).status is Status.OK
    job = Job("ex_2", "typescript", "[v, inputs.n]", inputs={"n": 9})
    with trio.fail_after(WAIT_S):
        assert (await session.run(job, NoBridge())).result == [4, 9]


async def test_a_large_step_is_rewritten_too(deno: DenoExecutor) -> None:
    """Over INLINE_PREPARE_CHARS a step is prepared in a worker thread."""
    session = await open_session(deno)
    filler = "".join(f"const v{i}: number = {i};\n" for i in range(400))
    assert len(filler) > INLINE_PREPARE_CHARS
    assert await results(session, filler, "v0 + v399") == [None, 399]


async def test_a_step_reads_an_ended_stdin_as_a_fresh_run_does(deno: DenoExecutor) -> None:
    """The worker's stdin stays open for later steps; a program must not wait on it."""
    session = await open_session(deno)
    read = "await new Response(Deno.stdin.readable).text()"
    assert await results(session, read, "await Deno.stdin.read(new Uint8Array(8))", "1") == [
        "",
        None,
        1,
    ]


async def test_an_error_between_steps_goes_to_the_next_steps_stderr(deno: DenoExecutor) -> None:
    session = await open_session(deno)
    await results(session, "setTimeout(() => { throw new Error('late') }, 50)")
    await trio.sleep(0.5)
    outcome = await step(session, "'next'")
    assert (outcome.result, outcome.session_reset) == ("next", False)
    assert outcome.stderr == "Uncaught Error between steps: late\n"


# -- what ends a step, and what ends the sandbox ---------------------------------------------


async def test_an_exception_keeps_the_session(deno: DenoExecutor) -> None:
    session = await open_session(deno)
    await results(session, "let kept = 3")
    failed = await step(session, "kept = 4\nthrow new Error('boom')")
    assert failed.status is Status.ERROR
    assert failed.error is not None
    assert (failed.error.message, failed.session_reset) == ("boom", False)
    assert "<program>:2:" in failed.error.traceback  # the user's line, not the rewrite's
    assert await results(session, "kept") == [4]


async def test_a_syntax_error_is_the_steps_own_and_keeps_the_session(deno: DenoExecutor) -> None:
    session = await open_session(deno)
    await results(session, "let kept = 1")
    failed = await step(session, "kept = 2\nlet = ;")
    assert failed.error is not None
    assert (failed.error.type, failed.session_reset) == ("SyntaxError", False)
    assert "2 |" in failed.error.traceback  # Deno's code frame, at the user's line
    assert await results(session, "kept") == [1]  # the step did not run at all


async def test_a_timeout_resets_and_the_next_step_starts_afresh(deno: DenoExecutor) -> None:
    session = await open_session(deno)
    await results(session, "let lost = 1")
    pid = host_pid(session)
    timed_out = await step(session, "console.log('spinning'); while (true) {}", timeout_ms=500)
    assert (timed_out.status, timed_out.session_reset) == (Status.TIMEOUT, True)
    assert timed_out.stdout == "spinning\n"
    await wait_for(lambda: pid not in deno_children())
    assert await results(session, "typeof lost") == ["undefined"]
    assert host_pid(session) != pid


async def test_a_stop_resets(deno: DenoExecutor, nursery: trio.Nursery) -> None:
    session = await open_session(deno)
    job = Job("ex_stop", "typescript", "while (true) {}")

    async def stop_soon() -> None:
        await trio.sleep(0.3)
        job.stop.set()

    nursery.start_soon(stop_soon)
    with trio.fail_after(WAIT_S):
        outcome = await session.run(job, NoBridge())
    assert (outcome.status, outcome.session_reset) == (Status.CANCELLED, True)
    assert await results(session, "1 + 1") == [2]


async def test_a_cancelled_step_kills_the_sandbox_and_the_next_says_so(
    deno: DenoExecutor,
) -> None:
    session = await open_session(deno)
    await results(session, "let lost = 1")
    pid = host_pid(session)
    with trio.move_on_after(0.5) as scope:
        await session.run(Job("ex_cancel", "typescript", "while (true) {}"), NoBridge())
    assert scope.cancelled_caught
    await wait_for(lambda: pid not in deno_children())
    outcome = await step(session, "typeof lost")
    assert (outcome.result, outcome.session_reset) == ("undefined", True)
    assert (await step(session, "1")).session_reset is False


async def test_each_step_has_its_own_output_budget(deno: DenoExecutor) -> None:
    session = await open_session(deno)
    for _ in range(3):  # 3 x 60 bytes: over the budget together, not one by one
        outcome = await step(session, "console.log('x'.repeat(59))", output_bytes=100)
        assert (outcome.status, outcome.stdout) == (Status.OK, "x" * 59 + "\n")
    flood = await step(session, "console.log('x'.repeat(200))", output_bytes=100)
    assert (flood.status, flood.session_reset) == (Status.OUTPUT_LIMIT, True)


@pytest.mark.parametrize(("memory_mb", "fits"), [(48, False), (192, True)])
async def test_the_session_heap_is_its_own_memory_mb(
    deno: DenoExecutor, memory_mb: int, fits: bool
) -> None:
    """~80 MB held across two steps: over a 48 MB session's heap, within 192 MB."""
    session = await open_session(deno, memory_mb=memory_mb)
    await results(session, "const hold: number[][] = []")
    grow = "for (let i = 0; i < 10; i++) hold.push(new Array(1e6).fill(1.5))\nhold.length"
    outcome = await step(session, grow, timeout_ms=20_000)
    if fits:
        assert (outcome.status, outcome.result, outcome.session_reset) == (Status.OK, 10, False)
    else:
        assert (outcome.status, outcome.session_reset) == (Status.MEMORY_LIMIT, True)
        assert await results(session, "typeof hold") == ["undefined"]


async def test_deno_exit_resets(deno: DenoExecutor) -> None:
    session = await open_session(deno)
    await results(session, "let gone = 1")
    outcome = await step(session, "Deno.exit(0)")
    assert (outcome.exit_code, outcome.session_reset) == (0, True)
    assert await results(session, "typeof gone") == ["undefined"]


async def test_a_step_that_closes_stdout_fails_and_resets(deno: DenoExecutor) -> None:
    session = await open_session(deno)
    await results(session, "let gone = 1")
    outcome = await step(session, "Deno.stdout.close(); 5")
    assert (outcome.status, outcome.session_reset) == (Status.ERROR, True), outcome
    assert outcome.error is not None and "standard output was closed" in outcome.error.message
    assert await results(session, "typeof gone") == ["undefined"]


async def test_a_sandbox_that_died_between_steps_is_replaced(deno: DenoExecutor) -> None:
    session = await open_session(deno)
    await results(session, "let gone = 1")
    pid = host_pid(session)
    os.killpg(pid, signal.SIGKILL)
    await wait_for(lambda: pid not in deno_children())
    outcome = await step(session, "typeof gone")
    # It ran, afresh: what the session held is gone, and it says so.
    assert (outcome.status, outcome.result, outcome.session_reset) == (
        Status.OK,
        "undefined",
        True,
    )
    assert await results(session, "1") == [1]


async def test_a_timer_left_computing_between_steps_ends_the_sandbox(
    deno: DenoExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One second of CPU between steps, not five: the test waits for it to be spent.
    monkeypatch.setattr(deno_module, "SESSION_IDLE_CPU_S", 1)
    session = await open_session(deno)
    spinning = "setTimeout(function spin() { for (;;) {} }, 0);"
    await results(session, spinning, language="javascript")
    pid = host_pid(session)
    # The step's own budget (timeout_ms 300 s) is not the timer's: the system ends it.
    await wait_for(lambda: pid not in deno_children())
    outcome = await step(session, "1")
    assert (outcome.status, outcome.result, outcome.session_reset) == (Status.OK, 1, True)


# -- sessions apart, and closed -----------------------------------------------------------


async def test_two_sessions_are_isolated(deno: DenoExecutor) -> None:
    first, second = await open_session(deno), await open_session(deno)
    await results(first, "let mine = 'first'")
    await results(second, "let mine = 'second'")
    assert await results(first, "mine") == ["first"]
    assert await results(second, "[mine, typeof globalThis.other]") == [["second", "undefined"]]


async def test_aclose_ends_the_process_and_is_idempotent(deno: DenoExecutor) -> None:
    session = await open_session(deno)
    await results(session, "1")
    pid = host_pid(session)
    await session.aclose()
    await wait_for(lambda: pid not in deno_children())
    await session.aclose()
    with pytest.raises(SandboxCrashed):
        await step(session, "1")


async def test_aclose_under_cancellation_still_ends_the_process(deno: DenoExecutor) -> None:
    session = await open_session(deno)
    await results(session, "1")
    pid = host_pid(session)
    with trio.CancelScope() as scope:
        scope.cancel()
        await session.aclose()
    await wait_for(lambda: pid not in deno_children())


async def test_sessions_beyond_the_cap_are_refused(deno: DenoExecutor) -> None:
    held = [await open_session(deno), await open_session(deno)]
    with pytest.raises(Overloaded):
        await open_session(deno)
    assert deno.info().pool["sessions"] == 2  # type: ignore[index]
    await held[0].aclose()
    await held[0].aclose()  # gives its slot back once
    assert deno.info().pool["sessions"] == 1  # type: ignore[index]
    await (await open_session(deno)).aclose()


async def test_fresh_runs_are_untouched_by_sessions(deno: DenoExecutor) -> None:
    session = await open_session(deno)
    await results(session, "let shared = 1")
    job = Job("ex_fresh", "typescript", "return typeof (globalThis as any).shared")
    with trio.fail_after(WAIT_S):
        assert (await deno.run(job, NoBridge())).result == "undefined"


# -- tool calls ------------------------------------------------------------------------------


@dataclass
class TokenBridge:
    """A step's bridge: its own token, on the address the sandbox connected to."""

    session_token: str
    callback: CallbackAddress | None

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        raise AssertionError("the Deno sandbox calls the daemon over its socket")


async def remove_when_cancelled(directory: Path) -> None:
    try:
        await trio.sleep_forever()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def answer_with_the_token(stream: trio.SocketStream) -> None:
    """A daemon's sandbox socket reduced to one tool, whose value is the caller's token."""
    buffered = b""
    while chunk := await stream.receive_some():
        buffered += chunk
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            call = json.loads(line)
            value = {"value": call["auth"]["bearerToken"]}
            reply = {"jsonrpc": "2.0", "id": call["id"], "result": value}
            await stream.send_all(json.dumps(reply).encode() + b"\n")


async def test_each_step_calls_tools_under_its_own_token(nursery: trio.Nursery) -> None:
    # Short, for a socket path; removed when the test's nursery ends.
    directory = Path(tempfile.mkdtemp(prefix="cd-ses-", dir="/tmp"))
    nursery.start_soon(remove_when_cancelled, directory)
    address = CallbackAddress(unix_path=str(directory / "sandbox.sock"))
    sock = trio.socket.socket(trio.socket.AF_UNIX)
    await sock.bind(address.unix_path)
    sock.listen()
    nursery.start_soon(trio.serve_listeners, answer_with_the_token, [trio.SocketListener(sock)])
    executor = DenoExecutor(cache_dir=directory / "deno", pool_size=0, callback=address)
    with trio.fail_after(WAIT_S):
        await nursery.start(executor.serve)
    session = await open_session(executor)

    async def step_as(token: str, code: str, callback: CallbackAddress | None = address) -> Any:
        with trio.fail_after(WAIT_S):
            outcome = await session.run(Job("ex", "typescript", code), TokenBridge(token, callback))
        assert outcome.session_reset is False, outcome
        return outcome.result if outcome.error is None else outcome.error.message

    first = "const ask = () => tools.t.who()\nawait ask()"
    assert await step_as("tok-1", first) == "tok-1"
    # A function from step 1 calls under step 2's token: the budget charged is the step's.
    assert await step_as("tok-2", "await ask()") == "tok-2"
    assert (
        await step_as("tok-3", "await ask()", None) == "tools are not available in this execution"
    )
    await session.aclose()
