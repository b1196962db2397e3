"""js_session: a session step's top-level declarations become globals.

The tables pin the exact rewritten text, so every rewrite (and every refusal to
rewrite) is visible. `test_generated_declarations_persist_under_deno` runs generated
declarations through real Deno in two steps, the way a session's worker imports them:
Deno is the only judge of whether a rewrite means what it should.
"""

from __future__ import annotations

import base64
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from deno import find_deno_bin
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.executors import js_syntax
from conduit.executors.js_session import KEPT_LOCAL, rewrite_step
from conduit.executors.js_syntax import parse, prepare_module

REWRITTEN = [
    # Variables, with and without values and annotations.
    ("let x = 1", "{ globalThis.x = 1}"),
    ("const x: number = 1;", "{ globalThis.x = 1;}"),
    ("let x!: number, y", "{ globalThis.x = undefined; globalThis.y = undefined}"),
    ("var v;", "{ globalThis.v = globalThis.v;}"),
    ("let a = 1 /* c */, b = 2;", "{ globalThis.a = 1 /* c */; globalThis.b = 2;}"),
    ("const v = await f();", "{ globalThis.v = await f();}"),
    # A comment after a declaration with no semicolon stays outside the block.
    ("const n = 3 // three\nn", "{ globalThis.n = 3} // three\nn"),
    ("class C {} // x\nC", "{globalThis.C = class C {}} // x\nC"),
    # Functions are assigned after the directives, which stay directives.
    (
        '"use strict";\nfunction f() {}',
        '"use strict";\n{globalThis.f = f;}function f() {}',
    ),
    # Destructuring: the targets become globals; keys, defaults and holes stay.
    (
        "const {a, b: c = 1, ...r} = o;",
        "{ ({a: globalThis.a, b: globalThis.c = 1, ...globalThis.r} = o);}",
    ),
    ("let [x, , ...y] = arr", "{ ([globalThis.x, , ...globalThis.y] = arr)}"),
    ("const {d = 2, [k]: e}: T = o", "{ ({d: globalThis.d = 2, [k]: globalThis.e} = o)}"),
    ("const {a: {b: [c]}} = o", "{ ({a: {b: [globalThis.c]}} = o)}"),
    # Functions stay declared, assigned at the top of the step.
    (
        "1;\nfunction f() {}\nasync function g() {}\nfunction* h() {}",
        "{globalThis.f = f; globalThis.g = g; globalThis.h = h;}1;\n"
        "function f() {}\nasync function g() {}\nfunction* h() {}",
    ),
    (
        "function f() { let local = 1; return local }",
        "{globalThis.f = f;}function f() { let local = 1; return local }",
    ),
    # Classes become class expressions; those that cannot are assigned after.
    ("class C extends B {}", "{globalThis.C = class C extends B {}}"),
    ("@dec class C {}", "@dec class C {}{globalThis.C = C;}"),
    ("abstract class A {}", "abstract class A {}{globalThis.A = A;}"),
    ("enum E { A }", "enum E { A }{globalThis.E = E;}"),
    # Imports stay (prepare_module hoists them); their local names are copied.
    (
        'import x, {a as b, type T, c} from "m";',
        'import x, {a as b, type T, c} from "m";'
        "{globalThis.x = x; globalThis.b = b; globalThis.c = c;}",
    ),
    ('import * as ns from "n"\nns', 'import * as ns from "n";{globalThis.ns = ns;}\nns'),
    # Exported declarations lose the keyword; `export default` is prepare_module's.
    ("export const q = 1", "       { globalThis.q = 1}"),
    ("export class L {}", "       {globalThis.L = class L {}}"),
    (
        "export default function g() {}",
        "{globalThis.g = g;}export default function g() {}",
    ),
]

UNCHANGED = [
    # Nested scopes are the step's own.
    "for (let i = 0; i < 3; i++) { let j = i }",
    "{ const inner = 1 }",
    "if (a) { let local = 1 }",
    # Types, and what has no value at run time.
    "type T = number; interface I { a: T }",
    "declare const w: number;",
    "const enum F { A }",
    "namespace N { export const a = 1 }",
    "function f(x: string): void;",
    'import type { Q } from "q";',
    'import "side-effect";',
    "export default class {}",
    # Names that cannot be globals stay local.
    "const undefined = 1",
    "let tools = 2, other = 3",
    "const {globalThis} = o",
    # Programs that do not parse: the runtime reports their error.
    "let x = ",
    "const {a} ;",
    "",
]


