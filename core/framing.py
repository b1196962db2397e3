"""Newline-delimited framing: bytes in, lines out, with a size cap.

Knows nothing about JSON or JSON-RPC. A line longer than `max_line_bytes` is never
buffered whole: it is skipped as it comes, up to its newline, and reported once as an
`Oversize` (its length, and its first and last bytes, which is where a JSON-RPC
message's id is: a reader can tell which request it answered), so the stream stays
usable after it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Final

import trio

__all__ = ["ENDING_BYTES", "OPENING_BYTES", "LineReader", "Oversize", "encode_line"]

# 64 KiB reads keep syscalls few for pipelined small requests without hoarding memory.
_READ_SIZE: Final = 65_536
# Reads while a line longer than one small read is coming (a file's base64): a
# megabyte's line then takes a few wake-ups rather than one per 64 KiB.
_LONG_READ_SIZE: Final = 1 << 20


# How much of a skipped line's opening is kept: where a message that puts its id first
# has it (`protocol.unreadable_id` looks through as much).
OPENING_BYTES: Final = 4096
# How much of its end is kept: a message that puts its id last (`…,"id":"<id>"}`) has
# it in its last few dozen bytes.
ENDING_BYTES: Final = 256


@dataclass(frozen=True, slots=True)
class Oversize:
    """A line longer than the cap, skipped: its length, and its first and last bytes
    (`OPENING_BYTES`, `ENDING_BYTES`; without the newline)."""

    size: int
    opening: bytes
    ending: bytes


class _Skipping:
    """The line being skipped: counted, its opening and its last bytes kept."""

    def __init__(self, start: bytes | bytearray) -> None:
        self.size = len(start)
        self.opening = bytes(start[:OPENING_BYTES])
        self.ending = bytes(start[-ENDING_BYTES:])

    def add(self, part: bytes | bytearray) -> None:
        self.size += len(part)
        if len(self.opening) < OPENING_BYTES:  # a cap below OPENING_BYTES
            self.opening += part[: OPENING_BYTES - len(self.opening)]
        self.ending = (self.ending + bytes(part[-ENDING_BYTES:]))[-ENDING_BYTES:]

    def end(self, last: bytes | bytearray) -> Oversize:
        self.add(last)
        return Oversize(self.size, self.opening, self.ending)


class LineReader:
    """Yields each non-blank line of a stream (without its newline), or an `Oversize`
    once a line past the cap has ended (or the stream did, in it).

    Iteration ends when the peer closes its side. A trailing `\\r` is dropped so CRLF
    clients (some `nc` builds, telnet) work. The reader does not own the stream.
    """

    def __init__(self, stream: trio.abc.ReceiveStream, max_line_bytes: int) -> None:
        self._stream = stream
        self._max = max_line_bytes
        self._buffer = bytearray()
        # How much of the buffer is known to hold no newline: a long line arriving in
        # small reads is then searched once, not again from its start on each read.
        self._searched = 0
        # The line past the cap being skipped: counted as it comes, never held.
        self._skipping: _Skipping | None = None

    def __aiter__(self) -> AsyncIterator[bytes | Oversize]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[bytes | Oversize]:
        while True:
            for item in self._drain():
                yield item
            long_line = len(self._buffer) >= _READ_SIZE
            chunk = await self._stream.receive_some(_LONG_READ_SIZE if long_line else _READ_SIZE)
            if not chunk:
                if self._skipping is not None:
                    yield self._skipping.end(b"")
                elif self._buffer.strip():
                    yield self._take_rest()
                return
            self._buffer += chunk

    def _drain(self) -> list[bytes | Oversize]:
        items: list[bytes | Oversize] = []
        start = 0
        buffer = self._buffer
        while True:
            end = buffer.find(b"\n", max(start, self._searched))
            if end < 0:
                self._searched = len(buffer)
                break
            if self._skipping is not None:
                items.append(self._skipping.end(buffer[start:end]))
                self._skipping = None
            elif end - start > self._max:
                items.append(_Skipping(buffer[start:end]).end(b""))
            else:
                line = bytes(buffer[start:end]).rstrip(b"\r")
                if line.strip():
                    items.append(line)
            start = end + 1
        del buffer[:start]
        self._searched -= start
        if self._skipping is not None:
            self._skipping.add(buffer)
        elif len(buffer) > self._max:
            self._skipping = _Skipping(buffer)
        else:
            return items
        buffer.clear()
        self._searched = 0
        return items

    def _take_rest(self) -> bytes:
        line = bytes(self._buffer).rstrip(b"\r")
        self._buffer.clear()
        self._searched = 0
        return line


def encode_line(payload: bytes) -> bytes:
    """Frame one already-serialised message."""
    return payload + b"\n"
