"""Text made safe for a terminal: nothing a terminal obeys survives, the rest reads."""

from __future__ import annotations

import json
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit.core.terminal import dumps, escape, escape_lines

# The bidi classes of the embeddings, overrides and isolates (Trojan Source); the marks
# (LRM, RLM, ALM) have the classes of letters, so they are named.
_BIDI_CONTROLS = {"LRE", "RLE", "LRO", "RLO", "PDF", "LRI", "RLI", "FSI", "PDI"}
_BIDI_MARKS = "\u200e\u200f\u061c"


def raw_controls(text: str, *, kept: str = "") -> list[str]:
    """The characters of `text` a terminal would obey, or could not print: controls
    (C0, DEL, C1), bidi controls and surrogates, less those in `kept`. Told apart by
    Unicode's own tables, not by the module under test."""
    return [
        char
        for char in text
        if char not in kept
        and (
            unicodedata.category(char) in ("Cc", "Cs")
            or unicodedata.bidirectional(char) in _BIDI_CONTROLS
            or char in _BIDI_MARKS
        )
    ]


# A loaded machine (two cores shared with other suites) must not fail a property on time.
_PATIENT = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Any text, surrogates included, weighted towards the characters that matter here.
_TEXT = st.text(
    st.one_of(
        st.characters(codec=None, exclude_categories=()),
        st.characters(min_codepoint=0, max_codepoint=0x9F),
        st.sampled_from("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\ud800"),
    )
)


@_PATIENT
@given(_TEXT)
def test_escape_leaves_nothing_a_terminal_obeys(text: str) -> None:
    shown = escape(text)
    assert raw_controls(shown) == []
    shown.encode()  # no lone surrogate left to fail on the way out


@_PATIENT
@given(_TEXT)
def test_escape_lines_keeps_only_line_feeds_and_tabs(text: str) -> None:
    shown = escape_lines(text)
    assert raw_controls(shown, kept="\n\t") == []
    assert shown.count("\n") == text.count("\n")
    shown.encode()


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=10,
)


@_PATIENT
@given(_JSON)
def test_dumps_is_safe_and_reads_back_as_the_same_value(value: object) -> None:
    for indent in (None, 2):
        shown = dumps(value, indent=indent)
        assert raw_controls(shown, kept="\n") == []
        assert json.loads(shown) == value


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("\x1b[2J", "\\x1b[2J"),
        ("\x1b]0;title\x07", "\\x1b]0;title\\x07"),
        ("\x9b31m", "\\x9b31m"),
        ("abc\u202edef", "abc\\u202edef"),
        ("over\rwrite", "over\\rwrite"),
        ("two\nlines\tand tab", "two\\nlines\\tand tab"),
        ("lone \ud800", "lone \\ud800"),
        ("del\x7f", "del\\x7f"),
        ("C:\\path é 日本", "C:\\path é 日本"),  # backslashes and letters stay as they are
    ],
)
def test_escape_shows_each_control_in_a_readable_form(text: str, shown: str) -> None:
    assert escape(text) == shown


def test_escape_lines_keeps_the_lines_and_escapes_the_rest() -> None:
    assert escape_lines("a\x1b[1m\r\n\tb") == "a\\x1b[1m\\r\n\tb"


def test_dumps_escapes_what_json_dumps_leaves_raw() -> None:
    assert dumps(["\x7f\x9b\u202e\ud800é"]) == '["\\u007f\\u009b\\u202e\\ud800é"]'
