"""`LineReader`: lines out of a stream, a line past the cap skipped unheld and told by
its size, opening and ending (where a JSON-RPC message's id is)."""

from __future__ import annotations

import contextlib

import pytest

from conduit.core.framing import ENDING_BYTES, OPENING_BYTES, LineReader, Oversize
from tests.fuzz.test_fuzz_wire import _Chunks


async def split(chunks: list[bytes], max_line_bytes: int = 100) -> list[bytes | Oversize]:
    return [line async for line in LineReader(_Chunks(chunks), max_line_bytes)]


async def test_lines_come_whole_and_blank_ones_not_at_all() -> None:
    assert await split([b"a", b"b\n  \n c \r\nd", b"\n", b"e"]) == [b"ab", b" c ", b"d", b"e"]


@pytest.mark.parametrize("chunk_size", [1, 7, 100, 101, 5000])
async def test_a_line_past_the_cap_is_skipped_and_the_next_one_read(chunk_size: int) -> None:
    long_line = b"<" + b"x" * 9000 + b">"
    stream = b"first\n" + long_line + b"\nnext\n"
    chunks = [stream[i : i + chunk_size] for i in range(0, len(stream), chunk_size)]
    assert await split(chunks) == [
        b"first",
        Oversize(len(long_line), long_line[:OPENING_BYTES], long_line[-ENDING_BYTES:]),
        b"next",
    ]


async def test_a_line_exactly_at_the_cap_is_read() -> None:
    assert await split([b"y" * 100 + b"\n", b"z" * 101 + b"\n"]) == [
        b"y" * 100,
        Oversize(101, b"z" * 101, b"z" * 101),
    ]


async def test_a_skipped_line_is_not_held_and_is_told_at_its_end() -> None:
    reader = LineReader(_Chunks([b"x" * 65_536] * 200 + [b"}\n", b"next\n"]), 1000)
    async with contextlib.aclosing(reader.__aiter__()) as lines:
        skipped = await lines.__anext__()
        assert len(reader._buffer) <= 65_536  # never more than one read
        assert isinstance(skipped, Oversize)
        assert skipped.size == 200 * 65_536 + 1
        assert skipped.ending.endswith(b"x}") and skipped.opening == b"x" * OPENING_BYTES
        assert await lines.__anext__() == b"next"


async def test_a_stream_that_ends_in_a_skipped_line_tells_it() -> None:
    assert await split([b"a\n", b"b" * 300]) == [b"a", Oversize(300, b"b" * 300, b"b" * 256)]
