"""Escape attempts against the wasm-js sandbox, with real Wasmtime and SpiderMonkey.

Each attempt is refused or stopped and reported, and the next execution still works.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import trio

from conduit.executors.base import Job, Limits, Outcome, Status
from conduit.executors.wasm_js import WasmJsExecutor
from tests.e2e.helpers import wait_upstreams
from tests.e2e.test_tools import ECHO
from tests.sandboxes import (
    FLOODS_OUTPUT,
    RUNS_OUT_OF_MEMORY,
    TIMES_OUT,
    WAIT_S,
    NoBridge,
)
from tests.security.test_wasm_python_sandbox import FORGED_HOST_CALLS

# Generous: the CI machine runs a CPU hog beside the suite. A guest left waiting on a
# timer it set (up to 2^31 ms) would take minutes, not this.
STOPPED_WITHIN_S = 5
REPLACEMENT = "\ufffd"


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
        ("while (true) {}", *TIMES_OUT),
        ("for (;;) { try { while (true) {} } catch {} }", *TIMES_OUT),
        ("const a = [];\nwhile (true) a.push(new Array(1e6).fill(1));", *RUNS_OUT_OF_MEMORY),
        ("new ArrayBuffer(2 ** 30).byteLength", *RUNS_OUT_OF_MEMORY),
        ("while (true) console.log('x'.repeat(1000));", *FLOODS_OUTPUT),
        ("while (true) console.error('e');", {"output_lines": 100}, Status.OUTPUT_LIMIT),
        ("const spin = () => Promise.resolve().then(spin);\nspin();", *TIMES_OUT),
        ("setInterval(() => {}, 0);\nawait new Promise((r) => setTimeout(r, 1e9));", *TIMES_OUT),
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
    # The guest's wait was cut to just past the timeout: its runner is back well before
    # the 3 s the program asked for, though on a loaded machine not always before the
    # outcome is (the count changes in the runner's thread).
    with trio.move_on_at(started + 2.5):
        while wasm_js.info().pool["lingering_threads"] != 0:
            await trio.sleep(0.02)
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
    request = {"language": "javascript", "executor": "wasm-js", "code": code, "inputs": attempts}
    result = await client.call("execute", request)
    assert (result["executor"], result["status"]) == ("wasm-js", "ok"), result
    answers = result["result"]["answers"]
    for (method, _, expected), answer in zip(FORGED_HOST_CALLS, answers, strict=True):
        assert answer.get("error", {}).get("code") == expected, (method, answer)
    assert result["result"]["whoami"]["result"]["principal"]["kind"] == "session"
    assert (await client.call("upstreams/list"))["upstreams"] == []
    again = await client.call("execute", {"language": "javascript", "code": "6 * 7"})
    assert again["result"] == 42


# -- reaching the host or the daemon from inside ---------------------------------------

# Names of the guest's own code: a program that could reach one of these functions (or
# read its source) could reach the raw host call or evaluate outside its wrapper.
GUEST_INTERNALS = ("hostCall", "host-call", "runProgram", "evaluate(", "userTraceback")


@pytest.mark.parametrize(
    ("code", "result"),
    [
        pytest.param(
            # Every global function's source: none closes over the guest's internals
            # under a name that gives it away (the wrappers name only what they call).
            """
