"""Bounded capture of what a sandboxed program prints.

`OutputCapture` keeps a program's stdout and stderr under one shared budget of bytes
and lines, enforced while the output streams in, so a flood costs at most the budget.
The moment the budget runs out it calls its `on_limit` callback, so the owner can stop
the sandbox at once instead of reading a flood to its end. An optional `on_output`
hook sees each accepted piece of text as it arrives, for live streaming.

`ResultSplitter` wraps a sandbox's stdout and separates the program's own output from
a result payload introduced by a secret marker that only the daemon and its worker
shim know, so nothing the program prints can pass for its result.

This module knows nothing about processes or runtimes: it reads any
`trio.abc.ReceiveStream` and can be fed bytes directly (in-process runtimes do that).
"""

from __future__ import annotations

import codecs
import enum
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

import trio

__all__ = [
    "CaptureStatistics",
    "OutputCapture",
    "OutputHook",
    "ResultSplitter",
    "StreamName",
    "read_buffered",
]

StreamName = Literal["stdout", "stderr"]
OutputHook = Callable[[StreamName, str], Awaitable[None]]

# One read takes up to a full Linux pipe buffer (64 KiB), so a flooding writer is
# serviced in few wake-ups and the byte budget is checked at least that often.
READ_CHUNK_BYTES = 65536


@dataclass(frozen=True, slots=True)
class CaptureStatistics:
    """A snapshot of an `OutputCapture`."""

    bytes: int
    lines: int
    limit_hit: bool
    truncated_stdout: bool
    truncated_stderr: bool


class _Stream:
    __slots__ = ("buffer", "decoder", "truncated")

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.truncated = False
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")


def _cut_after_newlines(data: bytes, count: int) -> bytes:
    """The prefix of `data` that ends just after its `count`-th newline."""
    end = 0
    for _ in range(count):
        end = data.index(b"\n", end) + 1
    return data[:end]


class OutputCapture:
    """stdout and stderr of one execution under one budget of bytes and lines.

    A line is counted at its newline: a program may print `max_lines` complete lines,
    and the newline after that breaks the budget. When data would break the budget,
    the part that fits is kept, the rest is dropped, the stream is marked truncated
    and `on_limit` is called once (synchronously, so the caller can kill the sandbox
    without yielding first). Everything offered afterwards is dropped too.

    `on_output(stream, text)` is awaited with each accepted piece, decoded
    incrementally so multi-byte characters are never split; a slow hook slows the
    reading, which is the back-pressure live streaming wants. `pump` awaits it
    shielded from cancellation (a chunk once read is kept), so the hook must bound its
    own waiting: a timeout cannot interrupt it.
    """

    def __init__(
        self,
        *,
        max_bytes: int,
        max_lines: int,
        on_limit: Callable[[], object] | None = None,
        on_output: OutputHook | None = None,
    ) -> None:
        self._max_bytes = max_bytes
        self._max_lines = max_lines
        self._on_limit = on_limit
        self._on_output = on_output
        self._bytes = 0
        self._lines = 0
        self._limit_hit = False
        self._streams: dict[StreamName, _Stream] = {"stdout": _Stream(), "stderr": _Stream()}

    @property
    def limit_hit(self) -> bool:
        """Whether the budget ran out (some output was dropped)."""
        return self._limit_hit

    def text(self, stream: StreamName) -> str:
        """What was kept of `stream`, decoded as UTF-8 (invalid bytes replaced)."""
        return self._streams[stream].buffer.decode("utf-8", errors="replace")

    def truncated(self, stream: StreamName) -> bool:
        """Whether some of `stream` was dropped."""
        return self._streams[stream].truncated

    def statistics(self) -> CaptureStatistics:
        """A snapshot of the budget used."""
        return CaptureStatistics(
            bytes=self._bytes,
            lines=self._lines,
            limit_hit=self._limit_hit,
            truncated_stdout=self.truncated("stdout"),
            truncated_stderr=self.truncated("stderr"),
        )

    def _accept(self, stream: StreamName, data: bytes) -> bytes:
        """Account for `data`; return the part that fits and record any loss."""
        if self._limit_hit:
            kept = b""
        else:
            kept = data[: self._max_bytes - self._bytes]
            lines_left = self._max_lines - self._lines
            if kept.count(b"\n") > lines_left:
                kept = _cut_after_newlines(kept, lines_left)
        self._bytes += len(kept)
        self._lines += kept.count(b"\n")
        if len(kept) < len(data):
            self._streams[stream].truncated = True
            if not self._limit_hit:
                self._limit_hit = True
                if self._on_limit is not None:
                    self._on_limit()
        return kept

    def write_nowait(self, stream: StreamName, data: bytes) -> bytes:
        """`write` without the `on_output` hook, for a writer on another thread (an
        in-process runtime's output callback); the owner reads the capture only after
        that writer is done. Returns the part of `data` that was kept, which the owner
        may hand to `emit` on its own thread to stream it."""
        kept = self._accept(stream, data)
        if kept:
            self._streams[stream].buffer += kept
        return kept

    async def write(self, stream: StreamName, data: bytes) -> None:
        """Offer `data` as the next output of `stream`; keep what the budget allows."""
        kept = self._accept(stream, data)
        if kept:
            self._streams[stream].buffer += kept
            await self.emit(stream, kept)

    async def emit(self, stream: StreamName, kept: bytes) -> None:
        """Give `kept` (bytes already accepted, in order) to the `on_output` hook,
        decoded incrementally so a character split across writes comes out whole."""
        if self._on_output is not None:
            text = self._streams[stream].decoder.decode(kept)
            if text:
                await self._on_output(stream, text)

    async def finish(self, stream: StreamName) -> None:
        """Give the hook what is left of an incomplete character at the end of `stream`."""
        if self._on_output is not None:
            tail = self._streams[stream].decoder.decode(b"", final=True)
            if tail:
                await self._on_output(stream, tail)

    async def pump(self, stream: StreamName, source: trio.abc.ReceiveStream) -> None:
        """Read `source` to its end as `stream`.

        Returns at end of stream. Reading goes on after the budget runs out, dropping
        the data, so a writer is never left blocked on a full pipe; the owner is
        expected to stop the writer from `on_limit`. Does not close `source`.
        """
        while chunk := await source.receive_some(READ_CHUNK_BYTES):
            # Once read, a chunk is kept even if the reader is cancelled meanwhile.
            with trio.CancelScope(shield=True):
                await self.write(stream, bytes(chunk))
        await self.finish(stream)


