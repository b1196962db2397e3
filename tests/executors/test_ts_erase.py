"""TypeScript's types erased to the JavaScript they mean, or refused with why: every
construct on both sides of the line, the attacks on it, and a generator's programs."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.executors import js_syntax
from conduit.executors.syntax_memo import SyntaxMemo
from conduit.executors.ts_erase import Erased, NotErasable, erase
from conduit.executors.wasm_js import typescript_lacks


def erased(code: str) -> str:
    result = erase(js_syntax.parse(code, "typescript"))
    assert isinstance(result, Erased), result
    _assert_kept_in_place(code, result.code)
    return result.code


def refused(code: str) -> str:
    result = erase(js_syntax.parse(code, "typescript"))
    assert isinstance(result, NotErasable), result
    return result.reason


def _assert_kept_in_place(code: str, javascript: str) -> None:
    """Column for column (UTF-16 units, as the engines count) the same length and
    lines; what is left is where it was."""
    before = code.encode("utf-16-le", "surrogatepass")
    after = javascript.encode("utf-16-le", "surrogatepass")
    assert len(before) == len(after)
    for index in range(0, len(before), 2):
        old, new = before[index : index + 2], after[index : index + 2]
        assert new == old or new in (b" \0", b";\0"), (code, javascript)
        assert (old in _BREAKS) == (new in _BREAKS)


_BREAKS = tuple(c.encode("utf-16-le") for c in "\n\r\u2028\u2029")


@pytest.mark.parametrize(
    ("code", "javascript"),
    [
        ("let x: number = 1; x", "let x         = 1; x"),
        (
            "function f<T>(a: T, b?: string): T { return a }",
            "function f   (a   , b         )    { return a }",
        ),
        (
            "const g = async <T,>(a: T): Promise<T> => a",
            "const g = async     (a   )             => a",
        ),
        ("y as any; z!; w satisfies W", "y       ; z ; w            "),
        ("new Map<string, number>()", "new Map                ()"),
        ("f<T>(x); a?.b!.c", "f   (x); a?.b .c"),
        ("interface A { x: number }\nA", ";                        \nA"),
        ("type B = { y: string }", ";                     "),
        ("import type { C } from './c'", ";                           "),
        ("export type D = 1", ";                "),
        ("declare const e: number", ";                      "),
        (
            "function h(a: string): void;\nfunction h(a) {}",
            ";                           \nfunction h(a) {}",
        ),
        ("let q!: number", "let q         "),
        ("try {} catch (e: unknown) {}", "try {} catch (e         ) {}"),
        ("for (const x of xs as number[]) {}", "for (const x of xs            ) {}"),
        ("const k = [1, 2] as const", "const k = [1, 2]         "),
        (
            "function a(x: unknown): asserts x is string {}",
            "function a(x         )                      {}",
        ),
        (
            "function b(x: any): x is number { return true }",
            "function b(x     )              { return true }",
        ),
        ("let u: `a${string}` = 'a'", "let u               = 'a'"),
        ("let v: /* c */ number = 1", "let v                 = 1"),
        # A column is a UTF-16 unit: `é` and `→` are one space each, `😀` two.
        ("let w: 'é' = 'é'", "let w      = 'é'"),
        ("let a: '\u2192' = 1", "let a      = 1"),
        ("let e: '😀' = 1", "let e       = 1"),
        ("let g: 'é' = f<number>(1)", "let g      = f        (1)"),
        # Line breaks in a type stay where they were, whichever they are.
        ("let b: {\n  k: 1\u2028} = { k: 1 }", "let b   \n      \u2028  = { k: 1 }"),
        ("let c: {\r\n k: 1 } = { k: 1 }", "let c   \r\n        = { k: 1 }"),
    ],
)
def test_erasable_syntax_becomes_spaces_and_keeps_its_place(code: str, javascript: str) -> None:
    assert erased(code) == javascript


def test_a_class_keeps_its_code_and_loses_its_types() -> None:
    code = (
        "abstract class A<T> extends B<T> implements C, D {\n"
        "  private x?: number = 1\n"
        "  y!: string\n"
        "  declare z: number\n"
        "  abstract m(): void\n"
        "  static readonly k: number = 2;\n"
        "  [key: string]: any\n"
        "  protected override n(a: T): T { return a }\n"
        "  o?(): void {}\n"
        "}"
    )
    assert erased(code).splitlines() == [
        "         class A    extends B                    {",
        "          x          = 1",
        "  y         ",
        "  ;                ",
        "  ;                 ",
        "  static          k         = 2;",
        "  ;                 ",
        "                     n(a   )    { return a }",
        "  o ()       {}",
        "}",
    ]


def test_a_statement_that_goes_still_ends_the_one_before() -> None:
    """Without the `;`, `(foo)()` would call `1`."""
    assert erased("let x = 1\ntype A = B\n(foo)()") == "let x = 1\n;         \n(foo)()"


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("enum E { A }", "an enum (line 1)"),
        ("const enum E { A }", "an enum"),
        ("namespace N { export const a = 1 }", "a namespace"),
        ("\n@sealed class K {}", "a decorator (line 2)"),
        ("class K { constructor(private x: number) {} }", "a parameter property"),
        ("class K { constructor(readonly x: number) {} }", "a parameter property"),
        ("function f(this: Window) {}", "a this parameter"),
        ("let v = <any>w", "a <T> cast"),
        ("import fs = require('fs')", "import = require()"),
        ("export = 1", "export ="),
        ("const a = 1; export { type a }", "a type among imported or exported names"),
        ("const f = (a):\n  number => a", "a line break before an arrow function's =>"),
        ("let y = x as any\n(z)", "code right after an `as` type (line 1)"),
        ("let y = (x as any).b; let z = x as any\n.b", "code right after an `as` type (line 1)"),
        ("let q = z satisfies number\n[0]", "a type's line starting with ["),
        ("let x: = 1", "a syntax error (line 1)"),
        ("let a = 1\nlet b = (", "a syntax error (line 2)"),
    ],
)
def test_what_needs_a_compiler_is_refused_saying_what_and_where(code: str, reason: str) -> None:
    assert reason in refused(code)


def test_a_declare_block_goes_whole_whatever_it_holds() -> None:
    """TypeScript emits nothing for a `declare`d statement, even a body with code in it
    (an error to the compiler, never code to run)."""
    code = "declare namespace N { globalThis.hacked = true }\ndeclare module 'm' { f() }\n1"
    assert erased(code) == (
        ";                                               \n;                         \n1"
    )


@pytest.mark.parametrize(
    "code",
    [
        # Code can hide in no type: comments and strings in types are types.
        "let a: number /* */ = 1; a",
        "let b: '*/ evil() /*' = '*/ evil() /*'",
        "type T = `${'a'}`; let c: T = 'a'",
        # An escaped keyword is no keyword: `\\u0065num` names a variable.
        "let \\u0065num = 1; \\u0065num",
        # `a < b > (c)` is a call with a type argument to TypeScript too.
        "a < b > (c)",
        # Generic arrow functions in every spelling.
        "const f = <T,>(x: T) => x; const g = <T extends unknown>(x: T) => x",
        # A type after `as` or `satisfies` goes whole, type arguments and all.
        "const l = { a: 1 } as const satisfies Record<string, number>; l",
        # The call binds first, whatever operator is before it.
        "!f<T>(x); a + b.c<T>(x); await g<T>(); typeof h<T>()",
        # Comparisons nothing but a comparison could be, in a `? :` or with `&&`.
        'const s = n < 0 ? "neg" : n > 0 ? "pos" : "zero"',
        "for (let i: number = 0; i < 10 && i > -1; i++) {}",
        "xs.filter((x: number) => x < 5).map((y) => y > 2)",
        "if (a < b) { b = a > 0 ? 1 : 2 }",
        "const ok = a < b || b > 3; const t = `${a < b}${b > a}`",
        # Functions with return types in a false branch, in brackets.
        "const r = c ? (x) : (y) => { const f = (q): number => q; return f }",
        "const r = c ? async (x): T => a + (z) : w => 1",
    ],
)
def test_types_that_hide_nothing_are_erased(code: str) -> None:
    erased(code)


@pytest.mark.parametrize(
    "code",
    [
        "\\u0065num E { A }",  # an identifier, then a block: not the enum it looks like
        "let x: number\u2028= 1",
        "let s = x as T\n`tag`",
        "let t = x satisfies T\n?.y",
        "declare\nenum E { A }",  # `declare` alone on its line is an expression
    ],
)
def test_readings_erasure_could_change_are_refused_or_kept_exactly(code: str) -> None:
    """Either refused, or erased to text the check found to read the same."""
    result = erase(js_syntax.parse(code, "typescript"))
    if isinstance(result, Erased):
        _assert_kept_in_place(code, result.code)


def test_a_call_with_type_arguments_reads_as_typescript_reads_it() -> None:
    """The grammar reads `await f<T>()` as `(await f)<T>()`; the erased program must
    still be the call TypeScript means, and is run."""
    javascript = erased("const r = await Promise.resolve<number>(42); r")
    assert javascript == "const r = await Promise.resolve        (42); r"


@pytest.mark.parametrize(
    ("code", "lacks"),
    [
        ("const x: number = 1; x", None),
        ("enum E { A }", "TypeScript that needs a compiler: an enum (line 1)"),
        ("import { z } from 'npm:zod'; z", "modules to import"),
        ("const m: string = await import('./m.ts')", "modules to import"),
        ("import type { Z } from 'zod'; 1", None),
        ("const p: number = Deno.pid", "Deno's globals: Deno"),
        ("const q: number = globalThis.process.pid", "Deno's globals: process"),
        ("function f(name: string) { return name }; f('a')", None),
        ("close()", "Deno's globals: close"),
        ("const n: string = (1234.5).toLocaleString('de')", "a locale (Intl)"),
        ("let t: Deno.Signal", None),  # a type: gone with it
    ],
)
def test_the_rule_for_wasm_js_names_what_a_program_needs(code: str, lacks: str | None) -> None:
    assert typescript_lacks(code, SyntaxMemo()) == lacks


_PIECES = [
    "let a: number = 1",
    "const b = a as unknown as string",
    "interface I { x: number; y?: string }",
    "type U = I | null",
    "function f<T>(v: T): T { return v }",
    "f<number>(a)",
    "class C<T> { private v!: T; get(): T { return this.v } }",
    "enum E { A }",
    "x!",
    "(",
    ")",
    "{",
    "}",
    "\n",
    "//",
    "/*",
    "`${",
    "'",
    "<",
    ">",
    ":",
    "?",
    "as",
    "satisfies",
    "declare",
    "@d",
    "\\u0061",
    "\u2028",
    ";",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(_PIECES), st.text(max_size=6)), max_size=12))
def test_any_text_is_erased_in_place_or_refused(pieces: list[str]) -> None:
    code = " ".join(pieces)
    result = erase(js_syntax.parse(code, "typescript"))
    if isinstance(result, Erased):
        _assert_kept_in_place(code, result.code)
        assert result.syntax.complete and result.syntax.code == result.code
    else:
        assert re.search(r"\w", result.reason)


@pytest.mark.parametrize(
    "code",
    [
        # `<…>`: comparisons to one grammar, type arguments to the other.
        "let lo = 1, mid = 3\nconsole.log(lo < mid, mid > -1)",
        "console.log([a < b, c > -d])",
        "const idn = id<number>\nconsole.log(typeof idn)",
        "html<string>`a${1}b`",
        "let v = g <() => any>\nconsole.log(v)",
        "new Array<any> - b",
        # Literal, object, indexed and function types: a tagged template's, or an
        # instantiation ended by a line break, to TypeScript.
        'const r = tag<Row | "none">`hello`',
        'a<"x" | "y">`c`',
        'f(a < "x", B > `c`)',
        "r = a < B | -1 >\nc;",
        'r = a < B | "x" > // note\nc;',
        "r = a < {} >\nc;",
        'r = a < C["x"] >\nc;',
        "r = a < (() => 1) | B >\nc;",
        "r = a < \\u0042 >\nc",
        # A true branch TypeScript reads as an arrow function with a return type.
        "const pick = first ? (a, b): number => (a) : (a) => a",
        "const r = c ? (x): any => (z) : w => 1",
        "const r = c ? (x): T => a + (z) : w => 1",
        # Unicode space and line breaks around what follows an `as` type.
        "let y = f as any\u00a0\n(2)",
        "let y = f as any\u2028(2)",
        "let y = f as any //c\u2028(2)",
        "let y = f as any\ufeff\n.a",
        "let q = z satisfies number\u2028[0]",
        "let r = x as any ++",
        "-a as number ** 2",
        "x\nsatisfies T",
        "1as number",
        "x as T!",
        # Line breaks JavaScript does not allow where types were.
        "const f = (): '\u2028' => 1",
        "const g = (x: number)\n: number => x",
        "const h = async <T,>\n(x: T) => x",
        # Class members TypeScript reads otherwise.
        "class A { get: number\n foo() { return 1 } }",
        "class A { static: number\n foo() {} }",
        "class K { readonly\n x = 2 }",
        "class K { private\n m() {} }",
        "class K { readonly m() {} }",
        # Statements TypeScript reads as declarations across a line.
        "let declare = 5\ndeclare\nlet x = 1",
        "declare//c\nlet x = 1",
        "abstract\nclass C {}",
        "export\ntype T = 1",
        "interface\nI {}",
        # What swc accepts and JavaScript does not.
        "((...x, y: any) => x)",
        "let v = g ++!",
    ],
)
def test_readings_found_by_attack_are_refused(code: str) -> None:
    result = erase(js_syntax.parse(code, "typescript"))
    assert isinstance(result, NotErasable), result


@pytest.mark.parametrize(
    "code",
    [
        "typeof (globalThis as any).Deno",
        "const { Deno } = globalThis as any",
        "(0, globalThis).Deno",
        "globalThis.globalThis.Deno",
        "const g = globalThis; g.Deno",
        "function f(Deno: any) {}\ntypeof Deno",
        "const { process: p } = globalThis as any; p",
        "let h: any; h = window; h.navigator",
    ],
)
def test_deno_reached_another_way_still_goes_to_deno(code: str) -> None:
    assert typescript_lacks(code, SyntaxMemo()) is not None


def test_a_chain_of_comparisons_is_read_a_few_at_a_time() -> None:
    """Each `<` reads at most eight more `<` as nested type arguments, then asks only
    whether a `>` follows: 5,000 chained took seconds when each read 4 KiB ahead, and
    ten comparisons with no `>` after them were refused."""
    code = "let r = " + " < ".join(f"a{i}" for i in range(5000)) + " > c"
    assert "may read as types" in refused(code)
    erased("const a = 1; const t = [a<1, a<2, a<3, a<4, a<5, a<6, a<7, a<8, a<9, a<10]")


def test_nested_conditionals_are_each_looked_through_once() -> None:
    """A conditional's false branch is looked through for a typed arrow function once
    for all the conditionals around it (each used to look through the rest of the
    chain: 800 nested took a second), and a long program of them is erased."""
    chain = " ".join(f"c{i} ? (x{i}) :" for i in range(800))
    erased(f"let r = {chain} 0")
    assert "true branch" in refused(f"let r = {chain} (z): w => 1")
    lines = "".join(f"let v{i} = c ? f({i}) : f({i}) + f({i}) * f({i});\n" for i in range(400))
    erased("let c = true; const f = (v: number) => v;\n" + lines)


def test_hostile_text_in_types_and_code_is_erased_in_place() -> None:
    """Lone surrogates (legal in JSON, and so in a program) in a type and in a string,
    and a 5,000-digit number: erased like any other text."""
    # The surrogate is one column: one space.
    assert erased("let x: '\udfff' = '\ud800'; x") == "let x      = '\ud800'; x"
    digits = "9" * 5000
    assert erased(f"let n: number = {digits}; n") == f"let n         = {digits}; n"


class _EveryKind:
    def __contains__(self, kind: object) -> bool:
        return True


def test_nodes_passed_straight_through_are_ones_the_eraser_leaves_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The walk sends only the kinds in `_READ` through the eraser's cases: read with
    every node sent through them, generated programs (and the same cut and spliced
    at random) erase to the same text or are refused for the same reason."""
    from conduit.executors import ts_erase
    from tests.executors.test_ts_erase_deno import program

    def outcome(code: str) -> str:
        result = erase(js_syntax.parse(code, "typescript"))
        return result.code if isinstance(result, Erased) else f"refused: {result.reason}"

    r = random.Random(29)
    programs = [program(r) for _ in range(150)]
    for code in programs[:150]:
        cut = r.randrange(len(code))
        programs.append(code[:cut] + r.choice(" :<>?!;`/*") + code[cut + r.randint(0, 3) :])
    fast = [outcome(code) for code in programs]
    monkeypatch.setattr(ts_erase, "_READ", _EveryKind())
    assert [outcome(code) for code in programs] == fast
    assert any(not text.startswith("refused") for text in fast)
    assert any(text.startswith("refused") for text in fast)
