"""Hypothesis strategies for what a hostile client, program or upstream can send.

Biased towards what has broken JSON daemons before: lone UTF-16 surrogates (legal in
JSON text, not encodable as UTF-8), control and bidi characters, integers past Python's
4,300-digit limit, non-finite floats, deep nesting and lines cut anywhere.
"""

from __future__ import annotations

import json
import os
from typing import Any

from hypothesis import strategies as st

__all__ = [
    "QUICK_RUN",
    "hostile_json",
    "hostile_lines",
    "hostile_numbers",
    "hostile_text",
    "json_escaped",
    "run_counts",
]

# Examples per property: a bounded run in the default suite, a long one marked slow
# that runs only with CONDUIT_FUZZ_LONG=1 (ten minutes on two cores: past the suite's
# budget). The long runs' counts are set per property, by its cost, and add up to over
# 100,000; a costly one is cut into parts, each of them well inside a test's time on a
# busy machine (pytest's faulthandler_timeout).
QUICK_RUN = 200
LONG_RUNS = os.environ.get("CONDUIT_FUZZ_LONG") == "1"


def run_counts(long: int, parts: int = 1) -> list[Any]:
    """Parametrize a property over the quick run and a long run of `long` examples, in
    `parts` independent parts (each draws its own examples)."""
    import pytest

    return [
        pytest.param(QUICK_RUN, id="quick"),
        *(
            pytest.param(
                long // parts,
                id=f"long-{part}",
                marks=[
                    pytest.mark.slow,
                    pytest.mark.skipif(not LONG_RUNS, reason="set CONDUIT_FUZZ_LONG=1"),
                ],
            )
            for part in range(1, parts + 1)
        ),
    ]


_NASTY_CHARS = st.sampled_from(
    [
        "\ud800",
        "\udfff",
        "\udc80",
        "\x00",
        "\x1b[2J",
        "\x1b]0;title\x07",
        "\x9b",
        "\u202e",
        "\r",
        "\n",
        '"',
        "\\",
        "\ufeff",
        "\U0001f600",
        "é",
    ]
)

hostile_text = st.one_of(
    st.text(max_size=40),
    st.lists(st.one_of(_NASTY_CHARS, st.text(max_size=4)), max_size=12).map("".join),
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=4),
)

hostile_numbers = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([0, -1, 2**53 + 1, 2**63, -(2**63) - 1]),
    # Past the 4,300-digit limit (made, not listed: such an int has no repr to list).
    st.integers(min_value=4301, max_value=4400).map(lambda digits: 10**digits),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(
        [float("nan"), float("inf"), float("-inf"), -0.0, 5e-324, 1.7976931348623157e308]
    ),
)

hostile_json = st.recursive(
    st.one_of(st.none(), st.booleans(), hostile_numbers, hostile_text),
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(hostile_text, children, max_size=5),
    ),
    max_leaves=25,
)


def json_escaped(value: Any) -> bytes:
    """`value` as JSON text the way a hostile peer may write it: surrogates as `\\u`
    escapes, non-finite floats as `NaN`/`Infinity`, integers past the digit limit as
    digits all the same (without lifting the process-wide limit the daemon relies on)."""
    return _written(value).encode("ascii")


def _written(value: Any) -> str:
    if isinstance(value, bool) or value is None or isinstance(value, str | float):
        return json.dumps(value, ensure_ascii=True)
    if isinstance(value, int):
        try:
            return str(value)
        except ValueError:
            return ("-" if value < 0 else "") + "7" * 4400
    if isinstance(value, list):
        return "[" + ",".join(_written(item) for item in value) + "]"
    return "{" + ",".join(f"{_written(k)}:{_written(v)}" for k, v in value.items()) + "}"


_FRAGMENTS = st.sampled_from(
    [
        b'{"jsonrpc":"2.0","id":1,"method":"ping"}',
        b'{"jsonrpc":"2.0","id":1,"method":"\\ud800"}',
        b'{"id":NaN,"method":"ping"}',
        b'{"id":1e400,"method":"ping"}',
        b'{"id":' + b"9" * 5000 + b',"method":"ping"}',
        b'{"id":1,"method":"ping","params":{"x":' + b"1" * 4301 + b"}}",
        b"[" * 5000 + b"]" * 5000,
        b'{"id":1,"method":"execute","params":{"language":"python","code":"\\udfff"}}',
        b"\xed\xa0\x80",
        b"\xff\xfe",
        b"\r",
        b"\n",
        b"[]",
        b"[1,2]",
        b"null",
        b'"',
        b"{",
    ]
)

hostile_lines = st.one_of(
    st.binary(max_size=200),
    st.lists(st.one_of(_FRAGMENTS, st.binary(max_size=8)), min_size=1, max_size=4).map(b"".join),
    hostile_json.map(json_escaped),
)
