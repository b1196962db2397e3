"""js_syntax: the program becomes the body of an async default export, and what it
names is read from its syntax tree.

The tables pin the exact body text, so that every rewrite (and every refusal to rewrite)
is visible. `test_programs_run_under_deno` then runs a set of programs through real
Deno, which is the only judge of whether a rewrite is valid TypeScript.
"""

from __future__ import annotations

import base64
import gc
import json
import random
import re
import subprocess
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import trio
from deno import find_deno_bin
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.executors import js_syntax
from conduit.executors.base import Job, Limits, Status
from conduit.executors.deno import INLINE_PREPARE_CHARS, DenoExecutor
from conduit.executors.js_syntax import (
    Dialect,
    PreparedModule,
    may_await,
    parse,
    prepare_module,
)
from tests.sandboxes import WAIT_S, NoBridge

HEAD = "export default async function () {"
OPENING = "return ("


def split(code: str) -> tuple[str, str]:
    """The hoisted imports (what precedes HEAD on line 1) and the function body; a
    `return (` the header's line ends with shown on a line of its own before it."""
    module = prepare_module(code)
    assert module.line_offset == 1
    header, _, rest = module.text.partition("\n")
    opening = OPENING if header.endswith(HEAD + OPENING) else ""
    header = header.removesuffix(opening)
    assert header.endswith(HEAD)
    assert rest.endswith("\n}\n")
    body = rest.removesuffix("\n}\n")
    return header.removesuffix(HEAD), f"{opening}\n{body}" if opening else body


def body(code: str) -> str:
    return split(code)[1]


RETURNED = [
    # A final expression statement is returned, whatever comes before it.
    ("1 + 1", "return (\n1 + 1)"),
    ("const x = 2; x * 3", "const x = 2; return (x * 3)"),
    ("const x = 2;\nx * 3;", "const x = 2;;return (\nx * 3);"),
    ("const a = 1\nconst b = 2\na + b", "const a = 1\nconst b = 2;return (\na + b)"),
    ("await foo()", "return (\nawait foo())"),
    ("await Promise.all([a(), b()])", "return (\nawait Promise.all([a(), b()]))"),
    ("console.log(1)", "return (\nconsole.log(1))"),
    ("x++", "return (\nx++)"),
    ("let x = 1\nx\n++y", "let x = 1\nx;return (\n++y)"),
    ("-x", "return (\n-x)"),
    ("!done", "return (\n!done)"),
    ("'str'", "return (\n'str')"),
    ("42", "return (\n42)"),
    ("`t ${x}`", "return (\n`t ${x}`)"),
    ("/re/.test(s)", "return (\n/re/.test(s))"),
    ("[1, 2]", "return (\n[1, 2])"),
    ("({a: 1})", "return (\n({a: 1}))"),
    ("x => x * 2", "return (\nx => x * 2)"),
    ("async () => 1", "return (\nasync () => 1)"),
    ("(async () => { return 1 })()", "return (\n(async () => { return 1 })())"),
    ("new Date(0).toISOString()", "return (\nnew Date(0).toISOString())"),
    ("typeof x", "return (\ntypeof x)"),
    ("void 0", "return (\nvoid 0)"),
    ("delete o.k", "return (\ndelete o.k)"),
    ("import.meta.url", "return (\nimport.meta.url)"),
    ("await import('node:path')", "return (\nawait import('node:path'))"),
    ("x = 1", "return (\nx = 1)"),
    ("a, b", "return (\na, b)"),
    ("type = 1", "return (\ntype = 1)"),
    ("async(1)", "return (\nasync(1))"),
    # Comments and semicolons after the expression stay outside the parentheses.
    ("foo()\n// done", "return (\nfoo())\n// done"),
    ("foo() // trailing", "return (\nfoo()) // trailing"),
    ("foo(); /* c */", "return (\nfoo()); /* c */"),
    ("foo();;", "return (\nfoo());;"),
    ("foo()\n;", "return (\nfoo())\n;"),
    # A script reads `<!--` (and a line's leading `-->`) as a comment: nothing goes after.
    ("var a = 3, c = 1\nc\n<!--a\na", "var a = 3, c = 1\nc\n<!--a\nreturn (a)"),
    ("x\n-->y\nz", "x\n-->y\nreturn (z)"),
    ("const x = 1 // one\nx", "const x = 1;return ( // one\nx)"),
    # Lines that continue the previous one, as JavaScript reads them.
    ("a\n(b)", "return (\na\n(b))"),
    ("a\n[0]", "return (\na\n[0])"),
    ("tag\n`x`", "return (\ntag\n`x`)"),
    ("a\n?.b", "return (\na\n?.b)"),
    ("x\n+ y", "return (\nx\n+ y)"),
    ("x\n  instanceof Y", "return (\nx\n  instanceof Y)"),
    ("cond\n  ? a\n  : b", "return (\ncond\n  ? a\n  : b)"),
    (
        "[1, 2, 3]\n  .map((x) => x * 2)\n  .filter(Boolean)",
        "return (\n[1, 2, 3]\n  .map((x) => x * 2)\n  .filter(Boolean))",
    ),
    ("const f = async () =>\n  foo()\nf", "const f = async () =>\n  foo();return (\nf)"),
    ("const x = await\n  foo()\nx", "const x = await\n  foo();return (\nx)"),
    # Statements after a block end there, on the same line or the next.
    ("function f() {}\nf()", "function f() {};return (\nf())"),
    ("function f() {} f()", "function f() {} return (f())"),
    ("if (x) {} foo()", "if (x) {} return (foo())"),
    ("if (x) {\n}\nfoo()", "if (x) {\n};return (\nfoo())"),
    ("class A {}\nnew A()", "class A {};return (\nnew A())"),
    ("try { a() } catch { b() } c()", "try { a() } catch { b() } return (c())"),
    ("do x++; while (x < 3)\nx", "do x++; while (x < 3);return (\nx)"),
    ("if (a) b; else c\nd", "if (a) b; else c;return (\nd)"),
    (
        "for (const k of ks)\n  total += k\ntotal",
        "for (const k of ks)\n  total += k;return (\ntotal)",
    ),
    ("label: for (;;) break label\n1", "label: for (;;) break label;return (\n1)"),
    ("return 5\n6", "return 5;return (\n6)"),
    # Strings, templates, regular expressions and comments hide their contents.
    ("const s = `a ${ {b: `}`}.b } c`; s", "const s = `a ${ {b: `}`}.b } c`; return (s)"),
    ("const t = `${`${`${1}`}`}`\nt", "const t = `${`${`${1}`}`}`;return (\nt)"),
    ("const t = `x\n}\n`\nt", "const t = `x\n}\n`;return (\nt)"),
    (
        "const r = /[/\"']+/g; 'a\"b'.replace(r, '')",
        "const r = /[/\"']+/g; return ('a\"b'.replace(r, ''))",
    ),
    ("const r = /a\\/b\\[/; r", "const r = /a\\/b\\[/; return (r)"),
    ("const h = a / 2 / b\nh", "const h = a / 2 / b;return (\nh)"),
    ("const h = (a) / 2 // c\nh", "const h = (a) / 2;return ( // c\nh)"),
    (
        "const m = x.split(/\\s+/).length / 2\nm",
        "const m = x.split(/\\s+/).length / 2;return (\nm)",
    ),
    ("const s = 'it\\'s'\ns", "const s = 'it\\'s';return (\ns)"),
    ('const s = "a\\"}"\ns', 'const s = "a\\"}";return (\ns)'),
    ("/* { */ x /* } */", "return (\n/* { */ x) /* } */"),
    ("const o = { '}': `{` }\no", "const o = { '}': `{` };return (\no)"),
    ("const π = 3.14\nπ * 2", "const π = 3.14;return (\nπ * 2)"),
    ("const 名前 = 1\n名前", "const 名前 = 1;return (\n名前)"),
    ("class A { #x = 1; get() { return this.#x } }\nnew A().get()", None),
    # TypeScript syntax.
    ("const n: number = 1\nn", "const n: number = 1;return (\nn)"),
    ("const v = x as unknown as T\nv!", "const v = x as unknown as T;return (\nv!)"),
    ("const v = x!\nv", "const v = x!;return (\nv)"),
    ("const v = f()!\nv", "const v = f()!;return (\nv)"),
    ("id<string>('x')", "return (\nid<string>('x'))"),
    ("const f = <T,>(x: T): T => x\nf(1)", "const f = <T,>(x: T): T => x;return (\nf(1))"),
    (
        "type A = Array<string>\nconst a: A = []\na",
        "type A = Array<string>\nconst a: A = [];return (\na)",
    ),
    ("interface I { a: number }\n1", "interface I { a: number };return (\n1)"),
    ("enum E { A, B }\nE.B", "enum E { A, B };return (\nE.B)"),
    (
        "function f(x: string): { a: number } { return { a: 1 } }\nf('')",
        "function f(x: string): { a: number } { return { a: 1 } };return (\nf(''))",
    ),
    (
        "class C<T> extends B<{ a: 1 }> implements I { x!: T }\nnew C()",
        "class C<T> extends B<{ a: 1 }> implements I { x!: T };return (\nnew C())",
    ),
    ("x satisfies T", "return (\nx satisfies T)"),
    ("@dec\nclass A {}\nnew A()", "@dec\nclass A {};return (\nnew A())"),
    ("a?.b?.[0]?.(1)", "return (\na?.b?.[0]?.(1))"),
    ("let a: Map<string, number[]>\na", "let a: Map<string, number[]>;return (\na)"),
]

