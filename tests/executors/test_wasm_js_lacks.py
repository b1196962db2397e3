"""Which JavaScript programs use what wasm-js lacks (ICU, a module loader, what Deno
adds to the globals and the built-ins), read from their syntax. The registry sends them
to an executor that has it (tests/e2e/test_javascript_routes.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.executors.js_syntax import Member, parse
from conduit.executors.wasm_js import WasmJsExecutor, javascript_lacks


@pytest.mark.parametrize(
    ("code", "lacked"),
    [
        ('new Intl.NumberFormat("de-DE").format(1234.5)', "Deno's globals: Intl"),
        ("const { DateTimeFormat } = Intl;", "Deno's globals: Intl"),
        ("globalThis.Intl", "Deno's globals: Intl"),
        ('(1234.5).toLocaleString("de-DE")', "a locale (Intl)"),
        ("(1234567.891).toLocaleString()", "a locale (Intl)"),  # the default locale's grouping, too
        ('new Date(0).toLocaleDateString(undefined, { weekday: "long" })', "a locale (Intl)"),
        ("d?.toLocaleTimeString()", "a locale (Intl)"),
        ("names.sort((a, b) => a.localeCompare(b))", "a locale (Intl)"),
        ('"i".toLocaleUpperCase("tr")', "a locale (Intl)"),
        ('const s = `${n.toLocaleString("fr")}`;', "a locale (Intl)"),
        ('slug.normalize("NFD").replace(/[\\u0300-\\u036f]/g, "")', "the method normalize"),
        ("words.map((w) => w?.normalize())", "the method normalize"),
        ("/[\\p{L}\\p{N}]+/gu.test(text)", "Unicode property escapes"),
        ('new RegExp("\\\\P{Lu}", "u")', "Unicode property escapes"),
        ("URL.canParse(link)", "URL.canParse"),
        ("const { parse } = URL;\nparse(link)", "URL.parse"),
        ("(URL)?.parse(link)", "URL.parse"),
        ("Symbol.metadata in klass", "Symbol.metadata"),
        ('await crypto.subtle.generateKey(spec, true, ["sign"])', "the method generateKey"),
        (
            'const key = await subtle.importKey("jwk", jwk, ec, true, ["verify"]);',
            "the method importKey",
        ),
        ("SubtleCrypto.supports('encrypt', 'AES-GCM')", "SubtleCrypto.supports"),
        ('performance.mark("parsed");', "performance.mark"),
        ('Buffer.from("hi").toString("base64")', "Deno's globals: Buffer"),
        ("process.env.HOME ?? globalThis.navigator", "Deno's globals: navigator, process"),
        ("const n = 1; // runs on Deno too", "Deno's globals: Deno"),
        ('import { basename } from "node:path";\nbasename("/a/b")', "modules to import"),
        ('const fs = require("fs");', "modules to import"),
        ('const { sep } = await import("node:path");', "modules to import"),
        ("\\u0042uffer.alloc(1)", "Deno's globals: Buffer"),  # spelled with an escape
    ],
)
def test_programs_that_use_what_wasm_js_lacks(code: str, lacked: str) -> None:
    assert javascript_lacks(code) == lacked
    assert WasmJsExecutor.lacks(code) == lacked
    # The same rule holds for TypeScript, once its types are erased.
    assert WasmJsExecutor.lacks(code, language="typescript") == lacked


@pytest.mark.parametrize(
    "code",
    [
        "1 + 1",
        "const xs = [1, 2, 3];\nxs.reduce((a, b) => a + b, 0)",
        '// Intl would be nice\nconst s = "toLocaleString()";\ns',
        '"Buffer.from(x) and process.env, in a string"',
        "/Intl/.test(x)",
        "const Intlx = 1; const toLocaleStringy = 2;",
        "x.toLocaleUpperCase()",  # no locale named: the same as toUpperCase
        "const f = x.toLocaleString;",  # not called
        'toLocaleString("de")',  # a function of the program's, not the method
        "const normalize = (s) => s.trim();\nnormalize(' a ')",  # the program's own
        "JSON.parse(text).url",
        "new URL(link).searchParams.get('q')",
        'await crypto.subtle.digest("SHA-256", bytes)',  # the guest's own digest
        "user.name + (user.process ?? '')",  # properties of its own objects
        "class Buffer {}\nnew Buffer()",  # declared: the program's own
        "/\\w+/u.test(text)",
        '"unterminated Intl',  # not JavaScript: the executor reports it
    ],
)
def test_programs_that_do_not(code: str) -> None:
    assert javascript_lacks(code) is None
    assert WasmJsExecutor.lacks(code) is None


def test_member_reads_say_what_they_are_read_from_and_whether_called() -> None:
    syntax = parse(
        "URL.parse(a); x?.normalize; f().normalize(); const { canParse: c } = URL; "
        "(0, URL)['parse']",
        "javascript",
    )
    assert syntax is not None
    assert list(syntax.members({"parse", "normalize", "canParse"})) == [
        Member("URL", "parse", called=True),
        Member("x", "normalize", called=False),
        Member(None, "normalize", called=True),
        Member("URL", "canParse", called=False),
        Member("URL", "parse", called=False),
    ]


_PIECES = [
    "URL",
    "(URL)",
    ".",
    "?.",
    "parse",
    "canParse",
    "normalize",
    "(",
    ")",
    "[",
    "]",
    '"',
    "'",
    "`",
    "${",
    "}",
    "{",
    "=",
    "const ",
    "Buffer",
    "\\u0042uffer",
    "\\p{L}",
    "/",
    "u",
    "import",
    "require",
    "Intl",
    ".toLocaleString",
    "performance",
    "mark",
    ";",
    "\n",
    "\ud800",
    "é",
    ": string",
    "<T>",
    " as ",
    "//",
    "/*",
    "*/",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(_PIECES), st.text(max_size=4)), max_size=16))
def test_any_text_gets_an_answer_not_an_exception(pieces: list[str]) -> None:
    code = "".join(pieces)
    for language in ("javascript", "typescript"):
        lacked = WasmJsExecutor.lacks(code, language=language)
        assert lacked is None or isinstance(lacked, str)
