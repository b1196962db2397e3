"""Newline-delimited framing: bytes in, lines out, with a size cap.

Knows nothing about JSON or JSON-RPC. A line longer than `max_line_bytes` is never
buffered whole: it is reported once as `OVERSIZE` and the rest of it is skipped up to
its newline, so the stream stays usable after it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Final

import trio

__all__ = ["OVERSIZE", "LineReader", "encode_line"]

# 64 KiB reads keep syscalls few for pipelined small requests without hoarding memory.
_READ_SIZE: Final = 65_536
# Reads while a line longer than one small read is coming (a file's base64): a
# megabyte's line then takes a few wake-ups rather than one per 64 KiB.
_LONG_READ_SIZE: Final = 1 << 20


class _Oversize:
    def __repr__(self) -> str:
        return "OVERSIZE"


OVERSIZE: Final = _Oversize()


class LineReader:
    """Yields each non-blank line of a stream (without its newline) or `OVERSIZE`.

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
        self._discarding = False

    def __aiter__(self) -> AsyncIterator[bytes | _Oversize]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[bytes | _Oversize]:
        while True:
            for item in self._drain():
                yield item
            long_line = len(self._buffer) >= _READ_SIZE and not self._discarding
            chunk = await self._stream.receive_some(_LONG_READ_SIZE if long_line else _READ_SIZE)
            if not chunk:
                if self._buffer.strip() and not self._discarding:
                    yield self._take_rest()
                return
            self._buffer += chunk

    def _drain(self) -> list[bytes | _Oversize]:
        items: list[bytes | _Oversize] = []
        start = 0
        buffer = self._buffer
        while True:
            end = buffer.find(b"\n", max(start, self._searched))
            if end < 0:
                self._searched = len(buffer)
                break
            if self._discarding:
                self._discarding = False
            elif end - start > self._max:
                items.append(OVERSIZE)
            else:
                line = bytes(buffer[start:end]).rstrip(b"\r")
                if line.strip():
                    items.append(line)
            start = end + 1
        del buffer[:start]
        self._searched -= start
        if len(buffer) > self._max and not self._discarding:
            items.append(OVERSIZE)
            self._discarding = True
        if self._discarding:
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