NOT_RETURNED = [
    "",
    "// only a comment",
    "{a: 1}",
    "{ foo() }",
    "const x = 1",
    "let x",
    "var x = 1;",
    "function f() {}",
    "async function f() {}",
    "function* g() {}",
    "class A {}",
    "abstract class A {}",
    "if (x) {\n  y()\n}",
    "if (x) y()\nelse z()",
    "if (x) y()\nelse if (w) z()",
    "for (const a of b)\n  total += a",
    "for await (const a of b) c(a)",
    "while (x) x--",
    "do { x++ } while (x < 3)",
    "do x++\nwhile (x < 3)",
    "switch (x) { case 1: break }",
    "try { a() } catch { b() }",
    "try { a() } finally { b() }",
    "throw new Error('x')",
    "return 5",
    "label: for (;;) break label",
    "outer:\nfor (;;) { break outer }",
    "x:\ny()",
    "type A = string",
    "interface I { a: number }",
    "enum E { A }",
    "declare const x: number",
    "namespace N { export const a = 1 }",
    "module M {}",
    "await using r = res()",
    "using r = res()",
    "@dec class A {}",
    "@dec\nclass A {}",
    "debugger",
    "<div>{x}</div>",
    "...x",
]


@pytest.mark.parametrize(("code", "expected"), RETURNED)
def test_final_expression_is_returned(code: str, expected: str | None) -> None:
    if expected is None:  # the obvious rewrite: opened at the end of the line before
        *rest, last = code.split("\n")
        opened = f"{chr(10).join(rest)};" if rest else ""
        expected = f"{opened}{OPENING}\n{last})"
    assert body(code) == expected


@pytest.mark.parametrize("code", NOT_RETURNED)
def test_other_final_statements_are_left_alone(code: str) -> None:
    assert body(code) == code