const suspicious = /hostCall|host-call|runProgram|evaluate\\(|request\\(/;
Object.getOwnPropertyNames(globalThis).filter((name) => {
  const value = globalThis[name];
  return typeof value === "function" && suspicious.test(Function.prototype.toString.call(value));
})
""",
            [],
            id="globalThis-walk-for-guest-functions",
        ),
        pytest.param(
            # Two levels deep through every global object and prototype, by descriptor
            # (a getter is looked at, not called): no value, getter or setter is a
            # function of the guest's (it would be reachable, callable).
            """
const seen = new Set();
const found = [];
const guestName = /^(hostCall|runProgram|settle|report|request|evaluate|run)$/;
const walk = (value, path, depth) => {
  if (depth > 2 || value === null || seen.has(value)) return;
  if (typeof value !== "object" && typeof value !== "function") return;
  seen.add(value);
  for (const key of Reflect.ownKeys(value)) {
    const { value: inner, get, set } = Object.getOwnPropertyDescriptor(value, key);
    for (const f of [inner, get, set]) {
      if (typeof f === "function" && guestName.test(f.name)) found.push(`${path}.${String(key)}`);
    }
    walk(inner, `${path}.${String(key)}`, depth + 1);
  }
};
walk(globalThis, "globalThis", 0);
found
""",
            [],
            id="deep-globalThis-walk-for-guest-functions",
        ),
        pytest.param(
            # SpiderMonkey's shell functions would open files and new compartments.
            "[typeof newGlobal, typeof evalcx, typeof read, typeof snarf, typeof os,\n"
            " typeof quit, typeof gc, typeof putstr, typeof Components, typeof print]",
            ["undefined"] * 10,
            id="spidermonkey-shell-functions",
        ),
        pytest.param(
            # No Atomics.wait to block the thread past the deadline, no WebAssembly to
            # compile with, no shared memory for a second agent.
            "[typeof WebAssembly, typeof SharedArrayBuffer, typeof Atomics, typeof Worker,\n"
            " typeof ShadowRealm, typeof WebSocket, typeof caches]",
            ["undefined"] * 7,
            id="webassembly-atomics-sharedarraybuffer",
        ),
        pytest.param(
            # Strict module code ends the chain: from the program's wrapper, `caller`
            # is null, so the walk never reaches runProgram or run. (The program is
            # strict itself, so it walks from sloppy code it makes.)
            """
const walk = new Function(`
  const sources = [];
  (function probe() {
    for (let f = arguments.callee, n = 0; f && n < 10; f = f.caller, n++) {
      sources.push(Function.prototype.toString.call(f));
    }
  })();
  return sources;`);
const sources = walk();
[sources.length, sources.join("\\n")]
""",
            None,
            id="arguments-callee-caller-chain",
        ),
        pytest.param(
            "await null;\n"
            "const probe = new Function(\n"
            "  'const f = arguments.callee; return [f.caller, f.caller]');\n"
            "probe()",
            [None, None],
            id="caller-after-await",
        ),
        pytest.param(
            # The whole global: `tools` and `ToolError` cannot be swapped for a program's
            # own (a later program is fresh anyway; this one keeps its real SDK).
            "new Function('tools = 1; globalThis.ToolError = 2; delete globalThis.tools')();\n"
            "[typeof tools, typeof ToolError]",
            ["object", "function"],
            id="replace-or-delete-the-sdk",
        ),
        pytest.param(
            # The SDK's proxies hand out nothing but closures over `call`.
            "[Object.getPrototypeOf(tools), Reflect.ownKeys(tools).length,\n"
            " typeof tools.then, typeof tools.x.then, Object.getPrototypeOf(tools.x)]",
            [None, 0, "undefined", "undefined", None],
            id="sdk-proxy-introspection",
        ),
        pytest.param(
            # A string is not code to setTimeout here: there is no second way to eval.
            "let refused;\n"
            "try { setTimeout('globalThis.x = 1', 0); } catch (e) { refused = e.name; }\n"
            "[refused, typeof x]",
            ["TypeError", "undefined"],
            id="settimeout-with-a-string",
        ),
    ],
)
async def test_nothing_of_the_host_or_guest_is_reachable(
    wasm_js: WasmJsExecutor, code: str, result: Any
) -> None:
    outcome = await run(wasm_js, code)
    assert outcome.status is Status.OK, outcome
    if result is None:  # the caller chain: the program's frames and its wrapper only
        count, sources = outcome.result
        assert count <= 3, sources
        assert not any(name in sources for name in GUEST_INTERNALS), sources
    else:
        assert outcome.result == result


@pytest.mark.parametrize(
    "code",
    [
        pytest.param("new Error().stack", id="error-stack"),
        pytest.param("await null;\nnew Error().stack", id="error-stack-after-await"),
        pytest.param(
            "const o = {};\nError.captureStackTrace(o);\no.stack", id="capture-stack-trace"
        ),
        pytest.param(
            # V8's hook: SpiderMonkey ignores it, so no CallSite (with getFileName,
            # getFunction, getThis) is ever handed to the program.
            "Error.prepareStackTrace = (e, frames) => frames.map((f) => f.getFunction());\n"
            "new Error().stack",
            id="prepare-stack-trace",
        ),
        pytest.param(
            "let stack;\ntry { null.x; } catch (e) { stack = String(e.stack); }\nstack",
            id="caught-error-stack",
        ),
    ],
)
async def test_a_stack_names_only_the_programs_own_frames(
    wasm_js: WasmJsExecutor, code: str
) -> None:
    # A program may read its own stack: as on Deno, its name and message, then the
    # program's frames, never the guest's files, the path componentize-js built them
    # in, or anything of the daemon's.
    outcome = await run(wasm_js, code)
    assert outcome.status is Status.OK and isinstance(outcome.result, str), outcome
    header, *frames = outcome.result.split("\n")
    assert header == "Error" or header.startswith("TypeError: "), outcome.result
    assert frames, outcome.result
    for frame in frames:
        assert re.fullmatch(r"    at (\w+ \()?<program>:\d+:\d+\)?", frame), outcome.result
    assert str(wasm_js._cache_dir) not in outcome.result
    assert "conduit" not in outcome.result.lower()


@pytest.mark.parametrize(
    ("code", "message"),
    [
        pytest.param("import.meta", "import.meta may only appear in a module", id="import-meta"),
        pytest.param("typeof import.meta.url", "import.meta", id="import-meta-url"),
        pytest.param("await import('./guest.js')", "no module loader", id="import-guest-js"),
        pytest.param(
            "await import('./sandbox_sdk.js')", "no module loader", id="import-sandbox-sdk"
        ),
        pytest.param(
            "await import('data:text/javascript,export default 1')",
            "no module loader",
            id="import-data-url",
        ),
        pytest.param(
            "await import('fs', { with: { type: 'json' } })",
            "no module loader",
            id="import-with-attributes",
        ),
        pytest.param("await import(`./${'guest'}.js`)", "no module loader", id="import-template"),
        pytest.param("await eval(\"import('fs')\")", "no module loader", id="import-in-eval"),
        pytest.param(
            "await Function(\"return import('./guest.js')\")()",
            "no module loader",
            id="import-in-function",
        ),
        pytest.param(
            "await (0, eval)(\"import('node:fs')\")", "no module loader", id="import-indirect-eval"
        ),
    ],
)
async def test_import_variants_find_no_module(
    wasm_js: WasmJsExecutor, code: str, message: str
) -> None:
    # `import('host-call')` alone resolves (the raw host import, refused by the
    # daemon: see the last test); every other specifier ends the program.
    outcome = await run(wasm_js, code)
    assert outcome.status is Status.ERROR, outcome
    assert outcome.error is not None and message in outcome.error.message


# -- forging the result or the report --------------------------------------------------


@pytest.mark.parametrize(
    ("code", "result"),
    [
        pytest.param(
            "JSON.stringify = () => '{\"forged\":1}';\nJSON.parse = () => ({ forged: 1 });\n"
            "({ real: 1 })",
            {"real": 1},
            id="replace-JSON",
        ),
        pytest.param(
            "Promise = function () { throw 1; };\nPromise.resolve = () => 1;\n({ real: 2 })",
            {"real": 2},
            id="replace-Promise",
        ),
        pytest.param(
            "await null;\nPromise = function () { throw 1; };\n({ real: 3 })",
            {"real": 3},
            id="replace-Promise-after-await",
        ),
        pytest.param(
            "Object.prototype.then = (ok) => ok('forged');\nawait null;\n2",
            2,
            id="object-prototype-then-on-a-primitive",
        ),
        pytest.param(
            "Object.defineProperty(Promise, Symbol.species, { get() { throw 1; } });\n"
            "await null;\n({ real: 5 })",
            {"real": 5},
            id="promise-species",
        ),
        pytest.param(
            "Object.defineProperty(Promise, Symbol.species, { get() { throw 1; } });\n"
            "queueMicrotask(() => {});\n6",
            6,
            id="promise-species-with-a-microtask",
        ),
        pytest.param(
            "Array.prototype[Symbol.iterator] = function* () { yield 'forged'; };\n[1, 2]",
            [1, 2],
            id="array-iterator",
        ),
        pytest.param(
            'Function.prototype.call = () => \'{"result":"forged"}\';\n'
            "Function.prototype.apply = Function.prototype.bind = () => 'forged';\n"
            "Object.defineProperty = Reflect.defineProperty = () => { throw 1; };\n"
            "await null;\n({ real: 4 })",
            {"real": 4},
            id="function-call-apply-bind-defineProperty",
        ),
        pytest.param(
            "String.prototype.toString = String.prototype.valueOf = () => 'forged';\n"
            "Symbol.prototype.toString = () => 'forged';\n'real'",
            "real",
            id="string-and-symbol-prototypes",
        ),
        pytest.param(
            # What JSON cannot encode is sent as String(value), as on Deno; a getter
            # that throws is the program's own failure to serialise.
            "({ get x() { throw new Error('getter'); } })",
            "[object Object]",
            id="getter-that-throws",
        ),
        pytest.param(
            "({ toJSON() { throw 1; }, [Symbol.toPrimitive]() { throw 2; } })",
            "[result could not be converted to a string]",
            id="toJSON-and-toPrimitive-throw",
        ),
        pytest.param(
            "let a = [];\nfor (let i = 0; i < 1e5; i++) a = [a];\na",
            "[result could not be converted to a string]",
            id="too-deep-to-stringify",
        ),
        pytest.param("'\\ud800'", REPLACEMENT, id="lone-surrogate-result"),
        pytest.param(
            "({ ['\\udc00k']: ['\\ud800', 'ok'] })",
            {f"{REPLACEMENT}k": [REPLACEMENT, "ok"]},
            id="lone-surrogate-key",
        ),
    ],
)
async def test_poisoned_built_ins_cannot_forge_the_result(
    wasm_js: WasmJsExecutor, code: str, result: Any
) -> None:
    outcome = await run(wasm_js, code)
    assert (outcome.status, outcome.result) == (Status.OK, result), outcome


@pytest.mark.parametrize(
    ("code", "error_type", "message", "traceback"),
    [
        pytest.param(
            # The report's frames are a string the guest builds: an accessor planted
            # on Array.prototype's indices is never consulted (it used to replace the
            # whole traceback, or run inside the report).
            "Object.defineProperty(Array.prototype, 0, {\n"
            "  get() { return 'forged frame'; }, set() {}, configurable: true });\n"
            "function f() { null.x; }\nf()",
            "TypeError",
            'can\'t access property "x" of null',
            "    at f (<program>:3:16)\n    at <program>:4:1",
            id="array-index-accessors",
        ),
        pytest.param(
            "Object.defineProperty(Array.prototype, 1, {\n"
            "  get() { for (;;) {} }, set() {}, configurable: true });\nnull.x",
            "TypeError",
            'can\'t access property "x" of null',
            "    at <program>:3:1",
            id="array-index-getter-that-loops",
        ),
        pytest.param(
            "Object.defineProperty(Object.prototype, 'traceback', {\n"
            "  get() { return 'forged'; }, set() { throw 1; }, configurable: true });\n"
            "Error.prototype.toString = () => 'forged';\nnull.x",
            "TypeError",
            'can\'t access property "x" of null',
            "    at <program>:4:1",
            id="object-prototype-traceback-setter",
        ),
        pytest.param(
            "Array.prototype.push = Array.prototype.join = () => { throw 1; };\n"
            "String.prototype.split = RegExp.prototype.exec = () => { throw 2; };\nnull.x",
            "TypeError",
            'can\'t access property "x" of null',
            "    at <program>:3:1",
            id="array-string-regexp-methods",
        ),
        pytest.param(
            # The report reads a class's name as data: a getter is never run by it (and
            # the class's frame, whose name it cannot read, stays).
            "class E extends Error { static get name() { throw 1; } }\nthrow new E('m');",
            "Error",
            "m",
            "    at E (<program>:1:1)\n    at <program>:2:7",
            id="class-name-getter-that-throws",
        ),
        pytest.param(
            "throw { get name() { throw 1; }, message: 'm' };",
            "Error",
            "the error could not be described",
            "",
            id="name-getter-that-throws",
        ),
        pytest.param(
            "const r = Proxy.revocable({}, {});\nr.revoke();\nthrow r.proxy;",
            "Error",
            "the error could not be described",
            "",
            id="throw-a-revoked-proxy",
        ),
        pytest.param(
            "throw { [Symbol.toPrimitive]() { throw 1; } };",
            "Error",
            "",
            "",
            id="throw-toPrimitive",
        ),
        pytest.param("throw Symbol('s');", "Error", "Symbol(s)", "", id="throw-a-symbol"),
        pytest.param(
            "throw new Error('\\ud800 lone');",
            "Error",
            f"{REPLACEMENT} lone",
            "    at <program>:1:7",
            id="lone-surrogate-in-message",
        ),
        pytest.param(
            "const e = new RangeError('m');\ne.name = '\\udfff';\nthrow e;",
            REPLACEMENT,
            "m",
            "    at <program>:1:11",
            id="lone-surrogate-in-name",
        ),
        pytest.param(
            # A thenable that never settles: the event loop runs dry, said plainly.
            "({ then() {} })",
            "Error",
            "never settled",
            "",
            id="thenable-that-never-settles",
        ),
        pytest.param(
            # The value's `then` is read when the program's promise resolves with it,
            # as on Deno: a trap that throws is the program's error.
            "new Proxy({}, { get() { throw new RangeError('trap'); } })",
            "RangeError",
            "trap",
            "    at get (<program>:1:31)",
            id="returned-proxy-with-throwing-traps",
        ),
    ],
)
async def test_the_error_report_cannot_be_forged(
    wasm_js: WasmJsExecutor, code: str, error_type: str, message: str, traceback: str
) -> None:
    outcome = await run(wasm_js, code, timeout_ms=2000)
    assert outcome.status is Status.ERROR, outcome
    assert outcome.error is not None
    assert (outcome.error.type, outcome.error.traceback) == (error_type, traceback), outcome.error
    assert message in outcome.error.message


async def test_a_crash_in_the_runtime_stays_in_its_instance(wasm_js: WasmJsExecutor) -> None:
    # StarlingMonkey's URL getters do not check their receiver: read on the prototype,
    # one reaches wasm's `unreachable`. Only that instance ends, reported as a crash.
    outcome = await run(wasm_js, "console.log('before');\nURL.prototype.protocol")
    assert outcome.status is Status.CRASHED, outcome
    assert outcome.stdout == "before\n"


# SpiderMonkey reports its own exhaustion as the text "out of memory", which a program
# can also throw or print: the claim is taken as it is. It labels only the program's own
# execution, which could as well have allocated until the limit was real.
@pytest.mark.parametrize(
    "code",
    [
        pytest.param("throw 'out of memory';", id="throw-the-oom-string"),
        pytest.param("throw new Error('out of memory');", id="throw-an-oom-error"),
        pytest.param(
            "console.error('out of memory');\nawait new Promise(() => {});", id="oom-text-then-trap"
        ),
    ],
)
async def test_a_program_that_claims_the_memory_limit_labels_only_itself(
    wasm_js: WasmJsExecutor, code: str
) -> None:
    outcome = await run(wasm_js, code, memory_mb=48)
    assert outcome.status is Status.MEMORY_LIMIT, outcome  # `run` checks the next one


# -- resources ---------------------------------------------------------------------------

SMALL_MEMORY = {"memory_mb": 48, "timeout_ms": 5000}
SHORT = {"timeout_ms": 300}


def _bomb(code: str, name: str) -> Any:
    """A row for a program that allocates until SMALL_MEMORY stops it."""
    return pytest.param(code, SMALL_MEMORY, Status.MEMORY_LIMIT, id=name)


def _gc_bomb(code: str, name: str) -> Any:
    """A row for a program whose garbage collection finds no memory for a new chunk:
    SpiderMonkey aborts (a trap) where no error can be thrown."""
    return pytest.param(code, {**SMALL_MEMORY, "memory_mb": 24}, Status.MEMORY_LIMIT, id=name)


def _spin(code: str, name: str) -> Any:
    """A row for a program that computes until the SHORT timeout stops it."""
    return pytest.param(code, SHORT, Status.TIMEOUT, id=name)


@pytest.mark.parametrize(
    ("code", "limits", "status"),
    [
        _bomb("const m = new Map();\nfor (let i = 0; ; i++) m.set(i, { i });", "map-bomb"),
        _bomb("const a = [];\nfor (;;) a.push(a.length);", "array-push-bomb"),
        _bomb("new Array(2 ** 32 - 1).fill(0).length", "array-fill"),
        _bomb("Array(1e5).fill('x'.repeat(1000)).join('').length", "string-join-bomb"),
        _gc_bomb("const m = new Map();\nfor (let i = 0; ; i++) m.set('k' + i, { i });", "gc-map"),
        _gc_bomb("const a = [];\nfor (;;) a.push('x'.repeat(1000) + a.length);", "gc-strings"),
        _gc_bomb("JSON.stringify(Array.from({ length: 1e6 }, (_, i) => ({ i })))", "gc-stringify"),
        pytest.param(
            # SpiderMonkey refuses a string past its length limit before any memory.
            "let s = 'x';\nwhile (true) s += s;",
            SMALL_MEMORY,
            Status.ERROR,
            id="string-doubling",
        ),
        _spin("/^(a+)+$/.test('a'.repeat(40) + '!')", "redos-nested-plus"),
        _spin("/(x+x+)+y/.test('x'.repeat(5000))", "redos-overlapping"),
        # Catching "too much recursion" to recurse again makes it exponential.
        _spin(
            "function f(n) { try { return f(n + 1); } catch { return f(n + 1); } }\nf(0)",
            "recursion-that-catches-its-overflow",
        ),
        _spin("({ get x() { for (;;) {} } })", "result-getter-that-loops"),
        _spin("throw { get name() { for (;;) {} } };", "error-getter-loops"),
        # Program code running in the guest's own timer bound (its delay's valueOf).
        _spin(
            "await new Promise((r) => setTimeout(r, { valueOf() { for (;;) {} } }));",
            "timer-delay-valueOf-loops",
        ),
        _spin("[...'x'.repeat(2000)].sort(() => { for (;;) {} })", "sort-comparator-loops"),
    ],
)
async def test_resource_bombs_are_stopped(
    wasm_js: WasmJsExecutor, code: str, limits: dict[str, int], status: Status
) -> None:
    outcome = await run(wasm_js, code, **limits)
    assert outcome.status is status, outcome
    # Nor is what the engine writes as it aborts (naming where it was built) the program's.
    assert "MOZ_CRASH" not in outcome.stderr


@pytest.mark.parametrize(
    ("code", "limits"),
    [
        pytest.param("'x'.repeat(2000)", {"result_bytes": 1000}, id="one-long-string"),
        pytest.param(
            "Array.from({ length: 300 }, () => 'yyyy')", {"result_bytes": 1000}, id="many-items"
        ),
        pytest.param("'\\u00e9'.repeat(600)", {"result_bytes": 1000}, id="bytes-not-characters"),
    ],
)
async def test_a_result_past_result_bytes_is_refused(
    wasm_js: WasmJsExecutor, code: str, limits: dict[str, int]
) -> None:
    outcome = await run(wasm_js, code, **limits)
    assert outcome.status is Status.ERROR and outcome.result is None, outcome
    assert outcome.error is not None and outcome.error.type == "ResultTooLarge"


@pytest.mark.parametrize(
    ("code", "limits", "stdout_bytes", "stdout_lines"),
    [
        pytest.param(
            "console.log('z'.repeat(10_000_000));",
            {"output_bytes": 50_000},
            50_000,
            None,
            id="one-giant-write",
        ),
        pytest.param(
            "for (let i = 0; i < 1e7; i++) console.log('');",
            {"output_lines": 100},
            None,
            100,
            id="many-empty-lines",
        ),
        pytest.param(
            "for (;;) { console.log('a'); console.error('b'); }",
            {"output_bytes": 1000},
            None,
            None,
            id="tiny-writes-on-both-streams",
        ),
    ],
)
async def test_output_floods_stop_at_the_budget(
    wasm_js: WasmJsExecutor,
    code: str,
    limits: dict[str, int],
    stdout_bytes: int | None,
    stdout_lines: int | None,
) -> None:
    outcome = await run(wasm_js, code, timeout_ms=5000, **limits)
    assert outcome.status is Status.OUTPUT_LIMIT, outcome
    kept = outcome.stdout.encode() + outcome.stderr.encode()
    if stdout_bytes is not None:
        assert len(outcome.stdout.encode()) == stdout_bytes
    if stdout_lines is not None:
        assert outcome.stdout.count("\n") == stdout_lines
    assert len(kept) <= limits.get("output_bytes", Limits().output_bytes)


@pytest.mark.parametrize(
    "code",
    [
        pytest.param("await new Promise((r) => setTimeout(r, 1e12));", id="settimeout-1e12"),
        pytest.param(
            "await new Promise((r) => setTimeout(r, Infinity));", id="settimeout-infinity"
        ),
        pytest.param("await new Promise((r) => setTimeout(r, '1e9'));", id="settimeout-string"),
        pytest.param(
            "await new Promise((r) => setTimeout(r, { valueOf: () => 1e9 }));",
            id="settimeout-valueOf",
        ),
        pytest.param("await new Promise((r) => setInterval(r, 1e10));", id="setinterval-1e10"),
        pytest.param(
            "await new Promise((r) => AbortSignal.timeout(1e10).addEventListener('abort', r));",
            id="abortsignal-timeout-1e10",
        ),
        pytest.param(
            "const tick = () => setTimeout(tick, 0);\ntick();\nawait new Promise(() => {});",
            id="settimeout-chain",
        ),
        pytest.param(
            "const tick = () => queueMicrotask(tick);\ntick();", id="queuemicrotask-chain"
        ),
        pytest.param(
            "for (let i = 0; ; i++) await new Promise((r) => setTimeout(r, 1));",
            id="await-many-short-timers",
        ),
    ],
)
async def test_timer_attacks_end_at_the_timeout(wasm_js: WasmJsExecutor, code: str) -> None:
    started = trio.current_time()
    outcome = await run(wasm_js, code, **SHORT)
    assert outcome.status is Status.TIMEOUT, outcome
    assert trio.current_time() - started < STOPPED_WITHIN_S
    # A guest stopped inside a millisecond's sleep comes back when it ends, which on a
    # loaded machine can be after the execution was reported: soon, and never later.
    with trio.fail_after(STOPPED_WITHIN_S):
        while wasm_js.info().pool["lingering_threads"]:
            await trio.sleep(0.01)


# -- state between executions ------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "probe", "result"),
    [
        pytest.param(
            "globalThis.leak = 'LEAK';\nvar leaked = 1;\n1",
            "[typeof leak, typeof leaked]",
            ["undefined", "undefined"],
            id="globals",
        ),
        pytest.param(
            "Object.prototype.polluted = 1;\nArray.prototype.push = null;\n"
            "JSON.stringify = () => 'x';\n1",
            "[({}).polluted, typeof [].push, JSON.stringify([1])]",
            [None, "function", "[1]"],
            id="prototypes-and-JSON",
        ),
        pytest.param(
            "setTimeout(() => console.log('LATE'), 0);\n"
            "setInterval(() => console.log('LATE'), 1);\n"
            "Promise.reject(new Error('LATE'));\n1",
            "await new Promise((r) => setTimeout(r, 20));\n'quiet'",
            "quiet",
            id="pending-timers-and-rejections",
        ),
        pytest.param(
            "globalThis.inputs = ['LEAK'];\n1",
            "inputs",
            None,
            id="inputs",
        ),
    ],
)
async def test_nothing_survives_into_the_next_execution(
    wasm_js: WasmJsExecutor, first: str, probe: str, result: Any
) -> None:
    await run(wasm_js, first)
    outcome = await run(wasm_js, probe)
    assert (outcome.status, outcome.result) == (Status.OK, result), outcome
    assert "LATE" not in outcome.stdout + outcome.stderr


@pytest.mark.parametrize(
    "code",
    [
        pytest.param("[Math.random(), Math.random()]", id="math-random"),
        pytest.param(
            "Array.from(crypto.getRandomValues(new Uint32Array(4)))", id="getrandomvalues"
        ),
        pytest.param("crypto.randomUUID()", id="randomuuid"),
    ],
)
async def test_fresh_instances_do_not_share_a_random_seed(
    wasm_js: WasmJsExecutor, code: str
) -> None:
    # Every instance starts from one pre-initialised snapshot: a seed taken at build
    # time would make two programs (two tenants) draw the same numbers.
    first = await run(wasm_js, code)
    second = await run(wasm_js, code)
    assert first.status is Status.OK and second.status is Status.OK
    assert first.result != second.result


async def test_lone_surrogates_on_the_output_streams(wasm_js: WasmJsExecutor) -> None:
    outcome = await run(wasm_js, "console.log('a\\ud800b');\nconsole.error('\\udc00');\n1")
    assert (outcome.status, outcome.result) == (Status.OK, 1), outcome
    assert (outcome.stdout, outcome.stderr) == (f"a{REPLACEMENT}b\n", f"{REPLACEMENT}\n")


# -- tool calls through a real daemon ----------------------------------------------------

# The row whose program ends in its own error.
THROWN = "thrown"
# Each program catches what its calls throw and returns it; the daemon must answer every
# call, stay up, and reply with JSON that holds no lone surrogate.
TOOL_ABUSE = [
    pytest.param(
        """
const names = [["../../etc", "passwd"], ["echo", "echo\\u0000"], ["", ""], ["echo", "\\ud800"],
               ["__proto__", "constructor"], ["x".repeat(100000), "y"], ["echo", "echo/../add"]];
const caught = [];
for (const [ns, fn] of names) {
  try { await tools[ns][fn]({ text: "t" }); caught.push("called"); }
  catch (e) { caught.push(e instanceof ToolError && typeof e.code === "number"); }
}
caught
""",
        [True] * 7,
        id="hostile-tool-names",
    ),
    pytest.param(
        """
const cycle = {}; cycle.self = cycle;
let deep = {}; for (let i = 0; i < 10000; i++) deep = { deep };
const attempts = ["text", [1, 2], 42, cycle, { text: 1n }, deep,
                  { text: "x", __proto__: { text: "inherited" } }, { ["\\ud800"]: "\\udc00" }];
const seen = [];
for (const args of attempts) {
  try { seen.push(typeof (await tools.echo.echo(args))); }
  catch (e) { seen.push(e.name); }
}
seen
""",
        None,
        id="hostile-tool-arguments",
    ),
    pytest.param(
        """
const { default: hostCall } = await import("host-call");
[hostCall("tools/call", "{"), hostCall("tools/call", "[]"), hostCall("\\ud800", "{}"),
 hostCall("tools/call", '{"name": {"$ne": 1}}'), hostCall("tools/call", "1e999999"),
 hostCall("tools/call", '{"name": "echo.echo", "arguments": {"text": "' + "z".repeat(1e6) + '"}}')]
  .map((answer) => JSON.parse(answer).error?.code ?? "result")
""",
        [-32700, -32602, -32601, -32602, -32602, "result"],
        id="raw-host-call-garbage",
    ),
    pytest.param(
        """
const echoed = await tools.echo.echo({ text: "a\\ud800b" });
console.log("out \\ud800");
console.error("err \\udfff");
return { echoed, own: "\\udc00" };
""",
        {"echoed": f"a{REPLACEMENT}b", "own": REPLACEMENT},
        id="lone-surrogates-through-a-tool-and-the-result",
    ),
    pytest.param(
        "await tools.echo.echo({ text: 'x' });\nthrow new TypeError('bad \\ud800');",
        THROWN,
        id="lone-surrogate-in-a-thrown-error",
    ),
]


@pytest.mark.parametrize(("code", "result"), TOOL_ABUSE)
async def test_tool_call_abuse_leaves_the_daemon_serving(
    start_daemon: Any, connect: Any, code: str, result: Any
) -> None:
    server, info = await start_daemon(upstreams=[ECHO])
    await wait_upstreams(server, "echo")
    client = await connect(info)
    request = {"language": "javascript", "executor": "wasm-js", "code": code}
    reply = await client.call("execute", request)
    assert reply["executor"] == "wasm-js", reply
    # Valid JSON both ways: whatever a lone surrogate became, it is text again.
    json.dumps(reply, ensure_ascii=False).encode("utf-8")
    if result is THROWN:
        assert reply["status"] == "error", reply
        assert (reply["error"]["type"], reply["error"]["message"]) == (
            "TypeError",
            f"bad {REPLACEMENT}",
        )
    else:
        assert reply["status"] == "ok", reply
    if result not in (None, THROWN):
        assert reply["result"] == result
    if "console" in code:
        assert (reply["stdout"], reply["stderr"]) == (
            f"out {REPLACEMENT}\n",
            f"err {REPLACEMENT}\n",
        )
    again = await client.call(
        "execute", {"language": "javascript", "code": "await tools.echo.echo({ text: 'after' })"}
    )
    assert (again["status"], again["result"]) == ("ok", "after"), again
    assert (await client.call("ping")) is not None
