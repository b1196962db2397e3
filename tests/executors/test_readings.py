"""What readers decided of a program, kept per owner and text (`Readings`) through a
request's `SyntaxMemo.decided`, bounded, and never from a parse that came to nothing."""

from __future__ import annotations

import pytest

from conduit.executors import js_syntax, readings
from conduit.executors.readings import MAX_CHARS, MISSING, Readings
from conduit.executors.syntax_memo import SyntaxMemo
from conduit.executors.wasm_js import WasmJsExecutor


class Decider:
    """A decision that counts how often it was made."""

    def __init__(self, value: object = "decided") -> None:
        self.value = value
        self.made = 0

    def __call__(self) -> object:
        self.made += 1
        return self.value


def decided(kept: Readings, owner: str, what: str, code: str, decide: Decider) -> object:
    """What a request of `owner` finds decided of `code`."""
    return SyntaxMemo(kept, owner).decided(what, code, decide)


def test_a_decision_is_made_once_per_owner_kind_and_text() -> None:
    kept = Readings()
    decide = Decider()
    for _ in range(3):
        assert decided(kept, "alice", "lacks", "1 + 1", decide) == "decided"
    assert decide.made == 1
    # An equal text that is another string object is the same program.
    decided(kept, "alice", "lacks", "".join(["1 +", " 1"]), decide)
    assert decide.made == 1
    decided(kept, "bob", "lacks", "1 + 1", decide)
    decided(kept, "alice", "module", "1 + 1", decide)
    decided(kept, "alice", "lacks", "1 + 2", decide)
    assert decide.made == 4
    assert len(kept) == 4


def test_a_memo_with_no_readings_decides_each_time() -> None:
    decide = Decider()
    memo = SyntaxMemo()
    memo.decided("lacks", "x", decide)
    memo.decided("lacks", "x", decide)
    assert decide.made == 2


def test_a_decision_not_shared_is_kept_for_the_request_alone() -> None:
    """The request's later readers find it, however long the program (`Readings`
    keeps nothing past MAX_CHARS), and it takes no place in `Readings`."""
    kept, decide = Readings(), Decider()
    memo = SyntaxMemo(kept, "alice")
    long = "x" * (MAX_CHARS + 1)
    memo.decided("moves", long, decide, shared=False)
    memo.decided("moves", "x" * (MAX_CHARS + 1), decide, shared=False)
    assert decide.made == 1
    memo.decided("moves", "y", decide, shared=False)
    SyntaxMemo(kept, "alice").decided("moves", long, decide, shared=False)
    assert (decide.made, len(kept)) == (3, 0)


def test_none_is_a_decision_kept_like_any_other() -> None:
    kept = Readings()
    decide = Decider(None)
    assert decided(kept, "alice", "lacks", "x", decide) is None
    assert decided(kept, "alice", "lacks", "x", decide) is None
    assert decide.made == 1
    assert kept.find("alice", "lacks", "x") is None
    assert kept.find("alice", "lacks", "y") is MISSING


def test_what_a_decision_raises_is_not_kept() -> None:
    kept = Readings()
    calls = 0

    def refuse() -> str:
        nonlocal calls
        calls += 1
        raise ValueError("no")

    for _ in range(2):
        with pytest.raises(ValueError, match="no"):
            SyntaxMemo(kept, "alice").decided("module", "x", refuse)
    assert calls == 2
    assert len(kept) == 0


def test_a_program_longer_than_the_limit_is_read_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(readings, "MAX_CHARS", 10)
    kept = Readings()
    decide = Decider()
    decided(kept, "alice", "lacks", "x" * 11, decide)
    decided(kept, "alice", "lacks", "x" * 11, decide)
    assert decide.made == 2
    decided(kept, "alice", "lacks", "x" * 10, decide)
    decided(kept, "alice", "lacks", "x" * 10, decide)
    assert decide.made == 3


def test_past_its_budget_the_least_recently_used_go_first() -> None:
    entry = 4 * 100 + readings.ENTRY_CHARS
    kept = Readings(budget_chars=3 * entry)
    texts = [f"{i:03d}".ljust(100) for i in range(4)]
    decide = Decider()
    for text in texts[:3]:
        decided(kept, "alice", "lacks", text, decide)
    decided(kept, "alice", "lacks", texts[0], decide)  # used again: now the most recent
    decided(kept, "alice", "lacks", texts[3], decide)  # over budget: texts[1] goes
    assert (len(kept), decide.made) == (3, 4)
    for text in (texts[0], texts[2], texts[3]):
        decided(kept, "alice", "lacks", text, decide)
    assert decide.made == 4
    decided(kept, "alice", "lacks", texts[1], decide)
    assert decide.made == 5
    assert len(kept) == 3


