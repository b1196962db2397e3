"""Escape attempts against the wasm-js sandbox, with real Wasmtime and SpiderMonkey.

Each attempt is refused or stopped and reported, and the next execution still works.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from conduit.executors.base import Job, Limits, Outcome, Status
from conduit.executors.wasm_js import WasmJsExecutor
from tests.sandboxes import WAIT_S, NoBridge
from tests.security.test_wasm_python_sandbox import FORGED_HOST_CALLS


async def run(executor: WasmJsExecutor, code: str, **limits: Any) -> Outcome:
    with trio.fail_after(WAIT_S):
        job = Job("ex_attack", "javascript", code, Limits(**limits))
        outcome = await executor.run(job, NoBridge())
        after = await executor.run(Job("ex_next", "javascript", "1", Limits()), NoBridge())
        assert after.result == 1
    return outcome


async def test_no_host_runtime_is_reachable(wasm_js: WasmJsExecutor) -> None:
    code = """
[typeof Deno, typeof process, typeof require, typeof module, typeof Bun,
 typeof globalThis.hostCall, typeof WebAssembly, typeof Worker]
"""
    outcome = await run(wasm_js, code)
    assert outcome.result == ["undefined"] * 8, outcome


@pytest.mark.parametrize(
    "code",
    [
        "await import('fs')",
        "await import('node:child_process')",
        "await import('/etc/passwd')",
        "await import('file:///etc/passwd')",
        "await import('https://example.com/x.js')",
    ],
)
async def test_module_loading_is_refused(wasm_js: WasmJsExecutor, code: str) -> None:
    outcome = await run(wasm_js, code)
    assert outcome.status is Status.ERROR, outcome
    assert outcome.error is not None and "no module loader" in outcome.error.message


async def test_fetch_is_refused_without_reaching_anything(wasm_js: WasmJsExecutor) -> None:
    code = """
const refused = [];
for (const url of ["http://127.0.0.1:1/", "file:///etc/passwd", "http://169.254.169.254/"]) {
  try { await fetch(url); refused.push("reached " + url); } catch (e) { refused.push(e.name); }
}
refused
"""
    outcome = await run(wasm_js, code)
    assert outcome.result == ["TypeError"] * 3, outcome


async def test_code_built_from_strings_runs_in_the_same_sandbox(wasm_js: WasmJsExecutor) -> None:
    code = """
const viaFunction = Function("return typeof Deno + typeof process")();
const AsyncFunction = Object.getPrototypeOf(async () => {}).constructor;
const viaAsync = await AsyncFunction("return typeof require + typeof Bun")();
const viaEval = (0, eval)("typeof globalThis.hostCall");
({ viaFunction, viaAsync, viaEval })
"""
    outcome = await run(wasm_js, code)
    assert outcome.result == {
        "viaFunction": "undefinedundefined",
        "viaAsync": "undefinedundefined",
        "viaEval": "undefined",
    }


async def test_poisoned_prototypes_cannot_forge_the_report(wasm_js: WasmJsExecutor) -> None:
    # The shim captured what it reports with before the program ran.
    code = """