IMPORTS = [
    ('import { join } from "node:path"\njoin("a")', 'import { join } from "node:path";', 1),
    ('import x from "y";\nx', 'import x from "y";', 1),
    ('import "./side.ts"\n1', 'import "./side.ts";', 1),
    ("import * as ns from 'm'\nns", "import * as ns from 'm';", 1),
    ("import type { T } from './t.ts'\nconst a: T = 1", "import type { T } from './t.ts';", 1),
    ("import d, { a as b } from 'm'\nd", "import d, { a as b } from 'm';", 1),
    (
        'import data from "./d.json" with { type: "json" }\ndata',
        'import data from "./d.json" with { type: "json" };',
        1,
    ),
    (
        "import {\n  a, // the a\n  b, /* the b */\n} from 'm'\na + b",
        "import { a, b, } from 'm';",
        4,
    ),
    ("import x\n  from 'm'\nx", "import x from 'm';", 2),
    ("foo();\nimport x from 'y'\nbar()", "import x from 'y';", 1),
    ("a()\nimport x from 'y'\nimport z from 'w'\nb()", "import x from 'y'; import z from 'w';", 1),
    ("\n\n  import x from 'y'\nx", "import x from 'y';", 1),
    ("\u2028import x from 'y'\nx", "import x from 'y';", 1),
    # A line continuation adds nothing to the string, and the header is one line.
    ("import x from 'a\\\nb'\nx", "import x from 'ab';", 2),
]


@pytest.mark.parametrize(("code", "header", "lines"), IMPORTS)
def test_static_imports_are_hoisted_to_line_one(code: str, header: str, lines: int) -> None:
    imports, _ = split(code)
    assert " ".join(imports.split()) == header
    body_lines = prepare_module(code).text.split("\n")[1:-2]
    assert len(body_lines) == code.count("\n") + 1, "line numbers must not move"
    assert "import" not in "\n".join(body_lines)
    # The import's own lines are left empty; nothing else moves.
    start = code.index("import")
    first_line = code[:start].count("\n")
    assert all(not line.strip() for line in body_lines[first_line : first_line + lines])


def test_an_import_declaration_ends_at_its_module_specifier() -> None:
    assert split("import x from 'y'\n(foo)()") == ("import x from 'y'; ", "return (\n\n(foo)())")


def test_an_import_sharing_a_line_is_blanked_with_spaces() -> None:
    imports, text = split("x(); import y from 'z'; y")
    assert imports == "import y from 'z'; "
    assert text == "x(); " + " " * len("import y from 'z';") + " return (y)"


@pytest.mark.parametrize(
    "code",
    ["const p = import('x')\nawait p", "import('x')", "import.meta.url", "const m = import.meta"],
)
def test_dynamic_import_and_import_meta_are_not_hoisted(code: str) -> None:
    imports, text = split(code)
    assert imports == ""
    assert "import" in text


EXPORTS = [
    ("export const a = 1\na", "       const a = 1;return (\na)"),
    ("export function f() { return 1 }\nf()", "       function f() { return 1 };return (\nf())"),
    ("export async function f() {}", "       async function f() {}"),
    ("export class A {}\nnew A()", "       class A {};return (\nnew A())"),
    ("export interface I { a: 1 }\n1", "       interface I { a: 1 };return (\n1)"),
    ("export type T = 1\n1", "       type T = 1;return (\n1)"),
    ("export default 42", "return (42)"),
    ("export default { a: 1 }", "return ({ a: 1 })"),
    ("export default { a: 1 };\n// end", "return ({ a: 1 });\n// end"),
    ("export default function () { return 1 }", "return (function () { return 1 })"),
    ("export default async () => 1", "return (async () => 1)"),
    ("export default class {}", "return (class {})"),
    ("export default class extends B {}", "return (class extends B {})"),
    ("export default function main() { return 1 }", "function main() { return 1 }"),
    ("export default class Main {}\n1", "class Main {};return (\n1)"),
    ("export default 1\nfoo()", "(1);return (\nfoo())"),
    ("export default\n  { a: 1 }", "return (\n  { a: 1 })"),
    ("export // why\nconst a = 1", "       // why\nconst a = 1"),
    ("export\nfunction f() {}", "      \nfunction f() {}"),
    ("const a = 1\nexport { a }\na", "const a = 1;return (\n\na)"),
    ("export { a as b } from './m.ts'\n1", "return (\n\n1)"),
    ("export * from 'x'\n1", "return (\n\n1)"),
    ("export * as ns from 'x'; 1", "return (\n" + " " * len("export * as ns from 'x'; ") + "1)"),
    ("export type { T } from './t.ts'\n1", "return (\n\n1)"),
    ("1\nexport { a }", "return (\n1)\n"),
]


@pytest.mark.parametrize(("code", "expected"), EXPORTS)
def test_top_level_exports_become_plain_statements(code: str, expected: str) -> None:
    assert split(code) == ("", expected)


def test_long_else_if_chains_are_read() -> None:
    """Read in a loop: a recursion limit would make the whole rewrite give up."""
    chain = "if (x) y = 0\n" + "".join(f"else if (x === {i}) y = {i}\n" for i in range(3000))
    imports, text = split(f"import x from 'x'\n{chain}")
    assert (imports, text) == ("import x from 'x'; ", f"\n{chain}")


def test_deeply_nested_brackets_are_read() -> None:
    code = "const a = " + "[(" * 2000 + "1" + ")]" * 2000 + "\na"
    assert body(code).endswith(")];return (\na)")


def test_a_hashbang_line_is_blanked() -> None:
    assert body("#!/usr/bin/env -S deno run\n1") == "return (\n\n1)"


