"""A request's `SyntaxMemo`: its readers share one parse, and the last one lets it go."""

from __future__ import annotations

import pytest

from conduit.executors import js_syntax
from conduit.executors.js_syntax import prepare_module, prepare_parsed
from conduit.executors.syntax_memo import SyntaxMemo
from conduit.executors.wasm_js import javascript_lacks
from tests.parses import count_parses

CODE = "import { sep } from 'node:path';\nconst n = new Intl.NumberFormat('en');\nsep"


def test_readers_of_one_program_share_its_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    parses = count_parses(monkeypatch)
    memo = SyntaxMemo()
    first = memo.parse(CODE, "javascript")
    assert first is not None
    assert memo.parse(CODE, "javascript") is first
    # An equal program that is another string object is the same program.
    assert memo.parse("".join(list(CODE)), "javascript") is first
    assert memo.take(CODE, "javascript") is first
    assert len(parses.made) == 1


def test_another_program_or_dialect_replaces_the_parse_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parses = count_parses(monkeypatch)
    memo = SyntaxMemo()
    as_javascript = memo.parse(CODE, "javascript")
    as_typescript = memo.parse(CODE, "typescript")
    assert as_javascript is not None and as_typescript is not None
    assert (as_javascript.dialect, as_typescript.dialect) == ("javascript", "typescript")
    other = memo.parse("1 + 1", "typescript")
    assert other is not None and other.code == "1 + 1"
    # One parse held at a time: going back means parsing again.
    assert memo.parse(CODE, "javascript") is not as_javascript
    assert [(parse.code, parse.dialect) for parse in parses.made] == [
        (CODE, "javascript"),
        (CODE, "typescript"),
        ("1 + 1", "typescript"),
        (CODE, "javascript"),
    ]


def test_the_last_reader_takes_the_parse_and_the_memo_lets_it_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parses = count_parses(monkeypatch)
    memo = SyntaxMemo()
    taken = memo.take(CODE, "javascript")
    assert taken is not None
    assert repr(memo) == "<SyntaxMemo empty>"
    assert memo.take(CODE, "javascript") is not taken  # asked again: parsed again
    memo.parse(CODE, "javascript")
    memo.forget()
    assert repr(memo) == "<SyntaxMemo empty>"
    assert len(parses.made) == 3


def test_a_program_too_large_to_parse_is_tried_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(js_syntax, "MAX_PARSE_BYTES", 20_000)
    parses = count_parses(monkeypatch)
    code = "x;\n" * 10_000
    memo = SyntaxMemo()
    assert memo.parse(code, "javascript") is None
    assert memo.take(code, "javascript") is None
    assert len(parses.made) == 1


@pytest.mark.parametrize(
    "code",
    [
        CODE,
        "#!/usr/bin/env -S deno run\nexport const x = 1;\nx",
        "const a = ;\nimport 'x';",  # a syntax error
        "",
    ],
)
def test_a_prepared_parse_is_the_module_prepare_module_makes(code: str) -> None:
    prepared = prepare_parsed(code, SyntaxMemo().take(code, "typescript"))
    assert prepared == prepare_module(code, "typescript")


def test_a_parse_of_another_program_is_refused() -> None:
    with pytest.raises(ValueError, match="another program"):
        prepare_parsed("2", js_syntax.parse("1", "typescript"))


def test_the_lacks_check_leaves_its_parse_for_the_executor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parses = count_parses(monkeypatch)
    memo = SyntaxMemo()
    assert javascript_lacks(CODE, memo) == "modules to import"
    prepared = prepare_parsed(CODE, memo.take(CODE, "javascript"))
    assert prepared.imports == ("import { sep } from 'node:path';",)
    assert len(parses.made) == 1
