"""Generated input against the framing, the decoder and the encoder, in-process.

The properties: no input makes them raise anything but the errors they document, and
everything the daemon would send is valid UTF-8 and valid JSON (no NaN, no lone
surrogate, no number Python cannot print).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit.core import jsontext
from conduit.core.errors import InvalidRequest, ParseError, RpcError
from conduit.core.framing import LineReader, Oversize
from conduit.core.protocol import decode, encode, error_reply, parse_request, request_id
from tests.fuzz.strategies import hostile_json, hostile_lines, run_counts

QUIET = {
    "deadline": None,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}


def strict_json(data: bytes) -> Any:
    """Decode as a strict peer would: UTF-8 only, no NaN/Infinity, no lone surrogate."""

    def refuse(name: str) -> Any:
        raise AssertionError(f"{name} sent")

    value = json.loads(data.decode("utf-8"), parse_constant=refuse)
    text = json.dumps(value, ensure_ascii=False)
    text.encode("utf-8")  # raises on a lone surrogate that came through as an escape
    return value


@pytest.mark.parametrize("examples", run_counts(45_000, parts=5))
def test_the_decoder_refuses_or_decodes_and_what_it_decodes_encodes(examples: int) -> None:
    @settings(max_examples=examples, **QUIET)
    @given(hostile_lines)
    def prop(line: bytes) -> None:
        try:
            message = decode(line)
        except ParseError as exc:
            strict_json(encode(error_reply(None, exc)))
            return
        strict_json(encode(message))
        try:
            request = parse_request(message)
        except InvalidRequest as exc:
            strict_json(encode(error_reply(request_id(message), exc)))
            return
        strict_json(encode({"id": request.id, "method": request.method, **request.params}))

    prop()


@pytest.mark.parametrize("examples", run_counts(45_000, parts=6))
def test_anything_the_daemon_holds_encodes_as_strict_json_and_reads_back(examples: int) -> None:
    @settings(max_examples=examples, **QUIET)
    @given(hostile_json)
    def prop(value: Any) -> None:
        sent = encode(value)
        strict_json(sent)
        strict_json(jsontext.dumps(value, indent=2).encode())
        strict_json(jsontext.dumps(value, ascii_only=True).encode())
        # The daemon reads back exactly what it wrote.
        assert decode(sent) == json.loads(sent)
        assert encode(decode(sent)) == sent

    prop()


@pytest.mark.parametrize("examples", run_counts(20_000))
def test_no_text_decodes_to_a_lone_surrogate_from_bytes_or_str(examples: int) -> None:
    @settings(max_examples=examples, **QUIET)
    @given(st.text(), st.booleans())
    def prop(text: str, as_escapes: bool) -> None:
        sent = json.dumps({"t": text}, ensure_ascii=as_escapes)
        decoded = jsontext.loads(sent)["t"]
        if as_escapes or jsontext.clean_text(text) == text:  # else no UTF-8 form
            assert jsontext.loads(sent.encode())["t"] == decoded
        decoded.encode("utf-8")  # raises on a surrogate left in
        cleaned = jsontext.clean_text(text)
        cleaned.encode("utf-8")
        assert (cleaned is text) == (cleaned == text)
        assert decoded == cleaned

    prop()


# Where `reference_lines` expects an `Oversize` (`read_all` gives it in its place).
OVERSIZE = object()


def reference_lines(data: bytes, limit: int) -> list[bytes | object]:
    """What `LineReader` must yield for `data`, whatever the chunking."""
    out: list[bytes | object] = []
    *complete, rest = data.split(b"\n")
    for line in complete:
        if len(line) > limit:
            out.append(OVERSIZE)
        elif line.rstrip(b"\r").strip():
            out.append(line.rstrip(b"\r"))
    if rest.strip():
        out.append(OVERSIZE if len(rest) > limit else rest.rstrip(b"\r"))
    return out


class _Chunks(trio.abc.ReceiveStream):
    """A stream that has every chunk ready: reading it never waits."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = list(reversed(chunks))

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return self._chunks.pop() if self._chunks else b""

    async def aclose(self) -> None:
        self._chunks.clear()


def read_all(chunks: list[bytes], limit: int) -> list[bytes | object]:
    """Every line `LineReader` yields for `chunks`, driven without an event loop: the
    stream never waits, so neither does the reader (thousands of examples a second)."""
    lines = LineReader(_Chunks(chunks), limit).__aiter__()
    out: list[bytes | object] = []
    while True:
        step = lines.__anext__()
        try:
            step.send(None)
        except StopIteration as done:
            out.append(OVERSIZE if isinstance(done.value, Oversize) else done.value)
            continue
        except StopAsyncIteration:
            return out
        step.close()
        raise AssertionError("the reader waited on a stream that never waits")


@pytest.mark.parametrize("examples", run_counts(3_000))
def test_framing_yields_the_same_lines_however_the_bytes_are_cut(examples: int) -> None:
    pieces = st.lists(
        st.one_of(hostile_lines, st.sampled_from([b"\n", b"\r\n", b" \n", b"x" * 70])),
        max_size=8,
    )

    @settings(max_examples=examples, **QUIET)
    @given(pieces, st.lists(st.integers(min_value=1, max_value=97), min_size=1, max_size=6))
    def prop(parts: list[bytes], cuts: list[int]) -> None:
        data = b"".join(parts)
        chunks, start, index = [], 0, 0
        while start < len(data):
            size = cuts[index % len(cuts)]
            chunks.append(data[start : start + size])
            start, index = start + size, index + 1
        lines = read_all(chunks, 64)
        expected = reference_lines(data, 64)
        assert lines == expected  # a line past the cap told once, at its end

    prop()


def test_every_error_reply_is_strict_json_whatever_its_message() -> None:
    @settings(max_examples=200, **QUIET)
    @given(hostile_text_and_data())
    def prop(pair: tuple[str, Any]) -> None:
        message, data = pair
        strict_json(encode(error_reply(1, RpcError(message, data))))

    prop()


def hostile_text_and_data() -> st.SearchStrategy[tuple[str, Any]]:
    from tests.fuzz.strategies import hostile_text

    return st.tuples(hostile_text, hostile_json)