def read_buffered(stream: trio.lowlevel.FdStream) -> bytes:
    """What is already waiting in a pipe, without waiting for more.

    A pipe holds at most its capacity (64 KiB by default), so this is bounded.
    """
    chunks = []
    while True:
        try:
            data = os.read(stream.fileno(), READ_CHUNK_BYTES)
        except (BlockingIOError, OSError):
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)


class _Phase(enum.Enum):
    OUTPUT = "output"  # before the marker: the program's own output
    PAYLOAD = "payload"  # after the marker, up to the newline that ends the payload
    AFTER = "after"  # after the payload: output again (e.g. from unload handlers)


class ResultSplitter(trio.abc.ReceiveStream):
    """A stdout stream with the result payload taken out.

    The worker shim ends its output with `marker + payload + b"\\n"`. Reading this
    stream gives every other byte (the program's own output, before and after the
    payload); the payload is collected into `payload` once its newline arrives. A
    payload longer than `max_payload_bytes` is not kept: `payload_too_large` becomes
    true. `on_settled` is called once, as soon as the payload is complete or known to
    be too large, so the owner can stop the sandbox without waiting for it to exit.
    Only the first marker counts. Bytes that might begin a marker are held back until
    the next read tells; they are released at end of stream.
    """

    def __init__(
        self,
        source: trio.abc.ReceiveStream,
        marker: bytes,
        *,
        max_payload_bytes: int,
        on_settled: Callable[[], object] | None = None,
    ) -> None:
        if not marker or marker[:1] in marker[1:]:
            raise ValueError("the marker must not repeat its first byte")
        self._source = source
        self._marker = marker
        self._max_payload_bytes = max_payload_bytes
        self._on_settled = on_settled
        self._phase = _Phase.OUTPUT
        self._held = b""
        self._payload = bytearray()
        self.payload: bytes | None = None
        self.payload_too_large = False

    @property
    def settled(self) -> bool:
        """Whether the payload is complete or known to be too large."""
        return self.payload is not None or self.payload_too_large

    def _split(self, data: bytes) -> bytes:
        """Consume `data`; return the program output in it."""
        if self._phase is _Phase.AFTER:
            return data
        if self._phase is _Phase.PAYLOAD:
            return self._take_payload(data)
        data = self._held + data
        self._held = b""
        found = data.find(self._marker)
        if found >= 0:
            self._phase = _Phase.PAYLOAD
            return data[:found] + self._take_payload(data[found + len(self._marker) :])
        # Hold back a tail that could be the start of a marker split across reads. The
        # marker's first byte occurs nowhere else in it, so only the last one matters.
        start = data.rfind(self._marker[:1], max(0, len(data) - len(self._marker) + 1))
        if start >= 0 and self._marker.startswith(data[start:]):
            self._held = data[start:]
            return data[:start]
        return data

    def _take_payload(self, data: bytes) -> bytes:
        end = data.find(b"\n")
        piece = data if end < 0 else data[:end]
        if not self.payload_too_large:
            if len(self._payload) + len(piece) > self._max_payload_bytes:
                self.payload_too_large = True
                self._payload.clear()
                self._settle()
            else:
                self._payload += piece
        if end < 0:
            return b""
        self._phase = _Phase.AFTER
        if not self.payload_too_large:
            self.payload = bytes(self._payload)
            self._settle()
        return data[end + 1 :]

    def _settle(self) -> None:
        if self._on_settled is not None:
            callback, self._on_settled = self._on_settled, None
            callback()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """The next program output; b"" at end of stream or once the payload is in.

        The payload is the worker's last word: anything after it cannot change the
        outcome, so the reader need not wait for the sandbox to exit.
        """
        while True:
            if self.payload is not None:
                return b""
            chunk = await self._source.receive_some(max_bytes)
            if not chunk:
                held, self._held = self._held, b""
                return held
            output = self._split(bytes(chunk))
            if output:
                return output

    async def aclose(self) -> None:
        """Close the underlying stream."""
        await self._source.aclose()