UNTOKENIZABLE = [
    "'unterminated\nimport x from 'y'\n1",
    "foo(\nimport x from 'y'\n1",
    "foo)\n1",
    "[1, 2)\n1",
    "/* unterminated\n1",
    "`unterminated ${\n1",
    "`${ foo( }`\n1",
    "x = \\\n1",
]


@pytest.mark.parametrize("code", UNTOKENIZABLE)
def test_untokenizable_programs_are_wrapped_unchanged(code: str) -> None:
    """Deno will report the syntax error, at the right line; no rewrite may hide it."""
    assert split(code) == ("", code)


def test_statements_before_a_syntax_error_are_still_rewritten() -> None:
    """So the runtime reports the error, not an import left inside the function."""
    code = "import x from 'y'\nexport const a = 1\nconst = 1\nimport z from 'w'\nx"
    assert split(code) == (
        "import x from 'y'; ",
        "\n       const a = 1\nconst = 1\nimport z from 'w'\nx",
    )


ALL_PROGRAMS = (
    [code for code, _ in RETURNED]
    + NOT_RETURNED
    + [code for code, _, _ in IMPORTS]
    + [code for code, _ in EXPORTS]
    + UNTOKENIZABLE
)


@pytest.mark.parametrize("code", ALL_PROGRAMS)
def test_every_line_stays_at_its_number(code: str) -> None:
    imports, _ = split(code)
    assert "\n" not in imports
    # The header's line break, the program's own, and the closing brace's two.
    assert prepare_module(code).text.count("\n") == code.count("\n") + 3


@pytest.mark.parametrize("code", ["1 + 1", "const a = `async function`;\nreturn a", "let x;\n"])
def test_a_plain_function_expression_differs_only_in_its_head(code: str) -> None:
    module = prepare_module(code)
    as_async = module.function_expression()
    plain = module.function_expression(asynchronous=False)
    assert as_async.startswith("(async function () {")
    assert plain == "(function () {" + as_async.removeprefix("(async function () {")


@pytest.mark.parametrize(
    ("code", "awaits"),
    [
        ("1 + 1", False),
        ("const s = 'async';\ns", False),
        ("await f()", True),
        ("for await (const x of xs) {}", True),
        ("'await' in a string counts", True),
        ("aw\\u0061it", True),
        ("'\\u00e9' escapes count too", True),
    ],
)
def test_may_await_errs_on_the_side_of_async(code: str, awaits: bool) -> None:
    assert may_await(code) is awaits


@pytest.mark.parametrize("code", ["1\r\n2", "1\r2", "1\u20282", "x\u2029(y)", "a\r\n(b)"])
def test_other_line_terminators(code: str) -> None:
    """JavaScript also ends lines at CR, U+2028 and U+2029."""
    expected = {
        "1\r\n2": "1;return (\r\n2)",
        "1\r2": "1;return (\r2)",
        "1\u20282": "1;return (\u20282)",
        "x\u2029(y)": "return (\nx\u2029(y))",
        "a\r\n(b)": "return (\na\r\n(b))",
    }
    assert body(code) == expected[code]


# Statements for generated programs: each is complete on its own lines, so any
# sequence of them is a program. They mix every shape `_scan` recognises a statement
# start by with shapes it does not.
_STATEMENTS = [
    "const a{i} = {i}",
    "let b{i}: number = a{i} / 2",
    "foo({i}, 'x')",
    "bar[{i}]",
    "obj.method({i})\n  .then((v) => v)\n  .catch(() => null)",
    "x{i}\n  + y",
    "if (c{i}) {{\n  d()\n}} else {{\n  e()\n}}",
    "if (c{i})\n  d()",
    "for (const k of ks)\n  total += k",
    "function f{i}(): {{ a: number }} {{\n  return {{ a: {i} }}\n}}",
    "async function g{i}() {{ await h() }}",
    "class C{i} extends Base {{\n  m() {{ return `${{this.x}}` }}\n}}",
    "type T{i} = {{ a: string; b: Array<number> }}",
    "interface I{i} {{\n  a: string\n}}",
    "label{i}: for (;;) break label{i}",
    "const s{i} = `a ${{`b ${{c}} /`}} }}`",
    "const r{i} = /[/'\"]+/g.test(s)",
    "'str{i}'",
    "await p{i}",
    "{{ block{i}() }}",
    "try {{ t() }} catch (e) {{ u(e) }}",
    "do {{ n++ }} while (n < {i})",
    "// comment {i}",
    "/* block\n   comment {i} */",
    "import m{i} from 'm{i}'",
    "export const e{i} = {i}",
    "export {{ e{i} }}",
    "export default {i}",
    "(x{i})",
    "[1, 2].forEach((v) => v)",
    "tag{i}`t`",
    "return {i}",
]
_SEPARATORS = ["\n", ";\n", "; ", "\n\n", " // end\n"]


