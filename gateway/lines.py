"""An upstream's stdout split into lines, with a size cap that never buffers past it.

`LineSplitter` is fed the chunks a pipe gives and hands back each complete line. A
line longer than the cap is skipped as it streams by, up to its newline, and comes
back as `Oversize`: its length and its first and last bytes, which are where a
JSON-RPC message's id is (see `conduit.core.protocol.skipped_response_id`), so the
request it answered can be failed and the connection can go on.

Knows nothing about JSON-RPC, processes or Trio.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ENDING_BYTES", "OPENING_BYTES", "LineSplitter", "Oversize"]

# How much of a skipped line's opening is kept: the id search's window (its first
# 4 KiB), where a message that puts its id first has it.
OPENING_BYTES = 4096
# How much of its end is kept: a message that puts its id last (`…,"jsonrpc":"2.0",
# "id":"<id>"}`) has it in its last few dozen bytes.
ENDING_BYTES = 256


@dataclass(frozen=True, slots=True)
class Oversize:
    """A line longer than the cap, skipped: its length, and its first and last bytes
    (`OPENING_BYTES`, `ENDING_BYTES`; without the newline)."""

    size: int
    opening: bytes
    ending: bytes


class _Skipping:
    """The line being skipped: counted, its opening kept, its last bytes kept."""

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


class LineSplitter:
    """Lines out of chunks: each non-blank line, stripped, or `Oversize` for one
    longer than `max_line_bytes` (whatever the chunks it came in).

    Holds at most `max_line_bytes` plus one chunk: bytes are scanned once (the search
    for a newline resumes where the last chunk ended), and a line past the cap is
    dropped as it comes. What follows a skipped line is read as usual.
    """

    def __init__(self, max_line_bytes: int) -> None:
        self._max = max_line_bytes
        self._buffer = bytearray()
        self._skipping: _Skipping | None = None

    def feed(self, chunk: bytes) -> list[bytes | Oversize]:
        """The lines `chunk` completes, in order."""
        items: list[bytes | Oversize] = []
        if self._skipping is not None:
            end = chunk.find(b"\n")
            if end == -1:
                self._skipping.add(chunk)
                return items
            items.append(self._skipping.end(chunk[:end]))
            self._skipping = None
            chunk = chunk[end + 1 :]
        self._split(chunk, items)
        return items

    def _split(self, chunk: bytes, items: list[bytes | Oversize]) -> None:
        buffer = self._buffer
        scanned = len(buffer)
        buffer += chunk
        start = 0
        while (end := buffer.find(b"\n", scanned)) != -1:
            if end - start > self._max:
                items.append(_Skipping(buffer[start:end]).end(b""))
            elif line := bytes(buffer[start:end]).strip():
                items.append(line)
            start = scanned = end + 1
        del buffer[:start]
        if len(buffer) > self._max:
            self._skipping = _Skipping(buffer)
            buffer.clear()
