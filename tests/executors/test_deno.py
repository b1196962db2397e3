"""The Deno executor with real Deno: results, errors, limits, the warm pool, cleanup.

Escape attempts live in tests/security/test_deno_sandbox.py.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from conduit.core.errors import RuntimeMissing, SandboxCrashed
from conduit.executors.base import CallbackAddress, Job, Limits, Outcome, Status
from conduit.executors.deno import DenoExecutor, permission_flags, read_version
from conduit.executors.outcomes import answered
from conduit.executors.output import OutputCapture, ResultSplitter
from conduit.executors.pool import PoolState
from tests.processes import deno_children
from tests.sandboxes import WAIT_S, NoBridge, wait_for


async def start(nursery: trio.Nursery, tmp_path: Path, **options: Any) -> DenoExecutor:
    executor = DenoExecutor(cache_dir=tmp_path / "deno", **options)
    with trio.fail_after(WAIT_S):
        await nursery.start(executor.serve)
    return executor


@pytest.fixture
async def deno(nursery: trio.Nursery, tmp_path: Path) -> DenoExecutor:
    return await start(nursery, tmp_path, pool_size=2)


async def run(
    executor: DenoExecutor,
    code: str,
    *,
    language: str = "typescript",
    inputs: Any = None,
    **limits: Any,
) -> Outcome:
    job = Job("ex_test", language, code, Limits(**limits), inputs=inputs)
    with trio.fail_after(WAIT_S):
        return await executor.run(job, NoBridge())


# -- results and output -----------------------------------------------------------------


async def test_return_value_is_the_result(deno: DenoExecutor) -> None:
    outcome = await run(deno, "const x: number = 40;\nreturn x + 2;")
    assert outcome.status is Status.OK
    assert outcome.result == 42
    assert outcome.exit_code == 0
    assert outcome.error is None


async def test_top_level_await(deno: DenoExecutor) -> None:
    code = "const v = await new Promise((r) => setTimeout(() => r(5), 10));\nreturn v * 2;"
    assert (await run(deno, code)).result == 10


async def test_console_goes_to_stdout_and_stderr(deno: DenoExecutor) -> None:
    outcome = await run(deno, "console.log('a'); console.error('e'); console.log('b'); return 1")
    assert (outcome.stdout, outcome.stderr) == ("a\nb\n", "e\n")
    assert not outcome.truncated_stdout
    assert not outcome.truncated_stderr


async def test_inputs_reach_the_program(deno: DenoExecutor) -> None:
    outcome = await run(
        deno,
        "return inputs.names.map((n: string) => n.toUpperCase())",
        inputs={"names": ["a", "é"]},
    )
    assert outcome.result == ["A", "É"]


async def test_javascript_is_not_typescript(deno: DenoExecutor) -> None:
    assert (await run(deno, "return inputs === null", language="javascript")).result is True
    outcome = await run(deno, "const x: number = 1;\nreturn x", language="javascript")
    assert outcome.status is Status.ERROR
    assert outcome.error is not None
    assert outcome.error.type == "SyntaxError"


async def test_results_json_cannot_encode_become_strings(deno: DenoExecutor) -> None:
    assert (await run(deno, "return 10n")).result == "10"
    assert (await run(deno, "const o: any = {}; o.self = o; return o")).result == "[object Object]"
    assert (await run(deno, "return undefined")).result is None
    assert (await run(deno, "return {d: new Date(0)}")).result == {"d": "1970-01-01T00:00:00.000Z"}


async def test_a_printed_fake_marker_is_just_output(deno: DenoExecutor) -> None:
    code = "console.log('\\x1e' + '0'.repeat(32) + '{\"result\": 666}'); return 1"
    outcome = await run(deno, code)
    assert outcome.result == 1
    assert '{"result": 666}' in outcome.stdout


async def test_text_and_numbers_json_cannot_carry_never_raise(deno: DenoExecutor) -> None:
    thrown = await run(deno, 'throw new Error("bad \\ud800 text")')
    assert thrown.status is Status.ERROR
    assert thrown.error is not None
    assert thrown.error.message == "bad \ufffd text"
    code = 'return {"\\udc00k": "v\\ud800", n: [NaN, Infinity, -Infinity, 1e308 * 10]}'
    returned = await run(deno, code)
    assert (returned.status, returned.result) == (
        Status.OK,
        {"\ufffdk": "v\ufffd", "n": [None, None, None, None]},
    )
    echoed = await run(deno, "return inputs", inputs={"s": "\ud800", "f": float("nan")})
    assert echoed.result == {"s": "\ufffd", "f": None}
    huge = answered(Outcome(Status.OK), b'{"result": [1e999, NaN]}', lambda _: False, "Deno worker")
    assert (huge.status, huge.result) == (Status.OK, [None, None])


@pytest.mark.parametrize(
    "payload",
    [
        b'{"result": 1' + b"0" * 5000 + b"}",
        b'{"result": "unterminated',
        b"[1, 2]",
        b'{"error": "not an object"}',
        b"\xff\xfe",
    ],
)
def test_an_unreadable_result_is_a_crash_not_an_exception(payload: bytes) -> None:
    outcome = answered(Outcome(Status.OK), payload, lambda _: False, "Deno worker")
    assert outcome.status is Status.CRASHED
    assert outcome.error is not None
    assert "unreadable result" in outcome.error.message


# -- errors -------------------------------------------------------------------------------


async def test_thrown_error_carries_user_line_numbers(deno: DenoExecutor) -> None:
    code = (
        "interface Point { x: number }\n"  # 1: erased by the transpiler
        "const p: Point = { x: 1 };\n"  # 2
        "function boom(): never {\n"  # 3
        "  throw new TypeError('bad ' + p.x);\n"  # 4
        "}\n"  # 5
        "console.log('before');\n"  # 6
        "boom();\n"  # 7
    )
    outcome = await run(deno, code)
    assert outcome.status is Status.ERROR
    assert outcome.stdout == "before\n"
    assert outcome.exit_code == 1
    assert outcome.error is not None
    assert (outcome.error.type, outcome.error.message) == ("TypeError", "bad 1")
    traceback = outcome.error.traceback
    assert "at boom (<program>:4:9)" in traceback
    assert "<program>:7:" in traceback
    assert "data:" not in traceback
    assert "deno_worker" not in traceback
    assert "ext:" not in traceback


async def test_syntax_error_points_at_the_user_line(deno: DenoExecutor) -> None:
    outcome = await run(deno, "let a = 1;\nconst x = ;\n")
    assert outcome.status is Status.ERROR
    assert outcome.error is not None
    assert outcome.error.type == "SyntaxError"
    assert "2 | const x = ;" in outcome.error.traceback
    assert "<program>:2:" in outcome.error.traceback


async def test_errors_outside_the_awaited_call_are_reported(deno: DenoExecutor) -> None:
    pause = "\nawait new Promise((r) => setTimeout(r, 100));"
    code = "setTimeout(() => { throw new RangeError('late'); }, 0);" + pause
    outcome = await run(deno, code)
    assert outcome.status is Status.ERROR
    assert outcome.error is not None
    assert (outcome.error.type, outcome.error.message) == ("RangeError", "late")
    assert "<program>:1:" in outcome.error.traceback
    rejected = await run(deno, "Promise.reject(new Error('nobody awaits me'));" + pause)
    assert rejected.error is not None
    assert rejected.error.message == "nobody awaits me"


async def test_a_permission_refused_says_what_holds_not_a_flag_to_pass(
    deno: DenoExecutor,
) -> None:
    fetched = await run(deno, 'await fetch("https://example.com/x")')
    assert fetched.error is not None and fetched.error.type == "NotCapable"
    assert fetched.error.message == (
        'Requires net access to "example.com:443": this sandbox has no network; '
        "tools are the way out"
    )
    read = await run(deno, 'await Deno.readTextFile("/etc/passwd")')
    assert read.error is not None
    refused = 'Requires read access to "/etc/passwd": not allowed in this sandbox'
    assert read.error.message == refused


async def test_throwing_a_non_error(deno: DenoExecutor) -> None:
    outcome = await run(deno, "throw 'plain'")
    assert outcome.status is Status.ERROR
    assert outcome.error is not None
    assert (outcome.error.type, outcome.error.message) == ("Error", "plain")


async def test_deno_exit_codes(deno: DenoExecutor) -> None:
    zero = await run(deno, "console.log('bye'); Deno.exit(0); return 1")
    assert (zero.status, zero.exit_code, zero.result, zero.stdout) == (Status.OK, 0, None, "bye\n")
    three = await run(deno, "Deno.exit(3)")
    assert (three.status, three.exit_code) == (Status.ERROR, 3)
    assert three.error is not None
    assert three.error.type == "Exit"


@pytest.mark.parametrize(
    "code",
    [
        'Deno.stdout.close(); throw new Error("mine")',
        "Deno.stdout.close(); return 5",
        'Deno.stdout.close(); Deno.stderr.close(); throw new Error("mine")',
    ],
)
async def test_a_program_that_closes_stdout_fails_saying_so(deno: DenoExecutor, code: str) -> None:
    """Its answer cannot be written: not `ok` with no result (the worker used to exit 0
    once the write failed, which reads as `Deno.exit(0)`)."""
    outcome = await run(deno, code)
    assert outcome.status is Status.ERROR, outcome
    assert outcome.error is not None and "standard output was closed" in outcome.error.message


# -- limits -------------------------------------------------------------------------------


async def test_timeout_keeps_partial_output(deno: DenoExecutor) -> None:
    start = trio.current_time()
    outcome = await run(deno, "console.log('started'); while (true) {}", timeout_ms=300)
    assert outcome.status is Status.TIMEOUT
    assert outcome.stdout == "started\n"
    assert outcome.exit_code is None
    assert trio.current_time() - start < 5


async def test_result_too_large_is_an_error(deno: DenoExecutor) -> None:
    outcome = await run(deno, "console.log('kept'); return 'x'.repeat(5000)", result_bytes=1000)
    assert outcome.status is Status.ERROR
    assert outcome.error is not None
    assert outcome.error.type == "ResultTooLarge"
    assert "1000 bytes" in outcome.error.message
    assert outcome.stdout == "kept\n"
    assert (await run(deno, "return 'x'.repeat(900)", result_bytes=1000)).status is Status.OK


async def test_output_budget_is_shared_by_stdout_and_stderr(deno: DenoExecutor) -> None:
    code = "console.log('o'.repeat(60)); console.error('e'.repeat(60)); return 1"
    outcome = await run(deno, code, output_bytes=100)
    assert outcome.status is Status.OUTPUT_LIMIT
    assert outcome.error is not None
    assert outcome.error.type == "OutputLimit"
    # Which pipe is read first is up to the scheduler; the budget is not.
    assert len(outcome.stdout) + len(outcome.stderr) == 100
    assert outcome.truncated_stdout != outcome.truncated_stderr


async def test_exactly_the_line_budget_is_fine(deno: DenoExecutor) -> None:
    outcome = await run(
        deno, "for (let i = 0; i < 5; i++) console.log(i); return 1", output_lines=5
    )
    assert outcome.status is Status.OK
    assert outcome.stdout == "0\n1\n2\n3\n4\n"


# -- the warm pool ------------------------------------------------------------------------


async def test_pool_is_warm_and_refills(deno: DenoExecutor) -> None:
    info = deno.info()
    assert info.available
    assert info.version is not None
    assert info.version.startswith("2.")
    assert info.pool is not None
    assert (info.pool["state"], info.pool["idle"], info.pool["size"]) == ("ready", 2, 2)
    assert "READY" in repr(deno)
    await run(deno, "return 1")
    await wait_for(lambda: deno.info().pool["idle"] == 2)  # type: ignore[index]
    pool = deno.info().pool
    assert pool is not None
    assert (pool["handed_out"], pool["refills"], pool["cold_starts"], pool["in_use"]) == (
        1,
        3,
        0,
        0,
    )


async def test_an_idle_worker_that_dies_is_replaced(deno: DenoExecutor) -> None:
    victim = min(deno_children())
    os.kill(victim, signal.SIGKILL)
    await wait_for(lambda: deno.info().pool["deaths"] == 1)  # type: ignore[index]
    await wait_for(lambda: deno.info().pool["idle"] == 2)  # type: ignore[index]
    assert victim not in deno_children()
    assert (await run(deno, "return 2")).result == 2


async def test_an_empty_pool_starts_workers_cold(nursery: trio.Nursery, tmp_path: Path) -> None:
    executor = await start(nursery, tmp_path, pool_size=0)
    assert (await run(executor, "return 'cold'")).result == "cold"
    pool = executor.info().pool
    assert pool is not None
    assert (pool["cold_starts"], pool["handed_out"]) == (1, 0)
    assert deno_children() == set()  # a cold worker is reaped before run() returns


async def test_another_heap_size_starts_cold(deno: DenoExecutor) -> None:
    code = "return Deno.memoryUsage().heapTotal > 0"
    assert (await run(deno, code, memory_mb=96)).result is True
    pool = deno.info().pool
    assert pool is not None
    assert (pool["cold_starts_other_heap"], pool["handed_out"]) == (1, 0)


async def test_concurrent_jobs_beyond_the_pool(deno: DenoExecutor) -> None:
    results: dict[int, Any] = {}

    async def one(n: int) -> None:
        results[n] = (await run(deno, f"return {n} * 2")).result

    async with trio.open_nursery() as nursery:
        for n in range(5):
            nursery.start_soon(one, n)
    assert results == {n: n * 2 for n in range(5)}


async def test_every_execution_starts_fresh(deno: DenoExecutor) -> None:
    # A process's start, to the microsecond: `Deno.pid` is 1 in every sandbox.
    first = "globalThis.leak = 42; localStorage.setItem('k', 'v'); return performance.timeOrigin"
    second = (
        "return [typeof (globalThis as any).leak, localStorage.getItem('k'), "
        "performance.timeOrigin]"
    )
    began = (await run(deno, first)).result
    kind, stored, other_began = (await run(deno, second)).result
    assert (kind, stored) == ("undefined", None)
    assert other_began != began


async def test_cancelling_a_run_kills_its_sandbox(nursery: trio.Nursery, tmp_path: Path) -> None:
    executor = await start(nursery, tmp_path, pool_size=0)
    with trio.move_on_after(1) as scope:
        await executor.run(Job("ex_cancel", "typescript", "while (true) {}"), NoBridge())
    assert scope.cancelled_caught
    assert deno_children() == set()


async def test_job_stop_kills_its_sandbox_and_reports_cancelled(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    executor = await start(nursery, tmp_path, pool_size=0)
    job = Job("ex_stop", "typescript", "console.log('before'); while (true) {}")

    async def stop_soon() -> None:
        await trio.sleep(0.5)
        job.stop.set()

    nursery.start_soon(stop_soon)
    with trio.fail_after(WAIT_S):
        outcome = await executor.run(job, NoBridge())
    assert outcome.status is Status.CANCELLED
    assert deno_children() == set()


async def test_shutdown_leaves_no_process_or_directory(tmp_path: Path) -> None:
    executor = DenoExecutor(cache_dir=tmp_path / "deno", pool_size=2)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(WAIT_S):
            await nursery.start(executor.serve)
        assert len(deno_children()) == 2
        assert len(list((tmp_path / "deno").glob("worker-*"))) == 2
        await run(executor, "return 1")
        nursery.cancel_scope.cancel()
    assert deno_children() == set()
    assert list((tmp_path / "deno").glob("worker-*")) == []
    assert executor.info().pool["state"] == PoolState.CLOSED.value  # type: ignore[index]


# -- availability -------------------------------------------------------------------------


async def test_missing_deno_is_unavailable_not_fatal(nursery: trio.Nursery, tmp_path: Path) -> None:
    executor = await start(nursery, tmp_path, binary=tmp_path / "no-such-deno")
    info = executor.info()
    assert info.available is False
    assert info.reason is not None
    assert "not found" in info.reason
    assert "no-such-deno" in info.reason
    with pytest.raises(RuntimeMissing):
        await run(executor, "return 1")


async def test_workers_that_fail_to_start_are_retried_and_reported(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # No worker can become ready in a microsecond: every start fails.
    executor = await start(nursery, tmp_path, pool_size=1, start_timeout_s=1e-6)
    pool = executor.info().pool
    assert pool is not None
    assert (pool["state"], pool["idle"], pool["start_failures"]) == ("ready", 0, 1)
    with pytest.raises(SandboxCrashed, match="did not become ready"):
        await run(executor, "return 1")
    await wait_for(lambda: executor.info().pool["start_failures"] >= 3)  # type: ignore[index]
    assert executor.info().pool["idle"] == 0  # type: ignore[index]


async def test_not_started_is_unavailable(tmp_path: Path) -> None:
    info = DenoExecutor(cache_dir=tmp_path / "deno").info()
    assert info.available is False
    assert info.reason is not None
    assert "serve()" in info.reason


# -- pieces -------------------------------------------------------------------------------


def test_permission_flags_allow_only_the_callback() -> None:
    assert permission_flags(None) == []
    tcp = CallbackAddress(tcp_host="127.0.0.1", tcp_port=4711)
    assert permission_flags(tcp) == ["--allow-net=127.0.0.1:4711"]
    assert permission_flags(CallbackAddress(tcp_host="::1", tcp_port=1)) == ["--allow-net=[::1]:1"]
    assert permission_flags(CallbackAddress(unix_path="/run/c.sock")) == [
        "--allow-net=unix:/run/c.sock",
        "--allow-read=/run/c.sock",
        "--allow-write=/run/c.sock",
    ]
    with pytest.raises(ValueError, match="absolute"):
        permission_flags(CallbackAddress(unix_path="relative.sock"))


def test_permission_flags_add_the_working_directory_alone() -> None:
    work = Path("/state/deno/scratch/run-1/x1")
    assert permission_flags(None, work) == [f"--allow-read={work}", f"--allow-write={work}"]
    assert permission_flags(CallbackAddress(unix_path="/run/c.sock"), work) == [
        "--allow-net=unix:/run/c.sock",
        f"--allow-read=/run/c.sock,{work}",
        f"--allow-write=/run/c.sock,{work}",
    ]
    with pytest.raises(ValueError, match="commas"):
        permission_flags(None, Path("/state/a,b"))


async def test_output_capture_keeps_whole_lines_and_stops_once() -> None:
    hits: list[str] = []
    seen: list[tuple[str, str]] = []

    async def hook(stream: str, text: str) -> None:
        seen.append((stream, text))

    capture = OutputCapture(
        max_bytes=100, max_lines=2, on_limit=lambda: hits.append("hit"), on_output=hook
    )
    await capture.write("stdout", b"one\ntw")
    await capture.write("stderr", "é\n".encode()[:1])  # half a character
    await capture.write("stderr", "é\n".encode()[1:] + b"three\n")
    await capture.write("stdout", b"more")
    assert (capture.text("stdout"), capture.text("stderr")) == ("one\ntw", "é\n")
    assert (capture.truncated("stdout"), capture.truncated("stderr")) == (True, True)
    assert hits == ["hit"]
    assert seen == [("stdout", "one\ntw"), ("stderr", "é\n")]
    assert capture.statistics().lines == 2


async def test_result_splitter_finds_a_marker_split_across_reads() -> None:
    send, receive = trio.testing.memory_stream_one_way_pair()
    settled: list[bool] = []
    splitter = ResultSplitter(
        receive, b"\x1eabc", max_payload_bytes=10, on_settled=lambda: settled.append(True)
    )
    capture = OutputCapture(max_bytes=1000, max_lines=100)
    for piece in (b"out\x1e", b"a", b'bc{"r"', b":1}\nafter", b"\x1ea"):
        await send.send_all(piece)
    await send.aclose()
    with trio.fail_after(WAIT_S):
        await capture.pump("stdout", splitter)
    assert splitter.payload == b'{"r":1}'
    assert capture.text("stdout") == "outafter\x1ea"
    assert settled == [True]


async def test_a_deno_binary_is_asked_its_version_once_per_version(tmp_path: Path) -> None:
    asked = tmp_path / "asked"
    binary = tmp_path / "deno"
    binary.write_text(f'#!/bin/sh\necho x >> "{asked}"\necho "deno 9.9.9 (test)"\n')
    binary.chmod(0o755)
    assert await read_version(str(binary), tmp_path) == "9.9.9 (test)"
    assert await read_version(str(binary), tmp_path) == "9.9.9 (test)"
    assert asked.read_text().count("x") == 1
    binary.write_text(f'#!/bin/sh\necho x >> "{asked}"\necho "deno 9.9.10 (test)"\n')
    assert await read_version(str(binary), tmp_path) == "9.9.10 (test)"
    assert asked.read_text().count("x") == 2


async def test_a_deno_that_prints_no_version_is_missing_not_a_crash(tmp_path: Path) -> None:
    binary = tmp_path / "deno"
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    with pytest.raises(RuntimeMissing, match="printed nothing"):
        await read_version(str(binary), tmp_path)