def _generated_programs(count: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    programs = []
    for _ in range(count):
        statements = [rng.choice(_STATEMENTS).format(i=i) for i in range(rng.randint(1, 8))]
        # A line comment takes the rest of its line: only a line break may follow it.
        separators = [
            "\n" if statement.startswith("//") else rng.choice(_SEPARATORS)
            for statement in statements
        ]
        programs.append("".join(s + sep for s, sep in zip(statements, separators, strict=True)))
    return programs


def _large_program(size: int) -> str:
    parts: list[str] = []
    total, i = 0, 0
    while total < size:
        part = _generated_programs(1, seed=i)[0] + (
            f"async function work{i}(items: Array<{{ id: number }}>) {{\n"
            f"  for (const item of items) {{\n"
            f"    if (/^x\\/\\d+$/.test(`${{item.id}}`) && item.id / 2 > 1) {{\n"
            f"      out.push(`${{item.id}}: ${{JSON.stringify({{ a: [1, {{ b: 2 }}] }})}}`)\n"
            f"    }}\n  }}\n}}\n"
        )
        parts.append(part)
        total += len(part)
        i += 1
    return "".join(parts) + "result\n"


def test_large_programs_are_read_whole() -> None:
    """100 KB is parsed on a thread with a stack sized for it, and read to its end."""
    code = _large_program(100_000)
    module = prepare_module(code)
    assert module.text.endswith("};return (\nresult)\n\n}\n")
    assert len(module.imports) > 10


# --- Under Deno ---------------------------------------------------------------------------

# (program, inputs, expected JSON value; None for `undefined`)
DENO_PROGRAMS: list[tuple[str, dict[str, Any], Any]] = [
    ("1 + 1", {}, 2),
    ("const x = 2; x * 3", {}, 6),
    ("inputs.a + inputs.b", {"a": 40, "b": 2}, 42),
    ("const xs = [1, 2, 3]\nxs\n  .map((x) => x * 2)\n  .filter((x) => x > 2)", {}, [4, 6]),
    ("const s = `a ${ {b: `}`}.b } c ${'`'}`\ns", {}, "a } c `"),
    ("const t = `${`${`${1 + 1}`}`}`\nt", {}, "2"),
    ("const r = /[/\"']+/g\n'a/\"b\\'c'.replace(r, '')", {}, "abc"),
    ("const a = 10, g = 2\nconst h = a / 2 / g\nh", {}, 2.5),
    ("const t = 'x'.replace(/x/g, 'y') // /\nt", {}, "y"),
    ("const s = 'it\\'s \"q\"'\ns", {}, 'it\'s "q"'),
    ("const o = { '}': '{', \"q\\\"\": 1 }\no['}'] + Object.keys(o).length", {}, "{2"),
    ("const π = 3\nconst 名前 = 'n'\nπ + 名前", {}, "3n"),
    ("let n = 0\nfor (const k of [1, 2, 3])\n  n += k\nn", {}, 6),
    ("let x = 1\nx++", {}, 1),
    ("({ a: 1, b: [true, null] })", {}, {"a": 1, "b": [True, None]}),
    ("const k = 'a';\n({ [k]: 1 })", {}, {"a": 1}),
    ("{ a: 1 }", {}, None),
    ("if (inputs.flag) {\n  'yes'\n}", {"flag": True}, None),
    ("if (inputs.flag) 'a'\nelse 'b'", {"flag": True}, None),
    ("const f = (x: number) => x * 2\nf\n(21)", {}, 42),
    ("await Promise.all([1, 2].map(async (x) => x * 10))", {}, [10, 20]),
    ("await new Promise((resolve) => setTimeout(() => resolve('later'), 1))", {}, "later"),
    ("return 5\n6", {}, 5),
    ("const x = 7\nx // the answer\n/* trailing */", {}, 7),
    ("const x = 3\nx;;", {}, 3),
    ("console.log('to stdout')", {}, None),
    (
        "let found = 0\nouter: for (const i of [1, 2, 3]) {\n"
        "  for (const j of [1, 2]) {\n    if (j === 2) continue outer\n    found += i\n  }\n}\n"
        "found",
        {},
        6,
    ),
    ("label: for (const i of [1]) break label", {}, None),
    (
        "let s = 0\nfor await (const v of (async function* () { yield 1; yield 2 })()) s += v\ns",
        {},
        3,
    ),
    ("#!/usr/bin/env -S deno run\n'shebang'", {}, "shebang"),
    # TypeScript-only syntax.
    ("const f = (x: number): number => x * 2\nf(21)", {}, 42),
    ("interface P { name: string }\nconst p: P = { name: 'x' }\np.name", {}, "x"),
    ("type Pair<T> = [T, T]\nconst p: Pair<number> = [1, 2]\np", {}, [1, 2]),
    ("enum Color { Red, Green }\nColor.Green", {}, 1),
    ("function id<T>(x: T): T { return x }\nid<string>('g')", {}, "g"),
    ("const v = (inputs.value as number)!\nv + 1", {"value": 41}, 42),
    ("const n: number = inputs.n\nn satisfies number", {"n": 5}, 5),
    (
        "class Box<T> {\n  constructor(private readonly v: T) {}\n  get(): T { return this.v }\n}\n"
        "new Box<number>(9).get()",
        {},
        9,
    ),
    (
        "function f(): { a: number } { return { a: 1 } }\ntype A = Array<string>\n"
        "const a: A = ['z']\na.concat(String(f().a))",
        {},
        ["z", "1"],
    ),
    ("declare const never: number\nabstract class A { abstract m(): void }\n'ok'", {}, "ok"),
    (
        "function sealed(c: any, _context: unknown) { return c }\n"
        "@sealed\nclass A { x = 1 }\nnew A().x",
        {},
        1,
    ),
    ("const o = { a: { b: 2 } } as { a?: { b: number } }\no\n  ?.a?.b", {}, 2),
    ("(x: number) => x * 2", {}, None),  # a function is not JSON
    # Imports and exports.
    ('import { join } from "node:path"\njoin("a", inputs.b)', {"b": "c"}, "a/c"),
    (
        "const before = 1;\nimport { basename } from 'node:path'\nbasename('/x/y.ts') + before",
        {},
        "y.ts1",
    ),
    ("import type { Buffer } from 'node:buffer'\nconst b: Buffer | null = null\nb", {}, None),
    (
        "export const a = 20\nexport function twice(x: number) { return x * 2 }\n"
        "export default twice(a) + 2",
        {},
        42,
    ),
    ("const a = 1\nexport { a }\na", {}, 1),
    ("export default function () { return 1 }", {}, None),  # a function is not JSON
    ("const p = import('node:path');\n(await p).sep", {}, "/"),
    # As in JavaScript, a line starting with `(` continues the previous one.
    ("const f = (x: number) => x + 1\nconst g = f\n(41)\ng", {}, 42),
]


def _runner_script() -> str:
    return """
const cases = JSON.parse(await new Response(Deno.stdin.readable).text());
const results = [];
for (const { url, inputs } of cases) {
  try {
    globalThis.inputs = inputs;
    const value = await (await import(url)).default();
    results.push({ ok: true, value: JSON.stringify(value) ?? null });
  } catch (error) {
    results.push({ ok: false, error: String(error), stack: String(error?.stack) });
  }
}
console.log("RESULTS " + JSON.stringify(results));
"""


def _data_url(module: PreparedModule) -> str:
    encoded = base64.b64encode(module.text.encode()).decode()
    return f"data:application/typescript;base64,{encoded}"


def _run_in_deno(tmp_path: Path, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    runner = tmp_path / "runner.ts"
    runner.write_text(_runner_script())
    completed = subprocess.run(
        [
            find_deno_bin(),
            "run",
            "--no-remote",
            "--no-config",
            "--no-lock",
            "--no-npm",
            "--quiet",
            str(runner),
        ],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=60,
        env={"DENO_DIR": str(tmp_path / "deno"), "NO_COLOR": "1", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    line = next(line for line in completed.stdout.splitlines() if line.startswith("RESULTS "))
    return json.loads(line.removeprefix("RESULTS "))


@pytest.mark.slow
def test_programs_that_do_not_parse_get_denos_own_syntax_error(tmp_path: Path) -> None:
    """Wrapped unchanged, so Deno reports what is wrong, at the user's line."""
    # (Nesting 2,000 deep overflows Deno's own parser's stack: its process aborts, which
    # the executor reports as a crash.)
    programs = [
        ("(" * 100, None),
        ("{a:" * 100, None),
        ("const a = 1\nconst s = 'unterminated\n", 2),
        ("import x from 'y'\nconst = 1", 2),
    ]
    modules = [prepare_module(code) for code, _ in programs]
    results = _run_in_deno(
        tmp_path, [{"url": _data_url(module), "inputs": {}} for module in modules]
    )
    for (code, user_line), module, result in zip(programs, modules, results, strict=True):
        assert not result["ok"], code[:20]
        assert "SyntaxError" in result["error"] or "Expected" in result["error"], result["error"]
        if user_line is not None:
            # Deno's message places the error in the module: data:…;base64,…:LINE:COLUMN
            place = re.search(r"base64,[^:]*:(\d+):\d+", result["error"])
            assert place is not None, result["error"]
            assert int(place[1]) - module.line_offset == user_line, result["error"]


@pytest.mark.slow
@pytest.mark.parametrize("language", ["typescript", "javascript"])
async def test_the_deno_executor_prepares_large_programs_too(
    nursery: trio.Nursery, tmp_path: Path, language: str
) -> None:
    """Over INLINE_PREPARE_CHARS a program is prepared in a worker thread; it still
    has its imports hoisted and its value returned, read in its own language."""
    executor = DenoExecutor(cache_dir=tmp_path / "deno", pool_size=1)
    with trio.fail_after(WAIT_S):
        await nursery.start(executor.serve)
    filler = "".join(f"const v{i} = {i} < 3 ? [{i}] : {{ k: `${{{i}}}` }};\n" for i in range(200))
    code = f"{filler}import {{ sep }} from 'node:path'\nsep + v199.k"
    assert len(code) > INLINE_PREPARE_CHARS
    job = Job("ex_large", language, code, Limits())
    with trio.fail_after(WAIT_S):
        outcome = await executor.run(job, NoBridge())
    assert (outcome.status, outcome.result) == (Status.OK, "/199"), outcome.error


def test_programs_run_under_deno(tmp_path: Path) -> None:
    """Every program runs in one Deno process, each imported from a data: URL as
    TypeScript, the way the Deno executor loads them."""
    line_checks = [
        ("const a = 1\n\nthrow new Error('boom')", 3),
        ("import {\n  join,\n} from 'node:path'\nconst p = join('x')\nnull.x", 5),
        ("export const a = 1\nfunction f() {\n  throw new Error(`${a}`)\n}\nf()", 3),
    ]
    programs = [(code, inputs) for code, inputs, _ in DENO_PROGRAMS]
    programs += [(code, {}) for code, _ in line_checks]
    modules = [prepare_module(code) for code, _ in programs]
    results = _run_in_deno(
        tmp_path,
        [
            {"url": _data_url(module), "inputs": inputs}
            for module, (_, inputs) in zip(modules, programs, strict=True)
        ],
    )
    failures = []
    for (code, _, expected), result in zip(DENO_PROGRAMS, results, strict=False):
        value = json.loads(result["value"]) if result["ok"] and result["value"] else None
        if not result["ok"] or value != expected:
            failures.append(f"{code!r}: expected {expected!r}, got {result}")
    assert not failures, "\n".join(failures)

    for (code, user_line), module, result in zip(
        line_checks, modules[len(DENO_PROGRAMS) :], results[len(DENO_PROGRAMS) :], strict=True
    ):
        assert not result["ok"], code
        # The first frame is the program's own module: data:...;base64,...:LINE:COLUMN
        frame = re.search(r"data:application/typescript;base64,[^:]*:(\d+):\d+", result["stack"])
        assert frame, result["stack"]
        assert int(frame[1]) - module.line_offset == user_line, (code, result["stack"])


# --- Mentions: what the policy and wasm-js read -----------------------------------------


def _mentions(code: str, dialect: Dialect = "typescript") -> list[tuple[str, str, str]]:
    syntax = parse(code, dialect)
    assert syntax is not None and syntax.complete
    return [
        (mention.kind.value, mention.value, code[mention.offset :][: len(mention.value) + 2])
        for mention in syntax.mentions()
    ]


def test_mentions_name_globals_specifiers_and_method_calls() -> None:
    code = (
        "import fs from 'node:fs'\n"
        "const s = 'Deno' // Deno\n"
        "globalThis.Deno.exit(x.Deno, { Deno: 1 }, { Intl }, window[`eval`])\n"
        "await import(\"npm:x\"); require('y'); n.toLocaleString('de')\n"
        "const \\u0044eno2 = `${é}`"
    )
    found = _mentions(code)
    names = {value for kind, value, _ in found if kind == "name"}
    assert names == {"fs", "s", "globalThis", "x", "Intl", "window", "require", "n", "Deno2", "é"}
    assert [(kind, value) for kind, value, _ in found if kind != "name"] == [
        ("specifier", "node:fs"),
        ("method_call", "exit"),
        ("global_property", "Deno"),
        ("global_property", "eval"),
        ("specifier", "npm:x"),
        ("specifier", "y"),
        ("method_call", "toLocaleString"),
    ]
    # Offsets count characters: the mention's own text starts there.
    shown = {value: text for _, value, text in found}
    assert shown["node:fs"] == "'node:fs'"
    assert shown["eval"] == "`eval`"
    assert shown["Deno2"] == "\\u0044e"  # as long as the value, plus two
    assert shown["é"] == "é}`"


def test_mentions_can_be_limited_to_parts_of_the_tree_holding_words() -> None:
    code = "f(a(b)); g(Deno(d)); h(`${Deno}`)"
    syntax = parse(code, "typescript")
    assert syntax is not None
    assert [(m.value, m.offset) for m in syntax.mentions(["Deno"])] == [
        ("Deno", 11),
        ("Deno", 26),
    ]
    escaped = parse("f(a); \\u0044eno", "typescript")
    assert escaped is not None
    assert "Deno" in {m.value for m in escaped.mentions(["Deno"])}


def test_a_program_with_syntax_errors_mentions_what_could_be_read() -> None:
    syntax = parse("Deno.exit(1);\nconst s = 'unterminated", "typescript")
    assert syntax is not None and not syntax.complete
    assert ("Deno", 0) in [(mention.value, mention.offset) for mention in syntax.mentions()]


def test_offsets_count_characters_far_into_a_program() -> None:
    code = "é(ü('\ud800')); " * 3000 + "Deno"
    syntax = parse(code, "typescript")
    assert syntax is not None
    *_, last = syntax.mentions(["Deno"])
    assert (last.value, code[last.offset :]) == ("Deno", "Deno")


@pytest.mark.parametrize(
    ("code", "limit", "expected"),
    [
        ("f([{a: '((((', b: /[(]/}]) // ((((", 3, None),
        ("f([{a: 1}])", 2, (3, 3)),
        ("x = `${ g([1]) }`", 2, (3, 10)),
        ("const m: Map<string, Array<number>> = new Map()", 1, None),
        ("é(ü(1))", 1, (2, 3)),  # a character offset, not a byte offset
    ],
)
def test_deepest_counts_brackets_in_code_only(
    code: str, limit: int, expected: tuple[int, int] | None
) -> None:
    syntax = parse(code, "typescript")
    assert syntax is not None
    assert syntax.deepest(limit) == expected


@pytest.mark.parametrize("dialect", ["typescript", "javascript"])
def test_dialects_read_what_their_runtime_accepts(dialect: Dialect) -> None:
    # `f<T>(x)` is a call with type arguments in TypeScript, two comparisons in
    # JavaScript; both are one expression statement and return its value.
    assert body("a < b > (c)") == "return (\na < b > (c))"
    assert prepare_module("a < b > (c)", dialect).text.endswith("return (\na < b > (c))\n}\n")
    typed = prepare_module("const n: number = 1\nn", dialect).text
    assert typed.endswith(";return (\nn)\n}\n") is (dialect == "typescript")


# --- Hostile input ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "code",
    [
        "(" * 100_000,
        "(" * 50_000 + ")" * 50_000,
        "{a:" * 100_000,  # overflows tree-sitter's stack on an 8 MB thread
        "[" * 100_000 + "Deno" + "]" * 100_000,
        "`${" * 30_000,
    ],
    ids=["open-parens", "empty-parens", "object-keys", "deep-valid", "templates"],
)
def test_deep_nesting_is_wrapped_or_read_without_crashing(code: str) -> None:
    module = prepare_module(code)
    assert module.text.endswith(f"\n{code}\n}}\n") or "return (" in module.text
    assert module.text.count("\n") == code.count("\n") + 3


@pytest.mark.slow
def test_garbage_up_to_the_request_limit_is_wrapped_unchanged() -> None:
    rng = random.Random(5)
    code = "".join(rng.choice("(){}[]<>`'\"/\\ \n;:,.=+-*!?$ab1#@") for _ in range(1_000_000))
    module = prepare_module(code)
    assert module.text == f"{HEAD}\n{code}\n}}\n"
    assert parse(code, "javascript") is None or not parse(code, "javascript").complete


@pytest.mark.parametrize(
    "code",
    ["const s = '\ud800'\ns", "`\udfff${1}`", "const é = '\U0001f600\ud83d'; é"],
)
def test_lone_surrogates_in_strings_survive_the_rewrite(code: str) -> None:
    declaration, _, final = code.rpartition("\n" if "\n" in code else "; ")
    module = prepare_module(code)
    assert module.text.endswith(f"{final})\n}}\n")
    assert "return (" in module.text and declaration in module.text


def test_a_program_over_the_parse_limit_runs_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(js_syntax, "MAX_PARSE_BYTES", 20_000)
    code = "import x from 'y'\n" + "1;\n" * 10_000
    assert split(code) == ("", code)
    assert parse(code, "typescript") is None


def test_a_parse_out_of_time_runs_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(js_syntax, "PARSE_BUDGET_S", -1.0)
    code = "import x from 'y'\n" + "f(x);\n" * 2_000
    assert split(code) == ("", code)
    # The parser was reset: the next parse starts afresh.
    monkeypatch.undo()
    assert body("1 + 1") == "return (\n1 + 1)"


# --- Properties -----------------------------------------------------------------------------

_FINAL_EXPRESSIONS = [
    "x",
    "f(1)",
    "a + b",
    "`t ${x}`",
    "[1, 2].map((v) => v)",
    "await p",
    "({ a: 1 })",
]


@settings(max_examples=200, deadline=None)
@given(
    statements=st.lists(st.sampled_from(_STATEMENTS[:-1]), max_size=6),
    separators=st.lists(st.sampled_from(["\n", ";\n", "\n\n"]), min_size=6, max_size=6),
    final=st.sampled_from(_FINAL_EXPRESSIONS),
)
def test_prepared_programs_parse_and_return_their_final_expression(
    statements: list[str], separators: list[str], final: str
) -> None:
    code = "".join(
        statement.format(i=i) + ("\n" if statement.startswith("//") else separator)
        for i, (statement, separator) in enumerate(zip(statements, separators, strict=False))
    )
    # A `;` first: a line starting with `(`, `[` or a template continues the last one.
    code += ";\n" + final
    module = prepare_module(code)
    prepared = parse(module.text, "typescript")
    assert prepared is not None and prepared.complete, module.text
    # Opened on a line before, the final expression keeps its line and its columns.
    assert module.text.endswith(f"\n{final})\n}}\n") and "return (" in module.text
    assert module.text.count("\n") == code.count("\n") + 3


@settings(max_examples=300, deadline=None)
@given(code=st.text(alphabet="(){}[]<>`'\"/\\ \n;:,.=+-*!?$ab1#@\u2028\ud800é", max_size=200))
def test_any_text_is_prepared_without_raising(code: str) -> None:
    module = prepare_module(code)
    assert module.line_offset == 1
    assert module.text.count("\n") == code.count("\n") + 3
    syntax = parse(code, "javascript")
    if syntax is not None:
        list(syntax.mentions())
        syntax.deepest(3)


def test_parsing_large_programs_keeps_none_of_their_text() -> None:
    """The parser holds on to what it is handed to read; it must not be the program."""
    program = "const xs = [1, 2, 3];\n" * 5000  # ~100 KB: parsed in a thread, on a budget
    js_syntax.parse(program, "typescript")  # the read buffer, made once
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(20):
            syntax = js_syntax.parse(f"{program}// {i}", "typescript")
            assert syntax is not None and syntax.complete
            del syntax
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 50_000, f"{held} bytes held after 20 parses of {len(program)} bytes"


def test_a_program_whose_copy_cannot_be_parsed_is_not_read_as_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The text as written reads a lone CR as a space, not a line break: it stands in
    only for a copy that parsed with errors, never for one that ran out of time."""
    original = js_syntax._parse_bytes
    calls: list[bytes] = []

    def first_runs_out(data: bytes, dialect: js_syntax.Dialect) -> object:
        calls.append(data)
        return None if len(calls) == 1 else original(data, dialect)

    monkeypatch.setattr(js_syntax, "_parse_bytes", first_runs_out)
    before = js_syntax.unread_parses()
    assert js_syntax.parse("async\rx => x", "javascript") is None
    assert len(calls) == 1
    assert js_syntax.unread_parses() == before + 1


@pytest.mark.parametrize(
    ("code", "shift"),
    [
        ('let q = 1;   new Error("e").stack', (1, 14, 8)),
        ("let é = 1; é + 1", (1, 12, 8)),  # a column is a UTF-16 unit
        ("let a = 1;\r\nlet b = 2; a", (2, 12, 8)),  # CR LF is one line break
        ("let a = 1;\u2028let b = 2; a", (2, 12, 8)),  # so is U+2028, to the engines
        ("let q = 1\nnew Error()", None),  # `return (` on the line before
        ("x", None),  # on the header's line
    ],
)
def test_where_return_goes_in_front_of_the_final_expression_is_told(
    code: str, shift: tuple[int, int, int] | None
) -> None:
    """The runtimes move that line's columns back by it (deno_worker.js, console.js)."""
    assert prepare_module(code, "typescript").column_shift == shift


@pytest.mark.parametrize(
    ("code", "site"),
    [
        ("x", (0, 35, 1, 1)),  # `return (` on the header's line, after its head
        ('import { a } from "m";\nx', (0, 58, 2, 1)),  # after the hoisted import too
        ("let q = 1\n  new Error()", (1, 11, 2, 3)),  # `;return (` after the statement
        ('let s = "😀"\ns', (1, 14, 2, 1)),  # columns are UTF-16 units
        ("let q = 1; x", None),  # on the expression's own line: `column_shift`
        ("let q = 1;", None),  # nothing returned
    ],
)
def test_where_return_goes_on_a_line_before_the_final_expression_is_told(
    code: str, site: tuple[int, int, int, int] | None
) -> None:
    """Deno's worker moves a frame V8 places at that `return` to the expression."""
    assert prepare_module(code, "typescript").return_site == site
