"""Base64 and compact JSON through the fast codecs (pybase64, orjson) and without them
(a client installed alone): the same bytes, the same refusals, the same JSON."""

from __future__ import annotations

import base64
import binascii
import json
import os
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conduit.core import b64, jsontext

# Text standard base64 refuses or reads in its own way: padding past a full quantum,
# non-canonical trailing bits, characters outside the alphabet, non-ASCII.
EDGE_TEXTS = [
    "",
    "=",
    "==",
    "A",
    "AA",
    "AAA",
    "AAAA",
    "AA==",
    "AA=",
    "AAA=",
    "QQ==",
    "QR==",
    "AAAA=",
    "AAAA====",
    "AA==AA==",
    "AA=A",
    " AAAA",
    "AAAA\n",
    "AA\nAA",
    "AAA-",
    "AAA_",
    "ÿAAA",
    "Zm9vYh==",
    "++A+=",
]


@pytest.fixture(params=["fast", "standard"])
def codecs(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test twice: with the fast codecs, and as a client alone has them."""
    if request.param == "fast":
        assert b64.FAST and jsontext.orjson is not None, "the daemon's pins are installed"
    else:
        monkeypatch.setattr(b64, "pybase64", None)
        monkeypatch.setattr(jsontext, "orjson", None)
    return str(request.param)


def _standard(text: str | bytes) -> bytes | None:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        return None


def _ours(text: str | bytes) -> bytes | None:
    try:
        return b64.decode(text)
    except ValueError:
        return None


@pytest.mark.parametrize(
    "data", [b"", bytes(range(256)), bytes(range(256))[::-1] * 41, os.urandom(1 << 20)]
)
def test_base64_round_trips_every_byte_value(codecs: str, data: bytes) -> None:
    text = b64.encode(data)
    assert text == base64.b64encode(data).decode("ascii")
    assert b64.decode(text) == data
    assert b64.decode(text.encode()) == data


@pytest.mark.parametrize("text", EDGE_TEXTS)
def test_base64_accepts_and_refuses_what_the_standard_library_does(codecs: str, text: str) -> None:
    assert _ours(text) == _standard(text)
    if text.isascii():
        assert _ours(text.encode()) == _standard(text.encode())


def test_base64_refusals_are_value_errors(codecs: str) -> None:
    with pytest.raises(binascii.Error):
        b64.decode("AAA-")
    with pytest.raises(ValueError, match="ASCII"):
        b64.decode("ÿAAA")


VALUES: list[Any] = [
    {"files": [{"path": "in.bin", "base64": base64.b64encode(os.urandom(4096)).decode()}]},
    {"a": [1, -2, 2**63, 0.1, 1e-05, 1e22, None, True, "é\u2028\x00"], "b": {}},
    {"nan": float("nan"), "inf": float("-inf"), "big": 2**70, "huge": 10**5000},
    {"lone": "a\ud800b", "\udfff": 1.5, "nested": [[["x\ud83d"]]]},
    {1: "a", None: "b", 2.5: "c"},
    ("tuple", {"set": "x"}, b"bytes"),
]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_json_is_strict_utf8_and_reads_back_to_what_it_writes(codecs: str, value: Any) -> None:
    sent = jsontext.encode(value)
    assert jsontext.dumps(value).encode("utf-8") == sent
    text = sent.decode("utf-8")  # strict: no lone surrogate got through
    json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} written"))
    assert jsontext.encode(jsontext.loads(sent)) == sent


def test_both_encoders_write_the_same_values(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = [json.loads(jsontext.encode(value)) for value in VALUES]
    monkeypatch.setattr(jsontext, "orjson", None)
    standard = [json.loads(jsontext.encode(value)) for value in VALUES]
    assert fast == standard


def _nesting(value: Any) -> int:
    """How deeply `value` nests, the plain recursive way."""
    if isinstance(value, dict):
        return 1 + max(map(_nesting, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_nesting, value), default=0)
    return 0


_JSON = st.recursive(
    st.none() | st.integers() | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3)
    ),
    max_leaves=30,
)


@given(_JSON, st.integers(min_value=0, max_value=8))
def test_json_depth_counts_as_recursion_would_up_to_just_past_the_limit(
    value: Any, limit: int
) -> None:
    nesting = _nesting(value)
    counted = jsontext.depth(value, limit)
    assert counted == nesting if nesting <= limit else counted == limit + 1


def test_json_depth_of_very_deep_values_needs_no_recursion() -> None:
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    assert jsontext.depth(deep, 128) == 129
    assert jsontext.depth({"a": [1, {"b": []}]}, 128) == 4
