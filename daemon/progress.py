"""The progress line `conduit exec` shows on a terminal while a long program runs.

A spinner and the time so far (`⠋ running 3.2 s`), redrawn in place on stderr, only
when stderr is a terminal and only once the run has taken SHOW_AFTER_S. It is erased
before any output is written, and at the end, so it never mixes with the program's
output; and it is not drawn while the last output on a terminal has not ended its line
(a carriage return would overwrite that line). This module knows nothing of the daemon.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

__all__ = ["ProgressLine"]

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
# Quick programs finish without a flicker; a second is when a person starts to wonder.
SHOW_AFTER_S = 1.0
# Ten redraws a second: the tenths of a second shown change at that rate.
REDRAW_S = 0.1
# Back to the start of the line, and erase it.
ERASE = "\r\x1b[K"


class ProgressLine:
    """Draws on `terminal` (stderr) while `running()`; `write` puts output around it.

    `tick()` redraws it when due; `running()` calls it every REDRAW_S from a thread.
    `clock` is injectable for tests. Safe to use from two threads: every write to a
    stream goes through one lock.
    """

    def __init__(
        self,
        terminal: TextIO,
        *,
        clock: Callable[[], float] = time.monotonic,
        show_after_s: float = SHOW_AFTER_S,
    ) -> None:
        self._terminal = terminal
        self._enabled = terminal.isatty()
        self._clock = clock
        self._show_after_s = show_after_s
        self._started = clock()
        self._frames = 0
        self._shown = False
        self._closed = False
        # Whether the last output written to a terminal ended its line.
        self._at_line_start = True
        self._lock = threading.Lock()

    def tick(self) -> None:
        """Redraw the line if it is due; does nothing when it is not a terminal."""
        with self._lock:
            if not self._enabled or self._closed or not self._at_line_start:
                return
            elapsed_s = self._clock() - self._started
            if elapsed_s < self._show_after_s:
                return
            frame = SPINNER[self._frames % len(SPINNER)]
            self._frames += 1
            self._terminal.write(f"{ERASE}{frame} running {elapsed_s:.1f} s")
            self._terminal.flush()
            self._shown = True

    def write(self, target: TextIO, text: str) -> None:
        """Write `text` to `target` (stdout or stderr), erasing the line first."""
        with self._lock:
            self._erase()
            target.write(text)
            target.flush()
            if text and target.isatty():
                self._at_line_start = text.endswith("\n")

    def close(self) -> None:
        """Erase the line for good; `tick` draws nothing after this."""
        with self._lock:
            self._erase()
            self._closed = True

    @contextmanager
    def running(self) -> Iterator[ProgressLine]:
        """Tick every REDRAW_S in a thread until the block ends, then `close`."""
        if not self._enabled:
            yield self
            return
        stop = threading.Event()

        def redraw() -> None:
            while not stop.wait(REDRAW_S):
                self.tick()

        thread = threading.Thread(target=redraw, name="progress", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
            self.close()

    def _erase(self) -> None:
        if self._shown:
            self._terminal.write(ERASE)
            self._terminal.flush()
            self._shown = False
