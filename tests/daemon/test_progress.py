"""The progress line of `conduit exec`, on a fake terminal with a clock the test moves."""

from __future__ import annotations

import io
import threading

from conduit.daemon.progress import ERASE, ProgressLine
from tests.hand_clock import HandClock

# Generous: only a thread on a loaded machine is waited for.
THREAD_WAIT_S = 30


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_quick_run_shows_nothing_then_a_long_one_shows_the_time() -> None:
    clock, terminal = HandClock(), FakeTerminal()
    line = ProgressLine(terminal, clock=clock)
    clock.now += 0.9
    line.tick()
    assert terminal.getvalue() == ""
    clock.now += 0.3
    line.tick()
    clock.now += 2.0
    line.tick()
    assert terminal.getvalue() == f"{ERASE}⠋ running 1.2 s{ERASE}⠙ running 3.2 s"


def test_output_erases_the_line_before_it_is_written() -> None:
    clock, terminal, out = HandClock(), FakeTerminal(), FakeTerminal()
    line = ProgressLine(terminal, clock=clock)
    clock.now += 5
    line.tick()
    line.write(out, "hello\n")
    assert terminal.getvalue() == f"{ERASE}⠋ running 5.0 s{ERASE}"
    assert out.getvalue() == "hello\n"
    line.write(out, "again\n")  # nothing drawn since: nothing to erase
    assert terminal.getvalue().endswith(f"s{ERASE}")


def test_no_line_after_output_that_has_not_ended_its_line() -> None:
    clock, terminal, out = HandClock(), FakeTerminal(), FakeTerminal()
    line = ProgressLine(terminal, clock=clock)
    clock.now += 5
    line.write(out, "Loading...")
    line.tick()
    assert terminal.getvalue() == ""  # a \r would overwrite "Loading..."
    line.write(out, " done\n")
    line.tick()
    assert terminal.getvalue() == f"{ERASE}⠋ running 5.0 s"


def test_output_to_a_file_does_not_hold_the_line_back() -> None:
    clock, terminal, piped = HandClock(), FakeTerminal(), io.StringIO()
    line = ProgressLine(terminal, clock=clock)
    clock.now += 5
    line.write(piped, "no newline")
    line.tick()
    assert "running" in terminal.getvalue()


def test_never_drawn_when_stderr_is_not_a_terminal() -> None:
    clock, piped = HandClock(), io.StringIO()
    line = ProgressLine(piped, clock=clock)
    with line.running():
        clock.now += 60
        line.tick()
    assert piped.getvalue() == ""


def test_close_erases_it_for_good() -> None:
    clock, terminal = HandClock(), FakeTerminal()
    line = ProgressLine(terminal, clock=clock)
    clock.now += 5
    line.tick()
    line.close()
    line.tick()
    assert terminal.getvalue() == f"{ERASE}⠋ running 5.0 s{ERASE}"


def test_running_redraws_from_a_thread_and_erases_at_the_end() -> None:
    drawn = threading.Event()

    class Watched(FakeTerminal):
        def write(self, text: str) -> int:
            if "running" in text:
                drawn.set()
            return super().write(text)

    terminal = Watched()
    line = ProgressLine(terminal, show_after_s=0)
    with line.running():
        assert drawn.wait(THREAD_WAIT_S)
    assert terminal.getvalue().endswith(ERASE)
    assert "running" in terminal.getvalue()