def test_what_one_owner_reads_pushes_out_nothing_of_anothers() -> None:
    """Otherwise one principal could count another's new programs by timing its own."""
    entry = 4 * 100 + readings.ENTRY_CHARS
    kept = Readings(budget_chars=3 * entry)
    mine = [f"a{i}".ljust(100) for i in range(3)]
    decide = Decider()
    for text in mine:
        decided(kept, "alice", "lacks", text, decide)
    for i in range(50):
        decided(kept, "bob", "lacks", f"b{i}".ljust(100), decide)
    made = decide.made
    for text in mine:
        decided(kept, "alice", "lacks", text, decide)
    assert decide.made == made


def test_past_the_owner_limit_the_least_recently_reading_owner_goes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(readings, "MAX_OWNERS", 2)
    kept = Readings()
    decide = Decider()
    for owner in ("alice", "bob", "alice", "carol"):  # carol pushes bob's entries out
        decided(kept, owner, "lacks", "x", decide)
    assert decide.made == 3
    decided(kept, "alice", "lacks", "x", decide)
    decided(kept, "carol", "lacks", "x", decide)
    assert decide.made == 3
    decided(kept, "bob", "lacks", "x", decide)
    assert decide.made == 4


def test_text_that_is_not_valid_unicode_is_a_key_like_any_other() -> None:
    kept = Readings()
    decide = Decider()
    lone = "'\ud800'"
    decided(kept, "alice", "lacks", lone, decide)
    decided(kept, "alice", "lacks", lone, decide)
    decided(kept, "alice", "lacks", "'\udc00'", decide)
    assert decide.made == 2


@pytest.mark.parametrize(
    ("language", "unread"),
    [("typescript", "typescript"), ("typescript", "javascript"), ("javascript", "javascript")],
)
def test_a_decision_made_when_a_parse_came_to_nothing_is_not_kept(
    monkeypatch: pytest.MonkeyPatch, language: str, unread: str
) -> None:
    """A parse that ran out of time (or found no thread) decides by default (deno, for
    TypeScript); the same text is read again next time, and may then be read whole."""
    code = "const n: number = new Intl.NumberFormat('en').format(2);\nn"
    if language == "javascript":
        code = code.replace(": number", "")
    original = js_syntax._parse_program
    failing = True

    def parse(data: bytes, dialect: js_syntax.Dialect) -> object:
        return None if failing and dialect == unread else original(data, dialect)

    monkeypatch.setattr(js_syntax, "_parse_program", parse)
    kept = Readings()
    lacks = WasmJsExecutor.lacks(code, SyntaxMemo(kept, "alice"), language)
    if language == "typescript":
        assert lacks == "TypeScript that needs a compiler: more text than is read " + (
            "(see js_syntax.parse)"
        )
    else:
        assert lacks is None  # unread: Intl not seen
    assert len(kept) == 0
    failing = False
    read = WasmJsExecutor.lacks(code, SyntaxMemo(kept, "alice"), language)
    assert read == "Deno's globals: Intl"
    assert len(kept) == 1


def test_a_decision_is_not_kept_when_any_parse_in_it_came_to_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whoever parsed (the memo, or the erasure's own parses of the erased text and of
    the text without call type arguments): the count of parses that came to nothing
    tells."""
    code = "const f = <T,>(x: T): T => x;\nconst n: number = 1 + f<number>(2);\nn"
    original = js_syntax._parse_program
    calls = 0

    def third_fails(data: bytes, dialect: js_syntax.Dialect) -> object:
        nonlocal calls
        calls += 1
        return None if calls == 3 else original(data, dialect)

    monkeypatch.setattr(js_syntax, "_parse_program", third_fails)
    kept = Readings()
    first = WasmJsExecutor.lacks(code, SyntaxMemo(kept, "alice"), "typescript")
    assert first is not None and "more text than is read" in first
    assert calls == 3  # TypeScript, the erased JavaScript, and without type arguments
    assert len(kept) == 0
    assert WasmJsExecutor.lacks(code, SyntaxMemo(kept, "alice"), "typescript") is None
    assert len(kept) == 1
