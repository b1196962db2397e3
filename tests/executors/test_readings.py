"""`Readings`: what readers decided of a program, kept per owner and text, bounded."""

from __future__ import annotations

import pytest

from conduit.executors import readings
from conduit.executors.readings import Readings


class Decider:
    """A decision that counts how often it was made."""

    def __init__(self, value: object = "decided") -> None:
        self.value = value
        self.made = 0

    def __call__(self) -> object:
        self.made += 1
        return self.value


def test_a_decision_is_made_once_per_owner_kind_and_text() -> None:
    kept = Readings()
    decide = Decider()
    for _ in range(3):
        assert kept.decided("alice", "lacks", "1 + 1", decide) == "decided"
    assert decide.made == 1
    # An equal text that is another string object is the same program.
    kept.decided("alice", "lacks", "".join(["1 +", " 1"]), decide)
    assert decide.made == 1
    kept.decided("bob", "lacks", "1 + 1", decide)
    kept.decided("alice", "module", "1 + 1", decide)
    kept.decided("alice", "lacks", "1 + 2", decide)
    assert decide.made == 4
    assert len(kept) == 4


def test_none_is_a_decision_kept_like_any_other() -> None:
    kept = Readings()
    decide = Decider(None)
    assert kept.decided("alice", "lacks", "x", decide) is None
    assert kept.decided("alice", "lacks", "x", decide) is None
    assert decide.made == 1


def test_what_a_decision_raises_is_not_kept() -> None:
    kept = Readings()
    calls = 0

    def refuse() -> str:
        nonlocal calls
        calls += 1
        raise ValueError("no")

    for _ in range(2):
        with pytest.raises(ValueError, match="no"):
            kept.decided("alice", "module", "x", refuse)
    assert calls == 2
    assert len(kept) == 0


def test_a_program_longer_than_the_limit_is_read_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(readings, "MAX_CHARS", 10)
    kept = Readings()
    decide = Decider()
    kept.decided("alice", "lacks", "x" * 11, decide)
    kept.decided("alice", "lacks", "x" * 11, decide)
    assert decide.made == 2
    kept.decided("alice", "lacks", "x" * 10, decide)
    kept.decided("alice", "lacks", "x" * 10, decide)
    assert decide.made == 3


def test_past_its_budget_the_least_recently_used_go_first() -> None:
    entry = 2 * 100 + readings.ENTRY_CHARS
    kept = Readings(budget_chars=3 * entry)
    texts = [f"{i:03d}".ljust(100) for i in range(4)]
    decide = Decider()
    for text in texts[:3]:
        kept.decided("alice", "lacks", text, decide)
    kept.decided("alice", "lacks", texts[0], decide)  # used again: now the most recent
    kept.decided("alice", "lacks", texts[3], decide)  # over budget: texts[1] goes
    assert (len(kept), decide.made) == (3, 4)
    for text in (texts[0], texts[2], texts[3]):
        kept.decided("alice", "lacks", text, decide)
    assert decide.made == 4
    kept.decided("alice", "lacks", texts[1], decide)
    assert decide.made == 5
    assert len(kept) == 3


def test_text_that_is_not_valid_unicode_is_a_key_like_any_other() -> None:
    kept = Readings()
    decide = Decider()
    lone = "'\ud800'"
    kept.decided("alice", "lacks", lone, decide)
    kept.decided("alice", "lacks", lone, decide)
    kept.decided("alice", "lacks", "'\udc00'", decide)
    assert decide.made == 2