@pytest.mark.parametrize(("code", "expected"), REWRITTEN)
def test_top_level_declarations_become_globals(code: str, expected: str) -> None:
    assert rewrite_step(code, "typescript") == expected


@pytest.mark.parametrize("code", UNCHANGED)
def test_what_is_not_a_top_level_value_is_left_alone(code: str) -> None:
    assert rewrite_step(code, "typescript") == code


def test_javascript_is_read_as_javascript() -> None:
    assert rewrite_step("let x = 1", "javascript") == "{ globalThis.x = 1}"
    # An annotation is a syntax error in JavaScript: left for Deno to report.
    assert rewrite_step("let x: number = 1", "javascript") == "let x: number = 1"


def test_line_breaks_stay_where_they_were() -> None:
    code = "let x: {\n  a: number\n} = {a: 1}\nlet y: {\n  a: number\n}\nthrow 1"
    rewritten = rewrite_step(code, "typescript")
    assert rewritten.splitlines()[-1] == "throw 1"
    assert rewritten.count("\n") == code.count("\n")


def test_a_rewritten_step_still_has_no_value_when_it_ends_with_a_declaration() -> None:
    """Each rewritten declaration is a block, which prepare_module does not return."""
    for code in ("let x = 1", "class C {}", "enum E { A }", 'import x from "m"'):
        assert "return" not in prepare_module(rewrite_step(code, "typescript")).text, code
    assert "return (\nx)" in prepare_module(rewrite_step("let x = 1\nx", "typescript")).text


def test_non_ascii_and_escaped_names() -> None:
    assert rewrite_step("const é = 'ü'", "typescript") == "{ globalThis.é = 'ü'}"
    assert rewrite_step("let \\u0061 = 1", "typescript") == "{ globalThis.\\u0061 = 1}"