Object.prototype.toJSON = function () { return "poisoned"; };
String.prototype.split = () => ["poisoned"];
RegExp.prototype.exec = () => null;
JSON.stringify = () => '"forged"';
null.x
"""
    outcome = await run(wasm_js, code)
    assert outcome.status is Status.ERROR, outcome
    assert outcome.error is not None and outcome.error.type == "TypeError"
    assert "<program>:6:" in outcome.error.traceback


@pytest.mark.parametrize(
    ("code", "result"),
    [
        (
            'Promise.prototype.then = function (ok) { ok(\'{"result":"forged"}\') };\n({ a: 1 })',
            {"a": 1},
        ),
        ("Promise.prototype.then = function (ok) { ok(5) };\n({ a: 1 })", {"a": 1}),
        ('Promise.prototype.then = function (ok) { ok(\'{"result":"forged"}\') };\n1', 1),
        (
            'Promise.prototype.then = function (ok) { ok(\'{"result":"forged"}\') };\n'
            "await null;\n2",
            2,
        ),
    ],
)
async def test_a_replaced_promise_then_cannot_answer_for_the_guest(
    wasm_js: WasmJsExecutor, code: str, result: Any
) -> None:
    outcome = await run(wasm_js, code)
    assert (outcome.status, outcome.result) == (Status.OK, result), outcome


@pytest.mark.parametrize(
    ("code", "result"),
    [
        ("}); void ({", None),
        ("await null; }); void ({", None),
        ("}); var r = Proxy.revocable(function () {}, {}); r.revoke(); ((x) => r.proxy)({", None),
        ("}); new Proxy(function () { return 1 }, { getPrototypeOf() { throw new Error('t') }", 1),
    ],
)
async def test_closing_the_wrapper_early_is_only_the_programs_business(
    wasm_js: WasmJsExecutor, code: str, result: Any
) -> None:
    # What the wrapper evaluates to is then the program's: not a function (its
    # TypeError), or a callable proxy the guest must call without inspecting it.
    outcome = await run(wasm_js, code)
    if result is None:
        assert outcome.status is Status.ERROR, outcome
        assert outcome.error is not None and outcome.error.type == "TypeError"
    else:
        assert (outcome.status, outcome.result) == (Status.OK, result), outcome
    report = f"{outcome.stdout}{outcome.stderr}{outcome.error.traceback if outcome.error else ''}"
    assert "guest.js" not in report and "initializer" not in report


async def test_environment_is_empty(wasm_js: WasmJsExecutor) -> None:
    code = "[typeof process, typeof globalThis.Deno, typeof globalThis.env, typeof require]"
    outcome = await run(wasm_js, code)
    assert outcome.result == ["undefined"] * 4, outcome


@pytest.mark.parametrize(
    ("code", "limits", "status"),
    [
        ("while (true) {}", {"timeout_ms": 300}, Status.TIMEOUT),
        ("for (;;) { try { while (true) {} } catch {} }", {"timeout_ms": 300}, Status.TIMEOUT),
        (
            "const a = [];\nwhile (true) a.push(new Array(1e6).fill(1));",
            {"memory_mb": 48},
            Status.MEMORY_LIMIT,
        ),
        ("new ArrayBuffer(2 ** 30).byteLength", {"memory_mb": 48}, Status.MEMORY_LIMIT),
        (
            "while (true) console.log('x'.repeat(1000));",
            {"output_bytes": 50_000},
            Status.OUTPUT_LIMIT,
        ),
        ("while (true) console.error('e');", {"output_lines": 100}, Status.OUTPUT_LIMIT),
        (
            "const spin = () => Promise.resolve().then(spin);\nspin();",
            {"timeout_ms": 300},
            Status.TIMEOUT,
        ),
        (
            "setInterval(() => {}, 0);\nawait new Promise((r) => setTimeout(r, 1e9));",
            {"timeout_ms": 300},
            Status.TIMEOUT,
        ),
    ],
)
async def test_resource_attacks_are_stopped(
    wasm_js: WasmJsExecutor, code: str, limits: dict[str, int], status: Status
) -> None:
    outcome = await run(wasm_js, code, **limits)
    assert outcome.status is status, outcome


async def test_awaiting_a_timer_past_the_timeout_is_stopped_at_the_timeout(
    wasm_js: WasmJsExecutor,
) -> None:
    started = trio.current_time()
    code = "console.log('zz');\nawait new Promise((r) => setTimeout(r, 3000));"
    outcome = await run(wasm_js, code, timeout_ms=300)
    assert outcome.status is Status.TIMEOUT, outcome
    assert outcome.stdout == "zz\n"
    assert trio.current_time() - started < 1.5
    assert wasm_js.info().pool["lingering_threads"] == 0


@pytest.mark.parametrize(
    "code",
    [
        # AbortSignal.timeout sets a timer of its own: bounded as setTimeout is.
        "await new Promise((r) => { AbortSignal.timeout(2 ** 31 - 1).onabort = r; });",
        # The bound reads the clock the guest captured, not the one a program can swap.
        "performance.now = () => -1e12;\nsetTimeout(() => {}, 3000);\nawait new Promise(() => {});",
    ],
)
async def test_long_timers_leave_no_thread_behind(wasm_js: WasmJsExecutor, code: str) -> None:
    started = trio.current_time()
    outcome = await run(wasm_js, code, timeout_ms=300)
    assert outcome.status is Status.TIMEOUT, outcome
    assert trio.current_time() - started < 1.5
    assert wasm_js.info().pool["lingering_threads"] == 0


async def test_deep_recursion_is_an_error_not_a_crash(wasm_js: WasmJsExecutor) -> None:
    outcome = await run(wasm_js, "function f(n) { return f(n + 1) + 1; }\nf(0)")
    assert outcome.status is Status.ERROR, outcome
    assert outcome.error is not None and "too much recursion" in outcome.error.message


async def test_a_catch_all_cannot_swallow_the_timeout(wasm_js: WasmJsExecutor) -> None:
    code = "for (;;) { try { while (true) {} } catch (e) {} finally { continue; } }"
    outcome = await run(wasm_js, code, timeout_ms=300)
    assert outcome.status is Status.TIMEOUT


async def test_forged_host_calls_are_refused_by_the_session_token(
    start_daemon: Any, connect: Any
) -> None:
    """`import('host-call')` hands a program the raw import; the daemon still refuses."""
    _, info = await start_daemon()
    client = await connect(info)
    code = """
const { default: hostCall } = await import("host-call");
const call = (method, params) => JSON.parse(hostCall(method, JSON.stringify(params)));
return { answers: inputs.map(([method, params]) => call(method, params)),
         whoami: call("auth/whoami", {}) };
"""
    attempts = [[method, params] for method, params, _ in FORGED_HOST_CALLS]
    request = {"language": "javascript", "code": code, "inputs": attempts}
    result = await client.call("execute", request)
    assert (result["executor"], result["status"]) == ("wasm-js", "ok"), result
    answers = result["result"]["answers"]
    for (method, _, expected), answer in zip(FORGED_HOST_CALLS, answers, strict=True):
        assert answer.get("error", {}).get("code") == expected, (method, answer)
    assert result["result"]["whoami"]["result"]["principal"]["kind"] == "session"
    assert (await client.call("upstreams/list"))["upstreams"] == []
    again = await client.call("execute", {"language": "javascript", "code": "6 * 7"})
    assert again["result"] == 42
