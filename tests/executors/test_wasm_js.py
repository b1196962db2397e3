"""The wasm-js executor with real Wasmtime and the real SpiderMonkey component."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.executors import wasm_js as wasm_js_module
from conduit.executors.base import Job, Limits, Outcome, Status, StopSignal
from conduit.executors.syntax_memo import SyntaxMemo
from conduit.executors.wasm_build import ensure_component
from conduit.executors.wasm_guests import JS_GUEST, componentize_js_version
from conduit.executors.wasm_js import WasmJsExecutor
from tests.parses import count_parses
from tests.sandboxes import LOAD_WAIT_S, WAIT_S, NoBridge


async def run(executor: WasmJsExecutor, code: str, inputs: Any = None, **limits: Any) -> Outcome:
    with trio.fail_after(WAIT_S):
        return await executor.run(
            Job("ex_js", "javascript", code, Limits(**limits), inputs=inputs), NoBridge()
        )


@pytest.mark.parametrize(
    ("code", "result"),
    [
        ("const x = 20;\nx + 22", 42),
        ("[1, 2, 3].map((n) => n * 2)", [2, 4, 6]),
        ("const o = { a: 1 };\no", {"a": 1}),
        ("for (let i = 0; i < 10; i++) {\n  if (i === 3) return { i };\n}", {"i": 3}),
        ("const v = await Promise.resolve(5);\nv * 2", 10),
        ("await new Promise((r) => setTimeout(r, 5));\n'after a timer'", "after a timer"),
        ("let x = 1", None),
        ("undefined", None),
        ("new Function('a', 'return a * 3')(7)", 21),
        ("10n ** 20n", "100000000000000000000"),
        ("const a = {}; a.self = a;\na", "[object Object]"),
    ],
)
async def test_results_follow_the_deno_contract(
    wasm_js: WasmJsExecutor, code: str, result: Any
) -> None:
    outcome = await run(wasm_js, code)
    assert outcome.status is Status.OK, outcome
    assert outcome.result == result


async def test_console_goes_to_stdout_and_stderr_and_inputs_are_a_global(
    wasm_js: WasmJsExecutor,
) -> None:
    code = "console.log('hi', inputs.n);\nconsole.error('e');\ninputs.n * 2"
    outcome = await run(wasm_js, code, inputs={"n": 21})
    assert outcome.stdout == "hi 21\n"
    assert outcome.stderr == "e\n"
    assert outcome.result == 42


async def test_a_nul_in_a_line_loses_nothing_after_it(wasm_js: WasmJsExecutor) -> None:
    code = 'const t = "Hi\\0!";\nconsole.log(t, "<- decoded");\nconsole.error(`${t}`, 2)'
    outcome = await run(wasm_js, code)
    assert outcome.stdout == "Hi\ufffd! <- decoded\n"
    assert outcome.stderr == "Hi\ufffd! 2\n"


async def test_a_program_may_declare_its_own_inputs(wasm_js: WasmJsExecutor) -> None:
    assert (await run(wasm_js, "const inputs = 3;\ninputs + 1", inputs={"n": 1})).result == 4


async def test_errors_give_type_message_and_user_line_numbers(wasm_js: WasmJsExecutor) -> None:
    code = "function f(x) {\n  throw new TypeError('bad ' + x);\n}\nconsole.log('before');\nf(1);\n"
    outcome = await run(wasm_js, code)
    assert outcome.status is Status.ERROR
    assert outcome.exit_code == 1
    assert outcome.stdout == "before\n"
    assert outcome.error is not None
    assert (outcome.error.type, outcome.error.message) == ("TypeError", "bad 1")
    trace = outcome.error.traceback
    assert "at f (<program>:2:" in trace
    assert "    at <program>:5:" in trace  # the body, unnamed
    assert "guest.js" not in trace and "initializer" not in trace


async def test_thrown_non_errors_and_rejections_are_reported(wasm_js: WasmJsExecutor) -> None:
    thrown = await run(wasm_js, "throw 'plain string'")
    assert thrown.error is not None and thrown.error.message == "plain string"
    rejected = await run(wasm_js, "await Promise.reject(new RangeError('no'))")
    assert rejected.error is not None and rejected.error.type == "RangeError"


# Counts the microtask ticks until what the program returns is read.
TICKS = (
    "let ticks = 0;\n"
    "const tick = () => { ticks++; if (ticks < 20) Promise.resolve().then(tick) };\n"
    "Promise.resolve().then(tick);\n"
)

# Programs that cannot await, each with something an async function's settling would
# show: microtasks queued before the value or error is settled, timers, promises.
CANNOT_AWAIT = [
    "6",
    "'text'",
    "undefined",
    "let n = 1;\nPromise.resolve().then(() => { n = 2; console.log('micro', n) });\nn",
    "const o = { v: 1 };\nPromise.resolve().then(() => { o.v = 2 });\no",
    "const e = new Error('before');\nPromise.resolve().then(() => { e.message = 'after' });\n"
    "throw e",
    "Promise.resolve().then(() => { BigInt.prototype.toJSON = () => 'late' });\n5n",
    "setTimeout(() => console.log('timer'), 0);\nqueueMicrotask(() => console.log('micro'));\n1",
    "Promise.resolve(4)",
    "({ then(resolve) { resolve(7) } })",
    "Promise.reject(new RangeError('no'))",
    "function f() {\n  throw new TypeError('deep');\n}\nf()",
    "const x = ;",
    "return [1, { a: null }]",
    TICKS + "({ get t() { return ticks } })",
    TICKS + "Promise.resolve({ get t() { return ticks } })",
    TICKS + "({ then(resolve) { resolve({ get t() { return ticks } }) } })",
    TICKS + "const e = new Error();\n"
    "Object.defineProperty(e, 'message', { get() { return 'ticks ' + ticks } });\nthrow e",
]


@pytest.mark.parametrize("code", CANNOT_AWAIT)
async def test_a_program_that_cannot_await_runs_alike_as_a_plain_function(
    wasm_js: WasmJsExecutor, code: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = await run(wasm_js, code)
    monkeypatch.setattr(wasm_js_module, "may_await", lambda code: True)
    as_async = await run(wasm_js, code)
    for field in ("status", "result", "stdout", "stderr", "error"):
        assert getattr(plain, field) == getattr(as_async, field), (field, plain, as_async)


@pytest.mark.parametrize(
    ("code", "asynchronous"),
    [
        ("1 + 1", False),
        ("const v = await f();\nv", True),
        ("// no await here\n1", True),
        ("aw\\u0061it", True),
    ],
)
async def test_only_a_program_that_may_await_is_wrapped_as_an_async_function(
    wasm_js: WasmJsExecutor, code: str, asynchronous: bool
) -> None:
    request = json.loads(wasm_js.request_for(Job("ex_js", "javascript", code, Limits())))
    head = "(async function () {" if asynchronous else "(function () {"
    assert request["function"].startswith(head)
    assert request["asynchronous"] is asynchronous


async def test_syntax_errors_name_the_line(wasm_js: WasmJsExecutor) -> None:
    outcome = await run(wasm_js, "const a = 1;\nconst b = ;\n")
    assert outcome.status is Status.ERROR
    assert outcome.error is not None and outcome.error.type == "SyntaxError"
    assert "<program>:2:" in outcome.error.traceback


async def test_import_declarations_are_refused_with_the_way_out(wasm_js: WasmJsExecutor) -> None:
    outcome = await run(wasm_js, "import x from 'npm:left-pad';\nx('a', 3)")
    assert outcome.status is Status.ERROR
    assert outcome.error is not None and "executor 'deno'" in outcome.error.message


async def test_a_promise_that_never_settles_is_an_error(wasm_js: WasmJsExecutor) -> None:
    outcome = await run(wasm_js, "await new Promise(() => {});\n1")
    assert outcome.status is Status.ERROR
    assert outcome.error is not None and "never settled" in outcome.error.message


class CountingBridge(NoBridge):
    """Answers every tool call, counting them."""

    def __init__(self) -> None:
        self.calls = 0

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        self.calls += 1
        return {"value": None}


@pytest.mark.parametrize(
    "throws",
    [
        "const target = new EventTarget();\n"
        "target.addEventListener('go', () => { throw new RangeError('stop here') });\n"
        "target.dispatchEvent(new Event('go'));",
        "queueMicrotask(() => { throw new RangeError('stop here') });\nawait null;",
        "setTimeout(() => { throw new RangeError('stop here') }, 0);\n"
        "await new Promise((resolve) => setTimeout(resolve, 20));",
    ],
)
async def test_an_uncaught_error_stops_the_program_there(
    wasm_js: WasmJsExecutor, throws: str
) -> None:
    """As Deno stops it: nothing the program does after the error happens (a tool call
    made after it would otherwise still be made)."""
    bridge = CountingBridge()
    code = f"{throws}\nconsole.log('after');\nawait tools.ns.t({{}});\n'finished'"
    with trio.fail_after(WAIT_S):
        outcome = await wasm_js.run(Job("ex_js", "javascript", code, Limits()), bridge)
    assert (outcome.status, outcome.stdout, bridge.calls) == (Status.ERROR, "", 0), outcome
    assert outcome.error is not None
    assert (outcome.error.type, outcome.error.message) == ("RangeError", "stop here")
    assert "<program>:" in outcome.error.traceback


async def test_html_like_comments_of_a_script_leave_the_returned_value_alone(
    wasm_js: WasmJsExecutor,
) -> None:
    # The guest evaluates a script, where `<!--` comments out the rest of its line.
    outcome = await run(wasm_js, "var a = 3, c = 1\nc\n<!--a\na")
    assert (outcome.status, outcome.result) == (Status.OK, 3), outcome


async def test_no_state_survives_between_executions(wasm_js: WasmJsExecutor) -> None:
    first = await run(
        wasm_js, "globalThis.leak = 1;\nArray.prototype.leak = 2;\nJSON.parse = () => 3;\n1"
    )
    assert first.status is Status.OK
    second = await run(
        wasm_js, "[typeof globalThis.leak, [].leak === undefined, JSON.parse('[4]')[0]]"
    )
    assert second.result == ["undefined", True, 4]


async def test_a_program_replacing_json_cannot_change_its_report(wasm_js: WasmJsExecutor) -> None:
    outcome = await run(wasm_js, "JSON.stringify = () => 'forged';\n({ real: true })")
    assert outcome.result == {"real": True}


async def test_timeout_stops_an_infinite_loop_keeping_output(wasm_js: WasmJsExecutor) -> None:
    started = trio.current_time()
    # Long enough that the line (two writes) is out before the loop on a busy machine.
    outcome = await run(wasm_js, "console.log('spin');\nwhile (true) {}", timeout_ms=1000)
    assert outcome.status is Status.TIMEOUT
    assert outcome.stdout == "spin\n"
    assert trio.current_time() - started < WAIT_S


async def test_memory_limit(wasm_js: WasmJsExecutor) -> None:
    code = "const a = [];\nwhile (true) a.push(new Array(1e6).fill(1));"
    outcome = await run(wasm_js, code, memory_mb=64)
    assert outcome.status is Status.MEMORY_LIMIT, outcome
    assert (await run(wasm_js, "1")).status is Status.OK


async def test_output_flood_is_cut_at_the_budget(wasm_js: WasmJsExecutor) -> None:
    outcome = await run(wasm_js, "while (true) console.log('x'.repeat(99));", output_bytes=10_000)
    assert outcome.status is Status.OUTPUT_LIMIT
    assert outcome.truncated_stdout
    assert len(outcome.stdout) == 10_000 and outcome.stdout.startswith("x" * 99 + "\n")


async def test_result_larger_than_the_budget_is_refused(wasm_js: WasmJsExecutor) -> None:
    outcome = await run(wasm_js, "'y'.repeat(5000)", result_bytes=1000)
    assert outcome.status is Status.ERROR
    assert outcome.error is not None and outcome.error.type == "ResultTooLarge"


@pytest.mark.parametrize(
    ("code", "result"),
    [
        ("'a\\nb\\u2028c\\u0000'.repeat(2000)", "a\nb\u2028c\u0000" * 2000),
        ("'\\u00e9\\u{1F600}'.repeat(3000)", "\u00e9\U0001f600" * 3000),
        ("'\\ud800'.repeat(600)", "\ufffd" * 600),  # lone surrogates, replaced
        (
            "Array.from({ length: 500 }, (_, i) => ({ i, s: `v${i}` }))",
            [{"i": i, "s": f"v{i}"} for i in range(500)],
        ),
        ("await null;\n'z'.repeat(100_000)", "z" * 100_000),
    ],
    ids=["escapes", "non-ascii", "surrogates", "objects", "async"],
)
async def test_long_results_come_back_whole(
    wasm_js: WasmJsExecutor, code: str, result: Any
) -> None:
    # Past 512 characters the guest writes its answer on stdout (`answered` in
    # shims/wasm_js/guest.js): none of it may show as output, all of it as the result.
    outcome = await run(wasm_js, f"console.log('before');\n{code}")
    assert outcome.status is Status.OK, outcome
    assert outcome.result == result
    assert outcome.stdout == "before\n"


async def test_a_long_error_comes_back_whole(wasm_js: WasmJsExecutor) -> None:
    outcome = await run(wasm_js, "throw new Error('e'.repeat(5000))")
    assert outcome.status is Status.ERROR
    assert outcome.error is not None and outcome.error.message == "e" * 5000
    assert outcome.stdout == ""


async def test_job_stop_interrupts_the_guest(wasm_js: WasmJsExecutor) -> None:
    job = Job("ex_stop", "javascript", "while (true) {}", Limits(timeout_ms=20_000))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_set_later, job.stop)
        with trio.fail_after(5):
            outcome = await wasm_js.run(job, NoBridge())
    assert outcome.status is Status.CANCELLED


async def _set_later(event: StopSignal) -> None:
    await trio.sleep(0.2)
    event.set()


@pytest.mark.slow
async def test_fuel_stops_a_loop_deterministically(nursery: trio.Nursery, wasm_cache: Path) -> None:
    executor = WasmJsExecutor(cache_dir=wasm_cache, fuel=50_000_000)
    await nursery.start(executor.serve)
    # A fuel-counting engine compiles the component afresh: tens of seconds when busy.
    with trio.fail_after(LOAD_WAIT_S):
        assert await executor.wait_ready()
    spin = await run(executor, "while (true) {}", timeout_ms=20_000)
    assert spin.status is Status.TIMEOUT
    assert spin.error is not None and "instruction budget" in spin.error.message
    assert (await run(executor, "1 + 1")).result == 2


async def test_info_reports_the_component_and_its_build_inputs(wasm_js: WasmJsExecutor) -> None:
    info = wasm_js.info()
    assert info.available and info.reason is None
    assert info.version is not None and info.version.startswith("SpiderMonkey on wasmtime 50.")
    assert info.pool is not None
    assert len(info.pool["component_hash"]) == 64
    assert info.pool["compiled_cache"] == "hit"
    inputs = info.pool["build_inputs"]
    assert inputs["componentize-js"] == componentize_js_version() == "0.23.0"
    assert {"guest.js", "world.wit", "package-lock.json", "node"} <= set(inputs)


def test_the_component_is_built_once_and_then_reused(wasm_cache: Path) -> None:
    built = ensure_component(JS_GUEST, wasm_cache)
    assert not built.built
    assert built.path.parent.name == f"wasm-js-{built.inputs_hash[:16]}"


async def test_a_large_program_is_read_off_the_event_loop(
    wasm_js: WasmJsExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    readers: list[bool] = []
    request_for = wasm_js.request_for

    def recorded(job: Job) -> str:
        readers.append(threading.current_thread() is threading.main_thread())
        return request_for(job)

    monkeypatch.setattr(wasm_js, "request_for", recorded)
    small = "const xs = [1, 2, 3];\nxs.length"
    large = "let n = 0;\n" + "n += 1;\n" * 2_000 + "n"
    assert (await run(wasm_js, small)).result == 3
    assert (await run(wasm_js, large)).result == 2_000
    # The small one on the event loop's thread, the large one (a parse of its own) not.
    assert readers == [True, False]


async def test_the_executor_prepares_the_parse_its_lacks_check_made(
    wasm_js: WasmJsExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    parses = count_parses(monkeypatch)
    code = "const kind = typeof Intl;\nkind"
    syntax = SyntaxMemo()
    assert WasmJsExecutor.lacks(code, syntax) == "Deno's globals: Intl"
    job = Job("ex_js", "javascript", code, Limits(), syntax=syntax)
    with trio.fail_after(WAIT_S):
        outcome = await wasm_js.run(job, NoBridge())
    assert (outcome.status, outcome.result) == (Status.OK, "undefined")
    assert len(parses.made) == 1