def test_hostile_programs_are_bounded_and_never_raise() -> None:
    # Too large to parse: unchanged, at once.
    huge = "let x = 1;\n" * (js_syntax.MAX_PARSE_BYTES // 10)
    assert rewrite_step(huge, "typescript") is huge
    # A pattern nested far deeper than any recursion could follow.
    depth = 20_000
    deep = "const " + "[" * depth + "x" + "]" * depth + " = v"
    rewritten = rewrite_step(deep, "typescript")
    assert rewritten.startswith("{ (" + "[" * depth + "globalThis.x" + "]" * depth)
    # Unclosed nesting is a syntax error: unchanged.
    assert rewrite_step("{a:" * 10_000, "typescript") == "{a:" * 10_000


# --- Generated declarations ---------------------------------------------------------

# Reserved words cannot be bindings; contextual ones (`async`, `type`, `of`) may, but
# are not what this property is about.
_RESERVED = """
    break case catch class const continue debugger default delete do else enum export
    extends false finally for function if import in instanceof new null return super
    switch this throw true try typeof var void while with yield let static implements
    interface package private protected public await arguments eval async of get set
    type declare namespace module abstract as from global readonly using
"""
_NOT_NAMES = {*_RESERVED.split(), *(name.decode() for name in KEPT_LOCAL)}

names = st.from_regex(r"[a-z_$][a-zA-Z0-9_$]{0,5}", fullmatch=True).filter(
    lambda name: name not in _NOT_NAMES
)


@dataclass(frozen=True)
class Binding:
    """A binding pattern, a value that fills it, and what each name gets, in order."""

    pattern: str
    value: str
    bound: tuple[tuple[str, int], ...]


@st.composite
def bindings(draw: st.DrawFn, depth: int = 0) -> Binding:
    """A name, or an object or array pattern of bindings (names may repeat)."""
    kind = draw(st.sampled_from(["name", "object", "array"] if depth < 3 else ["name"]))
    if kind == "name":
        name, value = draw(names), draw(st.integers(-1000, 1000))
        return Binding(name, str(value), ((name, value),))
    parts = draw(st.lists(bindings(depth + 1), min_size=1, max_size=3))
    if kind == "array":
        hole = "0, " if draw(st.booleans()) else ""  # `[, a]` skips the first element
        pattern = "[" + (", " if hole else "") + ", ".join(p.pattern for p in parts) + "]"
        value = "[" + hole + ", ".join(p.value for p in parts) + "]"
    else:
        entries, values = [], []
        for index, part in enumerate(parts):
            if len(part.bound) == 1 and part.pattern == part.bound[0][0] and draw(st.booleans()):
                entries.append(part.pattern)  # shorthand
                values.append(f"{part.pattern}: {part.value}")
            else:  # (a key no shorthand name can be: keys are distinct)
                entries.append(f'"k {index}": {part.pattern}')
                values.append(f'"k {index}": {part.value}')
        pattern, value = "{" + ", ".join(entries) + "}", "{" + ", ".join(values) + "}"
    return Binding(pattern, value, tuple(pair for part in parts for pair in part.bound))


@st.composite
def steps(draw: st.DrawFn) -> tuple[str, dict[str, int]]:
    """A step of declarations binding distinct names, and what each name ends up as."""
    lines: list[str] = []
    bound: dict[str, int] = {}
    for binding in draw(st.lists(bindings(), min_size=1, max_size=4)):
        fresh = [name for name, _ in binding.bound]
        if len(set(fresh)) != len(fresh) or not bound.keys().isdisjoint(fresh):
            continue  # a name bound twice is a SyntaxError
        declared = draw(st.sampled_from(["let", "const", "var"]))
        annotation = ": any" if draw(st.booleans()) else ""
        lines.append(f"{declared} {binding.pattern}{annotation} = {binding.value};")
        bound.update(binding.bound)
    return "\n".join(lines), bound


def _data_url(text: str) -> str:
    return "data:application/typescript;base64," + base64.b64encode(text.encode()).decode()


# Imports each step's module in turn into one isolate and awaits its default export, as
# a session's worker does; prints the last step's value.
_STEPS_RUNNER = """
const stringify = JSON.stringify;
const urls = JSON.parse(await new Response(Deno.stdin.readable).text());
let value;
for (const url of urls) value = await (await import(url)).default();
console.log("VALUE " + stringify(value));
"""


def _run_steps(tmp_path: Path, codes: list[str]) -> Any:
    runner = tmp_path / "steps.js"
    runner.write_text(_STEPS_RUNNER)
    urls = [_data_url(prepare_module(rewrite_step(code, "typescript")).text) for code in codes]
    completed = subprocess.run(
        [find_deno_bin(), "run", "--no-remote", "--no-config", "--no-lock", "--no-npm", runner],
        input=json.dumps(urls),
        capture_output=True,
        text=True,
        timeout=60,
        env={"DENO_DIR": str(tmp_path / "deno"), "NO_COLOR": "1", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    line = next(line for line in completed.stdout.splitlines() if line.startswith("VALUE "))
    return json.loads(line.removeprefix("VALUE "))


@settings(max_examples=25, deadline=None)
@given(step=steps())
def test_generated_declarations_persist_under_deno(
    tmp_path_factory: pytest.TempPathFactory, step: tuple[str, dict[str, int]]
) -> None:
    """Step 1 declares; step 2, in the same isolate, reads every name back."""
    code, bound = step
    rewritten = rewrite_step(code, "typescript")
    assert rewritten.count("\n") == code.count("\n")
    syntax = parse(rewritten, "typescript")
    assert syntax is not None and syntax.complete, rewritten
    if not bound:
        return
    names_ = sorted(bound)
    read = "[" + ", ".join(names_) + "]"
    tmp_path = tmp_path_factory.mktemp("steps")
    assert _run_steps(tmp_path, [code, read]) == [bound[name] for name in names_], rewritten


def test_a_function_sees_what_a_later_step_assigns(tmp_path: Path) -> None:
    steps_ = ["let n = 1\nfunction get() { return n }", "n = 5", "[get(), n]"]
    assert _run_steps(tmp_path, steps_) == [5, 5]
