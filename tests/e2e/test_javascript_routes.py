"""JavaScript that uses what wasm-js lacks runs where it works, and the result says
where.

wasm-js, the default for JavaScript, has no ICU (componentize-js's SpiderMonkey is built
without it), no module loader, and not what Deno adds to the globals and the built-ins:
with no executor named, a program using `Intl`, a locale-taking method, `normalize`, a
Unicode property escape, `Buffer` or an import runs on `deno`; named, wasm-js runs it as
it is. What both run, they answer alike: a date as text names its time zone the same.
Real Deno and the real component.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conduit.executors.wasm_js import NEVER_SETTLED
from tests.e2e.helpers import execute

FORMATS = """
const number = new Intl.NumberFormat("de-DE", { style: "currency", currency: "EUR" });
const date = new Intl.DateTimeFormat("en-GB", {
  timeZone: "Asia/Tokyo", dateStyle: "long", timeStyle: "short",
});
const sorted = ["z", "ä", "a"].sort(new Intl.Collator("de").compare);
({
  number: number.format(1234.5),
  date: date.format(new Date(0)),
  sorted,
  grouped: (1234567.891).toLocaleString("en-US"),
})
"""


async def test_a_program_using_intl_runs_on_deno_and_says_so(client: Any) -> None:
    result = await execute(client, FORMATS, language="javascript")
    assert (result["status"], result["executor"]) == ("ok", "deno"), result
    assert result["result"] == {
        "number": "1.234,50\u00a0€",
        "date": "1 January 1970 at 09:00",
        "sorted": ["a", "ä", "z"],
        "grouped": "1,234,567.891",
    }
    plain = await execute(client, "[3, 1, 2].sort()", language="javascript")
    assert (plain["executor"], plain["result"]) == ("wasm-js", [1, 2, 3])


async def test_named_wasm_js_runs_it_as_it_is(client: Any) -> None:
    result = await execute(client, FORMATS, language="javascript", executor="wasm-js")
    assert (result["status"], result["executor"]) == ("error", "wasm-js"), result
    assert result["error"]["type"] == "ReferenceError"
    assert "Intl" in result["error"]["message"]


async def test_without_deno_wasm_js_runs_it(start_daemon: Any, connect: Any) -> None:
    _, info = await start_daemon(executors={"deno": {"enabled": False}})
    client = await connect(info)
    result = await execute(client, "typeof Intl", language="javascript")
    assert (result["status"], result["executor"], result["result"]) == (
        "ok",
        "wasm-js",
        "undefined",
    )


# Programs a model writes that wasm-js would fail or answer otherwise, with Deno's answer.
ON_DENO = {
    "accents stripped": (
        'const slug = (s) => s.normalize("NFD").replace(/[\\u0300-\\u036f]/g, "");\n'
        'slug("Crème brûlée")',
        "Creme brulee",
    ),
    "words of any script": ('"naïve café, Ωμέγα".match(/\\p{L}+/gu)', ["naïve", "café", "Ωμέγα"]),
    "base64 with Buffer": ('Buffer.from("hi there").toString("base64")', "aGkgdGhlcmU="),
    "a module of Deno's": ('import { basename } from "node:path";\nbasename("/a/b.txt")', "b.txt"),
    "a link checked": (
        '[URL.canParse("https://a.example/x"), URL.canParse("nope")]',
        [True, False],
    ),
    "a key made and used": (
        'const key = await crypto.subtle.generateKey({ name: "AES-GCM", length: 256 }, true,\n'
        '  ["encrypt", "decrypt"]);\n'
        "const iv = new Uint8Array(12);\n"
        'const sealed = await crypto.subtle.encrypt({ name: "AES-GCM", iv }, key,\n'
        '  new TextEncoder().encode("secret"));\n'
        'const opened = await crypto.subtle.decrypt({ name: "AES-GCM", iv }, key, sealed);\n'
        "new TextDecoder().decode(opened)",
        "secret",
    ),
    # SpiderMonkey's importKey traps on an EC key: the sandbox would crash.
    "an EC public key read": (
        "const jwk = { kty: 'EC', crv: 'P-256',\n"
        "  x: 'f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU',\n"
        "  y: 'x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0' };\n"
        "const key = await crypto.subtle.importKey('jwk', jwk,\n"
        "  { name: 'ECDSA', namedCurve: 'P-256' }, true, ['verify']);\n"
        "key.type",
        "public",
    ),
}


@pytest.mark.parametrize("name", ON_DENO)
async def test_what_wasm_js_lacks_runs_on_deno(client: Any, name: str) -> None:
    code, expected = ON_DENO[name]
    result = await execute(client, code, language="javascript")
    assert (result["status"], result["executor"]) == ("ok", "deno"), result
    assert result["result"] == expected
    named = await execute(client, code, language="javascript", executor="wasm-js")
    assert named["executor"] == "wasm-js"
    assert (named["status"], named["result"]) != ("ok", expected), named


DATES = """
const d = new Date(Date.UTC(2024, 2, 7, 10, 30));
const toString = Object.getOwnPropertyDescriptor(Date.prototype, "toString");
({
  text: String(d),
  template: `at ${d}`,
  time: d.toTimeString(),
  local: new Date(2024, 0, 1).getHours(),
  method: [toString.value.name, toString.value.length, toString.writable,
           toString.enumerable, toString.configurable],
})
"""


async def test_dates_as_text_read_the_same_on_both(client: Any) -> None:
    on_wasm = await execute(client, DATES, language="javascript", executor="wasm-js")
    on_deno = await execute(client, DATES, language="javascript", executor="deno")
    assert on_wasm["status"] == "ok", on_wasm
    assert on_wasm["result"] == on_deno["result"], (on_wasm, on_deno)
    assert on_wasm["result"]["text"] == (
        "Thu Mar 07 2024 10:30:00 GMT+0000 (Coordinated Universal Time)"
    )


CLOCKS = """
const origin = performance.timeOrigin;
await new Promise((resolve) => setTimeout(resolve, 5));
const drift = Math.abs(performance.timeOrigin + performance.now() - Date.now());
[origin === performance.timeOrigin, drift < 50, origin > 1.6e12, typeof origin]
"""


async def test_the_time_origin_is_the_epoch_time_now_counts_from_on_both(client: Any) -> None:
    """`performance.timeOrigin + performance.now()` is the time of day, on wasm-js too."""
    for executor in ("wasm-js", "deno"):
        answer = await execute(client, CLOCKS, language="javascript", executor=executor)
        assert answer["result"] == [True, True, True, "number"], answer


BODIES = """
const response = new Response("héllo");
const request = new Request("https://example.com/", { method: "POST", body: "xy" });
const read = await response.bytes();
let again = "";
try {
  await response.bytes();
} catch (e) {
  again = e.name;
}
const method = Object.getOwnPropertyDescriptor(Response.prototype, "bytes");
[read instanceof Uint8Array, Array.from(read), Array.from(await request.bytes()), again,
 method.value.name, method.value.length, method.enumerable, method.writable]
