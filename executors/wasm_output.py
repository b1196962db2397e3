"""Where a Wasmtime instance's standard output and error go, and how the host reads them.

Standard output is a memory file (`memfd`) that Wasmtime writes to as the guest
writes: one system call on the guest's own thread. Wasmtime's other way, a callback
for every write, hands each write to one of its I/O threads and waits until that
thread has run it, about forty times the cost; a program printing ten thousand lines
spent most of its time there.

The host reads what was written (`OutputRoute.drain`) and gives it to the sink the
execution attached, wherever order matters or a limit must be seen: as each of the
guest's host calls begins (`drain_current`: what it wrote before a call, a file's bytes
piped on stdout included, is taken before the call is handled); at every epoch tick,
from the epoch callback on the guest's own thread while it runs its code (so the output
limit stops a guest that only prints, and a flood is read as it is written) and from
the ticker's thread while a call is under way (so a streaming reader sees what was
printed before a wait while the guest waits); once each call into the guest has
returned (`OutputRoute.finish`); and before each write to standard error.

What was read is freed wherever the guest cannot be writing: as a host call begins, in
the epoch callback, and once a call into the guest has returned. Not only at the end of
a call: a wasm-js
program writing files, or calling tools with long arguments, pipes their bytes through
standard output (`wasm_fs`) without limit on their total, and kept to the end of the
run they grew the daemon by gigabytes. Wasmtime writes at an offset of its own, which
freeing (truncating the file) does not move: its next write lands where the last one
ended, past a hole that takes no memory, so what is new is always at `_read` and after.

Standard error stays a callback, which drains standard output first: the two streams
reach the sink in exactly the order the guest wrote them (docs/events.md), as they did
when both were callbacks, and what goes to standard error is rarely the bulk.

Where the system has no memory files, or no `/proc/self/fd` to name one by, standard
output is a callback too (`FILES_AVAILABLE`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import wasmtime

from conduit.executors import _wasmtime
from conduit.executors.output import READ_CHUNK_BYTES, StreamName

__all__ = ["FILES_AVAILABLE", "OutputRoute", "drain_current"]

log = logging.getLogger(__name__)

_FD_DIR = Path("/proc/self/fd")
# Whether instances write to memory files; false, they go through callbacks.
FILES_AVAILABLE = hasattr(os, "memfd_create") and _FD_DIR.is_dir()
# Set once the system refused a memory file in a way that will not pass.
_FILES_REFUSED = threading.Event()
# Failures to make a memory file that pass: that instance alone writes through callbacks.
_SHORT_OF = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})
# The most of one stream a sink is given at once (a streamed piece is one notification).
READ_BYTES = READ_CHUNK_BYTES
# The route of the instance whose guest the thread is running (`current`).
_CURRENT = threading.local()

# Takes a piece of output; answers False once it takes no more (the output limit was
# reached, or the execution was reported), which spares the host reading the rest.
Sink = Callable[[StreamName, bytes], bool | None]


class OutputRoute:
    """An instance's stdout and stderr: dropped until `attach` names a sink.

    The sink is called on the thread that drains, or on one of Wasmtime's I/O threads
    for a callback (with at most 8 KiB of a guest's write each time, the guest writing
    the rest, see `python_program.write_whole`), one piece at a time, in order.

    Once it answers False, what is still to drain is skipped, not read: a guest
    printing as fast as it can writes gigabytes a second until the interrupt the
    output limit sets stops it, and reading all that on the epoch ticker's thread held
    up every guest's ticks, so theirs and its own time limits, for seconds.
    """

    __slots__ = ("_file", "_full", "_lock", "_read", "_sink")

    def __init__(self) -> None:
        self._sink: Sink | None = None
        self._file: int | None = None  # standard output's memory file
        self._read = 0  # how much of it the sink has been given
        self._full = False  # whether the sink said it takes no more
        self._lock = threading.Lock()

    def configure(self, wasi: wasmtime.WasiConfig) -> None:
        """Send the output of the instance made with `wasi` here."""
        if not (FILES_AVAILABLE and not _FILES_REFUSED.is_set() and self._open_file(wasi)):
            wasi.stdout_custom = self._stdout
        wasi.stderr_custom = self._stderr

    def _open_file(self, wasi: wasmtime.WasiConfig) -> bool:
        try:
            fd = os.memfd_create("conduit-stdout")
        except OSError as exc:
            if exc.errno not in _SHORT_OF:
                _no_files(f"no memory file ({exc})")
            return False
        try:
            # Wasmtime opens it by its name: a description of its own, at its own offset.
            wasi.stdout_file = str(_FD_DIR / str(fd))
        except wasmtime.WasmtimeError as exc:
            os.close(fd)
            _no_files(str(exc))
            return False
        self._file = fd
        return True

    def attach(self, sink: Sink | None) -> None:
        with self._lock:
            self._sink, self._full = sink, False

    def drain(self, *, free: bool = False) -> None:
        """Give the sink what the guest wrote to standard output since the last drain;
        with `free`, free what was read too, which only a thread that knows the guest
        is not running may ask (what it writes meanwhile would be lost)."""
        with self._lock:
            if self._file is not None:
                self._drain(self._file)
                if free:
                    os.ftruncate(self._file, 0)

    def _drain(self, fd: int) -> None:
        # Below `_read` once freed (see the module): nothing new until Wasmtime writes.
        size = os.fstat(fd).st_size
        while self._read < size:
            if self._sink is None or self._full:
                self._read = size  # dropped: not worth reading
                return
            data = os.pread(fd, min(size - self._read, READ_BYTES), self._read)
            if not data:
                return
            self._read += len(data)
            self._full = self._sink("stdout", data) is False

    def between_instructions(self) -> None:
        """`drain` and free, from the epoch callback on the guest's own thread, which
        is not writing then: a guest printing flat out is read as it goes, and holds at
        most a tick's writes (a watch of its interrupt, so it returns None)."""
        try:
            self.drain(free=True)
        except Exception:
            log.exception("reading a guest's output failed")

    def _on_tick(self) -> None:
        """`drain` from the epoch ticker's thread, where nothing may raise (a fault of
        ours is logged, the guest goes on)."""
        try:
            self.drain()
        except Exception:
            log.exception("reading a guest's output failed")

    def finish(self) -> None:
        """`drain`, then free what was read: the guest is not running."""
        self.drain(free=True)

    def close(self) -> None:
        """Close the host's side of the file (Wasmtime's closes with its store)."""
        with self._lock:  # a tick's drain may still be under way
            fd, self._file = self._file, None
        if fd is not None:
            os.close(fd)

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        """This route is the thread's (`drain_current`) and drained at every tick for
        the block, a call into the guest; it is finished after it."""
        _CURRENT.route = self
        _wasmtime.TICKER.hook(self._on_tick)
        try:
            yield
        finally:
            _wasmtime.TICKER.unhook(self._on_tick)
            _CURRENT.route = None
            self.finish()

    def _stdout(self, data: bytes) -> None:
        if self._sink is not None:
            self._sink("stdout", data)

    def _stderr(self, data: bytes) -> None:
        with self._lock:
            if self._file is not None:
                self._drain(self._file)  # written before this, so given first
            if self._sink is not None:
                self._sink("stderr", data)


def _no_files(reason: str) -> None:
    """Make every instance from now on write through callbacks: this system cannot
    give Wasmtime a memory file (said once)."""
    if not _FILES_REFUSED.is_set():
        _FILES_REFUSED.set()
        log.warning("guest output goes through callbacks from now on: %s", reason)


def drain_current() -> None:
    """Drain the output of the guest this thread is running, if any: as a host call
    begins, so that what the guest wrote before it is taken first. The guest waits for
    the call, so what was read is freed."""
    route: OutputRoute | None = getattr(_CURRENT, "route", None)
    if route is not None:
        route.drain(free=True)
