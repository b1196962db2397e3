"""TypeScript on wasm-js when its types erase, on deno when it needs more: the result
says which, and the answer is the one Deno gives.

Each program runs twice in one daemon with real Deno, the real SpiderMonkey component
and a real MCP upstream: with no executor named (where the rule sends it), and on
`deno`. Their outcomes must match: status, value, output, error type and the places
(line:column) in its traceback.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from conduit.executors.wasm_js import DENO_ONLY_GLOBALS, DENO_ONLY_MEMBERS
from tests.conftest import RawClient
from tests.e2e.test_tools import shared, shared_daemon  # noqa: F401 (fixtures)

REPORT = (Path(__file__).parents[1] / "fixtures" / "ts_report.ts").read_text()

ERASED = {
    "a program of every erasable kind": REPORT,
    "typed tool calls, in parallel": """
interface Sum { sum: number }
type Echo = (args: { text: string }) => Promise<string>;
const echo: Echo = tools.echo.echo;
const sums = await Promise.all([1, 2, 3].map((i: number) => tools.echo.add({ a: i, b: 10 })));
const said = await echo({ text: "typed" });
return { said, total: (sums as Sum[]).reduce((n, s) => n + s.sum, 0) };
""",
    "a tool's failure is a ToolError": """
let caught: { isToolError: boolean; code: number; tool: string } | undefined;
try {
  await tools.echo.fail({ message: "nope" });
} catch (e: unknown) {
  const err = e as ToolError;
  caught = { isToolError: e instanceof ToolError, code: err.code, tool: err.tool };
}
caught!
""",
    "top-level return and await": """
const wait = (ms: number): Promise<number> => new Promise((r) => setTimeout(() => r(ms), ms));
const waited: number = await wait(1);
if (waited > 0) {
  return `waited ${waited}`;
}
"never";
""",
    "inputs and output": """
const { name, n } = inputs as { name: string; n: number };
console.log(`hello ${name}`);
console.error("to stderr");
n * 2 satisfies number
""",
    "an error's traceback, line for line": """
interface Account { balance: number }
function withdraw(account: Account, amount: number): never | number {
  if (amount > account.balance) {
    throw new RangeError(`cannot withdraw ${amount}`);
  }
  return account.balance - amount;
}
withdraw({ balance: 1 } as Account, 5)
""",
    "strict mode, as in a module": "let declared: number = 1;\nundeclared = declared",
    "a class with modifiers": """