"""


async def test_a_body_reads_as_bytes_on_both(client: Any) -> None:
    on_wasm = await execute(client, BODIES, language="javascript", executor="wasm-js")
    on_deno = await execute(client, BODIES, language="javascript", executor="deno")
    assert on_wasm["result"] == on_deno["result"], (on_wasm, on_deno)
    assert on_wasm["result"][:4] == [True, [104, 195, 169, 108, 108, 111], [120, 121], "TypeError"]


REFUSALS = """
const out = [];
const tries = [
  () => btoa("€"), () => atob("***"), () => structuredClone(Symbol("s")),
  () => structuredClone(() => 1), () => crypto.subtle.digest("MD5", new Uint8Array(1)),
  () => crypto.subtle.digest({ name: "md5" }, new Uint8Array(1)),
  () => atob(btoa("ok")), () => structuredClone({ a: [1] }).a[0],
  async () => (await crypto.subtle.digest("SHA-256", new Uint8Array(1))).byteLength,
];
for (const attempt of tries) {
  try {
    out.push(["ok", await attempt()]);
  } catch (e) {
    out.push([e.constructor.name, e.name, e.message, e instanceof DOMException, e.code]);
  }
}
out.push([btoa.name, btoa.length, atob.name, crypto.subtle.digest.length]);
out
"""


async def test_what_the_web_functions_refuse_is_refused_alike(client: Any) -> None:
    """btoa, atob, structuredClone and digest throw Deno's DOMExceptions on wasm-js too
    (its engine throws a RangeError or a TypeError, and digests MD5)."""
    on_wasm = await execute(client, REFUSALS, language="javascript", executor="wasm-js")
    on_deno = await execute(client, REFUSALS, language="javascript", executor="deno")
    assert on_wasm["status"] == "ok", on_wasm
    assert on_wasm["result"] == on_deno["result"], (on_wasm, on_deno)
    assert on_wasm["result"][0][:2] == ["DOMException", "InvalidCharacterError"]


STREAMS = """
const out = [];
let text = "";
for await (const chunk of new Response("hello stream").body) {
  text += new TextDecoder().decode(chunk);
}
out.push(text);
const got = [];
for await (const v of ReadableStream.from([1, Promise.resolve(2), 3])) got.push(v);
out.push(got);
async function* letters() { yield "a"; yield "b"; }
const fromAsync = [];
for await (const v of ReadableStream.from(letters())) fromAsync.push(v);
out.push(fromAsync);
const left = ReadableStream.from([1, 2, 3]);
for await (const v of left) { out.push(v); break; }
out.push(left.locked);
const kept = ReadableStream.from([1, 2, 3]);
for await (const v of kept.values({ preventCancel: true })) break;
const rest = [];
for await (const v of kept) rest.push(v);
out.push(rest);
out.push(ReadableStream.prototype[Symbol.asyncIterator] === ReadableStream.prototype.values);
const failing = new ReadableStream({ pull(c) { c.error(new Error("broke")); } });
try { for await (const v of failing) {} } catch (e) { out.push(e.message, failing.locked); }
try { ReadableStream.from(5); } catch (e) { out.push(e.constructor.name); }
out
"""


async def test_streams_are_async_iterables_on_both(client: Any) -> None:
    on_wasm = await execute(client, STREAMS, language="javascript", executor="wasm-js")
    on_deno = await execute(client, STREAMS, language="javascript", executor="deno")
    assert on_wasm["status"] == "ok", on_wasm
    assert on_wasm["result"] == on_deno["result"], (on_wasm, on_deno)
    assert on_wasm["result"][:3] == ["hello stream", [1, 2, 3], ["a", "b"]]


FIXTURES = Path(__file__).parents[1] / "fixtures"


async def _printed(client: Any, code: str, executor: str) -> tuple[str, str, str]:
    result = await execute(client, code, language="javascript", executor=executor)
    return result["status"], result["stdout"], result["stderr"]


async def test_console_writes_what_denos_writes(client: Any) -> None:
    """Values of every kind, through every console method but the timers and trace
    (whose figures and frames are the engine's own)."""
    code = (FIXTURES / "console_values.js").read_text()
    on_wasm = await _printed(client, code, "wasm-js")
    assert on_wasm == await _printed(client, code, "deno")
    assert on_wasm[0] == "ok" and "[ 1, 2 ]" in on_wasm[1]  # SpiderMonkey would say [1, 2]
    assert "Map(2) {" in on_wasm[1] and "Assertion failed: nope 3" in on_wasm[2]


@pytest.mark.parametrize("seed", range(8))
async def test_random_values_are_logged_as_deno_logs_them(client: Any, seed: int) -> None:
    code = (FIXTURES / "console_random.js").read_text().replace("SEED", str(seed + 1))
    on_wasm = await _printed(client, code, "wasm-js")
    assert on_wasm[0] == "ok", on_wasm
    assert on_wasm == await _printed(client, code, "deno")


@pytest.mark.parametrize(
    "code",
    [
        "total = 0;\nfor (const n of [1, 2]) total += n;\ntotal",  # an undeclared name
        "const o = Object.freeze({ a: 1 });\no.a = 2;\no.a",  # a frozen property
        "(function () { return typeof this })()",
    ],
)
async def test_javascript_is_strict_whichever_runs_it(client: Any, code: str) -> None:
    on_wasm = await execute(client, code, language="javascript", executor="wasm-js")
    on_deno = await execute(client, code, language="javascript", executor="deno")
    assert (on_wasm["status"], on_wasm["result"]) == (on_deno["status"], on_deno["result"])
    assert (on_wasm["error"] or {}).get("type") == (on_deno["error"] or {}).get("type")
    assert on_wasm["status"] == "error" or on_wasm["result"] == "undefined", on_wasm


# A callback the program hands over that throws: Deno fails the execution with its
# error, frames and all, whatever the program does next.
BACKGROUND_ERRORS = {
    "a timer": (
        "function later() {\n  throw new RangeError('late');\n}\n"
        "setTimeout(() => later(), 1);\n"
        "await new Promise((resolve) => setTimeout(resolve, 50));\n'finished'"
    ),
    "an interval": (
        "setInterval(() => { throw new TypeError('again') }, 1);\n"
        "await new Promise((resolve) => setTimeout(resolve, 50));\n'finished'"
    ),
    "a microtask, the program answered at once": (
        "queueMicrotask(() => { throw new Error('queued') });\n'finished'"
    ),
    "a listener": (
        "const target = new EventTarget();\n"
        "target.addEventListener('ping', () => { throw new Error('heard') });\n"
        "target.dispatchEvent(new Event('ping'));\n'finished'"
    ),
    "a listener object": (
        "const target = new EventTarget();\n"
        "target.addEventListener('ping', { handleEvent() { throw 7 } });\n"
        "target.dispatchEvent(new Event('ping'));\nawait 0;\n'finished'"
    ),
    "an abort handler": (
        "const controller = new AbortController();\n"
        "controller.signal.onabort = function handler() { throw new Error('handled') };\n"
        "controller.abort();\n'finished'"
    ),
    "an abort listener": (
        "const controller = new AbortController();\n"
        "controller.signal.addEventListener('abort', () => { throw new Error('aborted') });\n"
        "controller.abort();\n'finished'"
    ),
}
# What throws nothing, or nothing the program did not take back, finishes.
NO_BACKGROUND_ERRORS = {
    "a listener removed": (
        "const target = new EventTarget();\n"
        "const listener = () => { throw new Error('removed') };\n"
        "target.addEventListener('ping', listener);\n"
        "target.addEventListener('ping', listener);\n"
        "target.removeEventListener('ping', listener);\n"
        "target.dispatchEvent(new Event('ping'));\n'finished'"
    ),
    "a listener added twice runs once": (
        "let heard = 0;\nconst target = new EventTarget();\n"
        "const listener = () => { heard += 1 };\n"
        "target.addEventListener('ping', listener);\n"
        "target.addEventListener('ping', listener);\n"
        "target.dispatchEvent(new Event('ping'));\nheard"
    ),
    "an abort handler read back": (
        "const controller = new AbortController();\nconst handler = () => {};\n"
        "controller.signal.onabort = handler;\ncontroller.signal.onabort === handler"
    ),
    "a timer left pending": "setTimeout(() => { throw new Error('never') }, 1000);\n'finished'",
    "an error caught in a microtask": (
        "let caught = '';\n"
        "queueMicrotask(() => {\n"
        "  try { throw new Error('mine') } catch (e) { caught = e.message }\n"
        "});\n"
        "await 0;\ncaught"
    ),
}


def _outcome(result: dict[str, Any]) -> tuple[Any, ...]:
    error = result["error"] or {}
    return (
        result["status"],
        result["result"],
        error.get("type"),
        error.get("message"),
        error.get("traceback"),
    )


@pytest.mark.parametrize("name", [*BACKGROUND_ERRORS, *NO_BACKGROUND_ERRORS])
async def test_an_error_in_a_callback_ends_the_run_as_on_deno(client: Any, name: str) -> None:
    code = BACKGROUND_ERRORS.get(name) or NO_BACKGROUND_ERRORS[name]
    on_wasm = await execute(client, code, language="javascript", executor="wasm-js")
    on_deno = await execute(client, code, language="javascript", executor="deno")
    assert _outcome(on_wasm) == _outcome(on_deno), (on_wasm, on_deno)
    expected = "error" if name in BACKGROUND_ERRORS else "ok"
    assert on_wasm["status"] == expected, on_wasm


@pytest.mark.parametrize("language", ["javascript", "typescript"])
async def test_a_traceback_reads_the_same_on_both(client: Any, language: str) -> None:
    """The program's own lines and columns, the final expression's too (its value is
    returned, and that takes no column from it)."""
    code = (
        "function inner(): never {\n  throw new Error('deep');\n}\n"
        "const outer = () => inner();\nouter()"
    ).replace(": never", ": never" if language == "typescript" else "")
    on_wasm = await execute(client, code, language=language, executor="wasm-js")
    on_deno = await execute(client, code, language=language, executor="deno")
    assert on_wasm["error"] == on_deno["error"], (on_wasm, on_deno)
    assert on_wasm["error"]["traceback"] == (
        "    at inner (<program>:2:9)\n    at outer (<program>:4:21)\n    at <program>:5:1"
    )


@pytest.mark.parametrize(
    "code",
    [
        "const controller = new AbortController();\ncontroller.abort(new Error('why'));\n"
        "try { controller.signal.throwIfAborted() } catch (e) { e.message }",
        "const controller = new AbortController();\ncontroller.abort();\n"
        "try { controller.signal.throwIfAborted() } catch (e) { e.name }",
        "try { new TextEncoder().encode({ toString() { throw new Error('no text') } }) }\n"
        "catch (e) { e.message }",
        "try { new TextEncoder().encode(Symbol()) } catch (e) { e.name }",
        "const controller = new AbortController();\ncontroller.abort();\n"
        "String(controller.signal.reason)",
        "const { reason } = AbortSignal.abort();\n[String(reason), AbortSignal.abort.length]",
        # A timeout's reason, and signals made from others: their reasons and events.
        "const signal = AbortSignal.timeout(5);\n"
        "await new Promise((resolve) => signal.addEventListener('abort', resolve));\n"
        "const { name, message, code } = signal.reason;\n"
        "[name, message, code, String(signal.reason), AbortSignal.timeout.name]",
        "const controller = new AbortController();\n"
        "const any = AbortSignal.any([controller.signal]);\n"
        "let fired = 0;\nany.addEventListener('abort', () => fired++);\ncontroller.abort('why');\n"
        "const early = new AbortController();\nearly.abort('early');\n"
        "const fromAborted = AbortSignal.any([new AbortController().signal, early.signal]);\n"
        "[any.aborted, any.reason, fired, fromAborted.reason, AbortSignal.any([]).aborted]",
        "const timed = AbortSignal.any([AbortSignal.timeout(5)]);\n"
        "await new Promise((resolve) => setTimeout(resolve, 30));\n"
        "[timed.aborted, timed.reason.name]",
        # An error's own names, and the common way to log one whole with them.
        "const e = new Error('boom', { cause: 1 });\ne.code = 7;\nlet parsing;\n"
        "try { JSON.parse('{bad'); } catch (caught) { parsing = caught; }\n"
        "class AppError extends Error {\n"
        "  constructor(m) { super(m); this.name = 'AppError'; this.status = 404; }\n}\n"
        "const logged = JSON.stringify(e, Object.getOwnPropertyNames(e));\n"
        "[logged, ...[new AppError('nf'), parsing, new Error(), Object.create(Error.prototype),\n"
        "  { a: 1 }, [1]].map((value) => Object.getOwnPropertyNames(value))]",
        "[AbortSignal, AbortController, URL, URLSearchParams, Headers, EventTarget]\n"
        "  .map((made) => Object.prototype.toString.call(made.prototype))\n"
        "  .concat(Object.prototype.toString.call(performance))",
    ],
)
async def test_built_ins_we_mend_answer_as_on_deno(client: Any, code: str) -> None:
    """What a built-in throws is caught; signals, their reasons and their names read as
    on Deno."""
    await answered_alike(client, code)


async def answered_alike(client: Any, code: str) -> None:
    """JavaScript `code` runs on wasm-js and on deno to the same result."""
    on_wasm = await execute(client, code, language="javascript", executor="wasm-js")
    on_deno = await execute(client, code, language="javascript", executor="deno")
    assert on_wasm["status"] == "ok", on_wasm
    assert on_wasm["result"] == on_deno["result"], (on_wasm, on_deno)


STACKS = """
class ValidationError extends Error {
  constructor(message) {
    super(message);
    this.name = "ValidationError";
  }
}
function check() {
  throw new ValidationError("missing x");
}
function outer() {
  check();
}
try {
  outer();
} catch (e) {
  console.error(e.stack);
  console.error(e);
}
const o = { name: "Custom", message: "made" };
Error.captureStackTrace(o);
console.log(o.stack);
"""


async def test_an_error_stack_reads_as_denos(client: Any) -> None:
    """`error.stack`, a subclass's included: its name and message, then the program's
    frames, never the guest's files."""
    on_wasm = await _printed(client, STACKS, "wasm-js")
    assert on_wasm == await _printed(client, STACKS, "deno")
    assert on_wasm[2].startswith(
        "ValidationError: missing x\n    at check (<program>:9:9)\n    at outer (<program>:12:3)"
    ), on_wasm
    assert "Custom: made\n    at <program>:21:7" in on_wasm[1]


@pytest.mark.parametrize(
    "code",
    [
        # Timers due at once (the program was busy) fire in the order they fall due.
        "const order = [];\n"
        "setTimeout(() => order.push(10), 10);\nsetTimeout(() => order.push(5), 5);\n"
        "setTimeout(() => order.push(0), 0);\n"
        "const end = Date.now() + 30;\nwhile (Date.now() < end) {}\n"
        "await new Promise((resolve) => setTimeout(resolve, 20));\norder",
        # A callback's microtasks run before the next timer; a cleared timer never fires.
        "const order = [];\nconst never = setTimeout(() => order.push('never'), 2);\n"
        "setTimeout(() => {\n  order.push('a');\n"
        "  Promise.resolve().then(() => order.push('micro'));\n}, 1);\n"
        "setTimeout(() => order.push('b'), 1);\nclearTimeout(never);\n"
        "await new Promise((resolve) => setTimeout(resolve, 10));\norder",
        # Something other than a function is refused as Deno refuses it.
        "const refused = [];\nfor (const handler of ['code()', 5, undefined, {}]) {\n"
        "  try { setTimeout(handler, 1) } catch (e) { refused.push(`${e.name}: ${e.message}`) }\n"
        "}\nrefused",
    ],
)
async def test_timers_fire_as_on_deno(client: Any, code: str) -> None:
    await answered_alike(client, code)


@pytest.mark.parametrize("executor", ["wasm-js", "deno"])
async def test_awaiting_what_never_settles_is_one_plain_error(client: Any, executor: str) -> None:
    """No runtime's own words (nor the path of the worker's file) in the answer."""
    code = "console.error('waiting');\nawait new Promise(() => {});"
    result = await execute(client, code, language="javascript", executor=executor)
    assert (result["status"], result["stderr"]) == ("error", "waiting\n"), result
    assert result["error"] == {"type": "Error", "message": NEVER_SETTLED, "traceback": ""}
