"""Generated TypeScript, run by real Deno as TypeScript and as the JavaScript erasure
makes of it: every program the rule lets wasm-js run must mean the same in both.

A seeded generator builds programs from the pieces erasure has to get right (types
in every position, `as`, `satisfies`, `!`, generics beside comparisons, classes with
modifiers, line breaks, comments and Unicode space between them). Each program Deno
would take is run once as a `.ts` module and once as the erased `.js` module (strict,
as wasm-js runs it), all in one Deno process; what each prints and how it ends must
match.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
from pathlib import Path
from typing import Any

from conduit.executors import js_syntax, ts_erase
from conduit.executors.syntax_memo import SyntaxMemo
from conduit.executors.wasm_js import typescript_lacks
from tests.executors.test_js_session import find_deno_bin

PROGRAMS = 300
SEED = 20261128

_RUNNER = """
const files = JSON.parse(Deno.args[0]);
const out = [];
for (const file of files) {
  const logs = [];
  const log = console.log;
  const show = (p) => (typeof p === "string" ? p : Deno.inspect(p));
  console.log = (...parts) => logs.push(parts.map(show).join(" "));
  try {
    const value = await (await import(file)).default();
    out.push({ ok: Deno.inspect(value, { depth: 4 }), logs });
  } catch (e) {
    // Deno reports a module TypeScript refuses as a TypeError saying SyntaxError.
    const invalid = e?.name === "SyntaxError" || String(e?.message).startsWith("SyntaxError");
    out.push({ error: String(e?.name), invalid, logs });
  } finally {
    console.log = log;
  }
}
await Deno.writeTextFile(Deno.args[1], JSON.stringify(out));
"""

_HEADER = (
    "let a: any = 6, b: any = 2, c: any = 3, k = 'kk'\n"
    "let f: any = (...x: any[]) => x.length ? x[0] : 'F', o: any = { p: { x: 1 } }\n"
    "type T = any; type U = number; interface I { a?: number }\n"
)
_SPACE = [" ", " ", " ", "\n", "/*c*/", "//c\n", "\t", "\u00a0", "\u2028", "\n\n"]
_OPERATORS = ["<", ">", "+", "-", "*", "<=", "&&", ","]
_TYPES = [
    "any",
    "number",
    "T",
    "U[]",
    "I | null",
    "{ a: 1 }",
    "`x${string}`",
    "() => any",
    "[1, 2]",
]


def _gap(r: random.Random) -> str:
    return r.choice(_SPACE) if r.random() < 0.35 else " "


def _expression(r: random.Random, depth: int = 0) -> str:
    if depth > 2 or r.random() < 0.3:
        return r.choice(["a", "b", "c", "1", "-1", "'s'", "`t${a}`", "(b)", "o.p", "[1]", "k"])
    inner = _expression(r, depth + 1)
    other = _expression(r, depth + 1)
    ty = r.choice(_TYPES)
    return r.choice(
        [
            f"{inner}{_gap(r)}as{_gap(r)}{ty}",
            f"{inner}{_gap(r)}satisfies{_gap(r)}{ty}",
            f"({inner})!",
            f"f<{ty}>{_gap(r)}({inner})",
            f"{inner}{_gap(r)}{r.choice(_OPERATORS)}{_gap(r)}{other}",
            f"{inner}{_gap(r)}<{_gap(r)}{other}{_gap(r)}>{_gap(r)}{_expression(r, depth + 1)}",
            f"({inner}){_gap(r)}({other})",
            f"o?.p{r.choice(['!', ''])}.x",
            f"((x{r.choice(['', '?'])}: {ty}): {ty}{_gap(r)}=> {inner})(1)",
            f"new Array<{ty}>({r.choice(['', '2'])})",
        ]
    )


def _class(r: random.Random, name: str) -> str:
    members = []
    for _ in range(r.randrange(1, 4)):
        modifier = r.choice(
            ["", "public ", "private ", "readonly ", "static ", "override ", "declare "]
        )
        field = r.choice(["x", "y", "get", "static", "readonly", "in"])
        members.append(
            r.choice(
                [
                    f"{modifier}{field}{r.choice(['', '?', '!'])}: {r.choice(_TYPES)}{_gap(r)}",
                    f"{modifier}{field}: number = {_expression(r)}",
                    f"{modifier}m<T>(v: T): T {{ return v }}",
                    f"[key: string]: any{_gap(r)}",
                ]
            )
            + r.choice([";", "\n", " "])
        )
    return f"class {name} {{ {''.join(members)} }}"


def program(r: random.Random) -> str:
    lines = [_HEADER.rstrip("\n")]
    shown = []
    for index in range(r.randrange(1, 4)):
        name = f"v{index}"
        if r.random() < 0.3:
            lines.append(_class(r, f"K{index}"))
            lines.append(
                f"let {name}: any; try {{ const made: any = new K{index}(); "
                f"{name} = [Object.keys(made), Object.getOwnPropertyNames(K{index}.prototype)] }} "
                f"catch (e) {{ {name} = String(e) }}"
            )
        else:
            lines.append(f"let {name}{r.choice(['', ': any', '!: any'])} = {_expression(r)}")
        shown.append(f"typeof {name} === 'function' ? 'function' : {name}")
    lines.append(f"console.log({', '.join(shown)})")
    return "\n".join(lines)


def _modules(code: str, erased: ts_erase.Erased) -> tuple[str, str]:
    typescript = js_syntax.prepare_module(code, "typescript").text
    javascript = js_syntax.prepare_parsed(erased.code, erased.syntax).text
    strict = javascript.replace("async function () {", 'async function () {"use strict";', 1)
    return typescript, strict


def _outcome(result: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """How a run ended (an error by its type: the engines word theirs differently) and
    what it printed, spacing aside."""
    logs = tuple(re.sub(r"\s+", "", line) for line in result["logs"])
    return (result.get("error") or "ok"), logs


def test_what_wasm_js_is_given_means_what_it_means_to_deno(tmp_path: Path) -> None:
    r = random.Random(SEED)
    pairs: list[tuple[str, str, str]] = []
    while len(pairs) < PROGRAMS:
        code = program(r)
        if typescript_lacks(code, SyntaxMemo()) is None:
            erased = ts_erase.erase(js_syntax.parse(code, "typescript"))
            assert isinstance(erased, ts_erase.Erased)
            pairs.append((code, *_modules(code, erased)))
    files = []
    for index, (_, typescript, javascript) in enumerate(pairs):
        for suffix, text in (("ts", typescript), ("js", javascript)):
            path = tmp_path / f"p{index}.{suffix}"
            path.write_text(text)
            files.append(path.as_uri())
    (tmp_path / "run.js").write_text(_RUNNER)
    out = tmp_path / "out.json"
    subprocess.run(
        [
            find_deno_bin(),
            *("run", "--no-config", "--no-lock", "--no-npm", "--no-remote", "-A"),
            *(str(tmp_path / "run.js"), json.dumps(files), str(out)),
        ],
        check=True,
        capture_output=True,
        timeout=300,
        cwd=tmp_path,
    )
    results = json.loads(out.read_text())
    differing = [
        (code, results[2 * i], results[2 * i + 1])
        for i, (code, _, _) in enumerate(pairs)
        if _outcome(results[2 * i]) != _outcome(results[2 * i + 1])
    ]
    # Programs that TypeScript refuses (a SyntaxError to Deno) may still run as
    # JavaScript: they mean nothing to compare with.
    meaningful = [d for d in differing if not d[1].get("invalid")]
    assert not meaningful, meaningful[:3]
    ran = sum(1 for i in range(len(pairs)) if "ok" in results[2 * i])
    assert ran > PROGRAMS // 2, f"only {ran} programs ran: the comparison compares little"