abstract class Shape {
  protected constructor() {}
  abstract area(): number;
  describe(): string { return `${this.constructor.name}: ${this.area()}` }
}
class Square extends Shape {
  private static count: number = 0;
  readonly side: number;
  declare tag?: string;
  constructor(side: number) { super(); this.side = side; Square.count++; }
  override area(): number { return this.side ** 2 }
}
[new Square(3).describe(), Object.keys(new Square(1))]
""",
    "a type after the last value is no value": "const v: number = 7\nv\ninterface Z { z: 1 }",
    "a removed statement still ends the one before": "let x = 1\ntype A = number\n;(() => x + 1)()",
    "a generic call after an operator": (
        "const id = <T,>(v: T): T => v;\nconst n = 1 + id<number>(2);\n!id<boolean>(false) && n"
    ),
    "top-level this, as in a module": "const t: string = typeof this;\nt",
    "text in a type that a script reads as a comment": 'type X = "-->";\nnew Error("e").stack',
}

ON_DENO = {
    "an enum": "enum Color { Red = 1, Green }\nColor.Green",
    "a namespace": "namespace Geo { export const origin = { x: 0, y: 0 } }\nGeo.origin",
    "a parameter property": (
        "class P {\n  constructor(public x: number, private y: number) {}\n"
        "  sum() { return this.x + this.y }\n}\nnew P(1, 2).sum()"
    ),
    "Deno's own API": "const pid: number = Deno.pid;\ntypeof pid",
    "a global only Deno has": "typeof navigator.userAgent",
    "a module import": "const path = await import('node:path');\npath.basename('/a/b.ts')",
    "Intl": "new Intl.NumberFormat('de-DE').format(1234.5)",
    "a locale's format": "(1234567.5).toLocaleString()",
    "Unicode normalization": "const s: string = 'e\\u0301';\ns.normalize().length",
    "a Unicode property escape": "/\\p{Lu}/u.test('\u00c9')",
    "Node's Buffer": "const b: Uint8Array = Buffer.from('hi');\nb.length",
    "a static member only Deno has": "URL.canParse('https://a.example') as boolean",
    "an `as` type followed by what TypeScript does not call": (
        "const f = (a: unknown) => 'called';\nconst z = 1;\nconst y = f as unknown\n(z)\ntypeof y"
    ),
    "a syntax error": "const x: number = (1 +\n",
}


async def run(client: RawClient, code: str, executor: str | None) -> dict[str, Any]:
    request: dict[str, Any] = {
        "language": "typescript",
        "code": code,
        "inputs": {"name": "ada", "n": 21},
        "limits": {"timeout_ms": 2000},
    }
    if executor is not None:
        request["executor"] = executor
    return await client.call("execute", request)


def outcome(result: dict[str, Any]) -> dict[str, Any]:
    """What must match between the executors: the error's type, not its wording (each
    engine words its own), and the lines it happened at (an engine may point at
    another column of a statement; where they agree is checked below)."""
    error = result["error"] or {}
    return {
        "status": result["status"],
        "result": result["result"],
        "stdout": result["stdout"],
        "stderr": result["stderr"],
        "error": error.get("type"),
        "lines": re.findall(r"<program>:(\d+):\d+", error.get("traceback") or ""),
    }


@pytest.mark.parametrize("name", ERASED)
async def test_erasable_typescript_runs_on_wasm_js_as_on_deno(shared: RawClient, name: str) -> None:  # noqa: F811
    code = ERASED[name]
    routed = await run(shared, code, None)
    on_deno = await run(shared, code, "deno")
    assert routed["executor"] == "wasm-js", routed
    assert on_deno["executor"] == "deno"
    assert outcome(routed) == outcome(on_deno), (routed, on_deno)


async def test_the_outcomes_compared_are_the_programs_own(shared: RawClient) -> None:  # noqa: F811
    """The comparison above compares something: values, output, errors and places."""
    report = await run(shared, ERASED["a program of every erasable kind"], None)
    assert report["status"] == "ok" and report["result"]["total"] == 40, report
    tools = await run(shared, ERASED["typed tool calls, in parallel"], None)
    assert (tools["result"], tools["tool_calls"]) == ({"said": "typed", "total": 36}, 4)
    failed = await run(shared, ERASED["a tool's failure is a ToolError"], None)
    caught = failed["result"]
    assert (caught["isToolError"], caught["tool"]) == (True, "echo__fail"), failed
    assert isinstance(caught["code"], int)
    code = ERASED["an error's traceback, line for line"]
    for executor in (None, "deno"):
        thrown = (await run(shared, code, executor))["error"]
        assert thrown["type"] == "RangeError", thrown
        # The throw at its column on both; the call on line 9 (V8 points at its `(`).
        places = re.findall(r"<program>:(\d+):(\d+)", thrown["traceback"])
        assert places[0] == ("5", "11") and places[1][0] == "9", thrown
    strict = outcome(await run(shared, ERASED["strict mode, as in a module"], None))
    assert (strict["status"], strict["error"]) == ("error", "ReferenceError")
    # Named, as a program that computes for long moves to deno (tests/e2e/test_moves.py).
    spin = "const spin = (): void => { for (;;) {} };\nspin()"
    timed_out = [await run(shared, spin, executor) for executor in ("wasm-js", "deno")]
    assert [outcome(result)["status"] for result in timed_out] == ["timeout"] * 2
    said = await run(shared, ERASED["inputs and output"], None)
    assert (said["result"], said["stdout"], said["stderr"]) == (42, "hello ada\n", "to stderr\n")
    this = await run(shared, ERASED["top-level this, as in a module"], None)
    assert this["result"] == "undefined", this


async def test_columns_after_non_ascii_types_and_comment_marks_are_the_same(
    shared: RawClient,  # noqa: F811
) -> None:
    """A type holding `é` or `😀`, or `-->`, leaves every column after it where Deno
    has it (an engine counts UTF-16 units where erasure wrote a space a byte; Deno
    planned around the `-->` its erasure no longer holds)."""
    thrown = 'function greet(name: "José" | "😀"): string { throw new Error(name) }\ngreet("José")'
    places = [
        re.findall(
            r"<program>:(\d+):(\d+)", (await run(shared, thrown, executor))["error"]["traceback"]
        )
        for executor in (None, "deno")
    ]
    assert places[0][0] == places[1][0] == ("1", "53"), places  # `new Error`, in UTF-16 units
    stack = 'type X = "-->";\nnew Error("e").stack'
    results = [(await run(shared, stack, executor))["result"] for executor in (None, "deno")]
    assert "<program>:2:1" in results[0] and results[0] == results[1], results
    # The final expression shares its line with the statement before it: `return (`
    # goes in front of it, and its frames' columns are moved back past it.
    same_line = 'let q: number = 1;   new Error("e").stack'
    results = [(await run(shared, same_line, executor))["result"] for executor in (None, "deno")]
    assert "<program>:1:22" in results[0] and results[0] == results[1], results


@pytest.mark.parametrize(
    ("code", "place"),
    [
        ("undefinedFunction();", "1:1"),
        ("const a: number = 1;\nmissing.b", "2:1"),
        ("import type { T } from './t.ts';\nnotThere", "2:1"),
    ],
)
async def test_an_error_the_final_expression_throws_points_at_it_on_both(
    shared: RawClient,  # noqa: F811
    code: str,
    place: str,
) -> None:
    """V8 places such an error at the `return` written on the line before the final
    expression (or on the module's header): Deno's worker moves it to the expression."""
    tracebacks = [
        (await run(shared, code, executor))["error"]["traceback"] for executor in (None, "deno")
    ]
    assert tracebacks == [f"    at <program>:{place}"] * 2, tracebacks


@pytest.mark.parametrize("name", ON_DENO)
async def test_typescript_that_needs_more_runs_on_deno(shared: RawClient, name: str) -> None:  # noqa: F811
    code = ON_DENO[name]
    routed = await run(shared, code, None)
    assert routed["executor"] == "deno", routed
    assert outcome(routed) == outcome(await run(shared, code, "deno"))


async def test_named_wasm_js_refuses_what_its_types_cannot_say(shared: RawClient) -> None:  # noqa: F811
    refused = await run(shared, ON_DENO["an enum"], "wasm-js")
    assert (refused["status"], refused["executor"]) == ("error", "wasm-js")
    assert refused["error"]["type"] == "SyntaxError"
    assert "an enum (line 1)" in refused["error"]["message"]
    assert "executor 'deno'" in refused["error"]["message"]


async def test_a_typescript_session_runs_on_deno(shared: RawClient) -> None:  # noqa: F811
    opened = await shared.call("sessions/create", {"language": "typescript"})
    try:
        assert opened["executor"] == "deno"
    finally:
        await shared.call("sessions/close", {"session_id": opened["session_id"]})
    refused = await shared.request(
        "sessions/create", {"language": "typescript", "executor": "wasm-js"}
    )
    assert "not in sessions" in refused["error"]["message"]


async def test_deno_only_globals_are_those_the_guest_lacks(shared: RawClient) -> None:  # noqa: F811
    """The rule's list of Deno's globals is both runtimes' difference, no more, no less:
    a Deno upgrade that adds one fails here until it is listed."""
    code = (
        "let o: object | null = globalThis; const names = new Set<string>();\n"
        "while (o) { for (const n of Object.getOwnPropertyNames(o)) names.add(n); "
        "o = Object.getPrototypeOf(o) }\n[...names]"
    )
    assert await _only_on_deno(shared, code) == DENO_ONLY_GLOBALS


# The built-ins whose members both runtimes must have alike, but for DENO_ONLY_MEMBERS.
BUILT_INS = """
AbortController AbortSignal Array ArrayBuffer BigInt Boolean CryptoKey DataView Date
Error EventTarget FinalizationRegistry Function JSON Map Math Number Object Promise Proxy
ReadableStream Reflect RegExp Set String SubtleCrypto Symbol TextDecoder TextEncoder
Uint8Array URL URLSearchParams WeakMap WeakRef WeakSet console crypto performance
""".split()  # noqa: SIM905 (a list of words, kept as words)


async def test_deno_only_members_are_those_the_guests_built_ins_lack(shared: RawClient) -> None:  # noqa: F811
    """The rule's list of built-ins' members only Deno has is both runtimes' difference,
    no more, no less: the members named by a string, on the built-in or inherited."""
    code = (
        f"const owners: string[] = {BUILT_INS!r};\n"
        "const names: string[] = [];\n"
        "const reach = (start: object, as: string): void => {\n"
        "  for (let o: object | null = start; o; o = Object.getPrototypeOf(o)) {\n"
        "    for (const name of Object.getOwnPropertyNames(o)) names.push(`${as}.${name}`);\n"
        "  }\n"
        "};\n"
        "for (const owner of owners) {\n"
        "  const value = (globalThis as any)[owner];\n"
        "  reach(value, owner);\n"
        "  if (typeof value === 'function') reach(value.prototype, `${owner}.prototype`);\n"
        "}\n"
        "names"
    )
    assert await _only_on_deno(shared, code) == DENO_ONLY_MEMBERS


async def _only_on_deno(client: RawClient, code: str) -> set[str]:
    """The names `code` lists on deno and not on wasm-js."""
    on_deno = set((await run(client, code, "deno"))["result"])
    return on_deno - set((await run(client, code, "wasm-js"))["result"])
