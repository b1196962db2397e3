"""Which JavaScript programs rely on what wasm-js lacks (ICU: `Intl` and locales), read
from their tokens. The registry sends them to an executor that has it (tests/e2e)."""

from __future__ import annotations

import pytest

from conduit.executors.wasm_js import WasmJsExecutor, uses_intl


@pytest.mark.parametrize(
    "code",
    [
        'new Intl.NumberFormat("de-DE").format(1234.5)',
        "const { DateTimeFormat } = Intl;",
        "globalThis.Intl",
        '(1234.5).toLocaleString("de-DE")',
        "(1234567.891).toLocaleString()",  # the default locale's grouping, too
        'new Date(0).toLocaleDateString(undefined, { weekday: "long" })',
        "d?.toLocaleTimeString()",
        "names.sort((a, b) => a.localeCompare(b))",
        '"i".toLocaleUpperCase("tr")',
        'const s = `${n.toLocaleString("fr")}`;',
    ],
)
def test_programs_that_use_intl(code: str) -> None:
    assert uses_intl(code)
    assert WasmJsExecutor.lacks(code) == "Intl"


@pytest.mark.parametrize(
    "code",
    [
        "1 + 1",
        '// Intl would be nice\nconst s = "toLocaleString()";\ns',
        "/Intl/.test(x)",
        "const Intlx = 1; const toLocaleStringy = 2;",
        "x.toLocaleUpperCase()",  # no locale named: the same as toUpperCase
        "const f = x.toLocaleString;",  # not called
        'toLocaleString("de")',  # a function of the program's, not the method
        '"unterminated Intl',  # not JavaScript: the executor reports it
    ],
)
def test_programs_that_do_not(code: str) -> None:
    assert not uses_intl(code)
    assert WasmJsExecutor.lacks(code) is None
