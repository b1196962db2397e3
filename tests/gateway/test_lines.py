"""`LineSplitter`: an upstream's stdout in lines, a line past the cap skipped unheld."""

from __future__ import annotations

import pytest

from conduit.gateway.lines import ENDING_BYTES, OPENING_BYTES, LineSplitter, Oversize


def split(chunks: list[bytes], max_line_bytes: int = 100) -> list[bytes | Oversize]:
    splitter = LineSplitter(max_line_bytes)
    return [item for chunk in chunks for item in splitter.feed(chunk)]


def test_lines_come_whole_stripped_and_blank_ones_not_at_all() -> None:
    assert split([b"a", b"b\n  \n c \r\nd", b"\n", b"e"]) == [b"ab", b"c", b"d"]


@pytest.mark.parametrize("chunk_size", [1, 7, 100, 101, 5000])
def test_a_line_past_the_cap_is_skipped_and_the_next_one_read(chunk_size: int) -> None:
    long_line = b"<" + b"x" * 9000 + b">"
    stream = b"first\n" + long_line + b"\nnext\n"
    chunks = [stream[i : i + chunk_size] for i in range(0, len(stream), chunk_size)]
    assert split(chunks) == [
        b"first",
        Oversize(len(long_line), long_line[:OPENING_BYTES], long_line[-ENDING_BYTES:]),
        b"next",
    ]


def test_a_line_exactly_at_the_cap_is_read() -> None:
    assert split([b"y" * 100 + b"\n", b"z" * 101 + b"\n"]) == [
        b"y" * 100,
        Oversize(101, b"z" * 101, b"z" * 101),
    ]


def test_a_skipped_line_is_not_held() -> None:
    splitter = LineSplitter(1000)
    for _ in range(200):
        assert splitter.feed(b"x" * 65_536) == []
    assert len(splitter._buffer) == 0
    (skipped,) = splitter.feed(b"}\n")
    assert isinstance(skipped, Oversize)
    assert skipped.size == 200 * 65_536 + 1
    assert skipped.ending.endswith(b"x}")
