"""What the client's exceptions print of text a program or the daemon wrote.

A hostile program's error message must not reach a terminal or a log raw when the
exception is printed: escape sequences, line breaks, bidi controls and lone surrogates
are shown escaped, the length is bounded, and the text as written stays on the
exception.
"""

from __future__ import annotations

import traceback

import pytest

from conduit.client import ExecutionResult, ProgramFailed, SubscriptionDropped, UpstreamError
from conduit.client.results import ProgramError

# What a terminal would obey: clear the screen, set the title, CSI as one C1 character,
# overwrite the line, reverse what follows; then text that cannot be encoded at all.
HOSTILE = "boom\x1b[2J\x1b]0;owned\x07\x9b31m\rfake prompt $ \u202eevil\nsecond line\ud800"
SHOWN = "boom\\x1b[2J\\x1b]0;owned\\x07\\x9b31m\\rfake prompt $ \\u202eevil\\nsecond line\\ud800"


def _failed(error_type: object, message: object, status: str = "error") -> ProgramFailed:
    error = ProgramError(error_type, message)  # type: ignore[arg-type]  # hostile on purpose
    with pytest.raises(ProgramFailed) as caught:
        ExecutionResult("ex_1", status, error=error).raise_for_status()
    return caught.value


def _printable(text: str) -> bool:
    """Whether `text` holds nothing a terminal obeys and encodes as strict UTF-8."""
    text.encode("utf-8")
    return all(char.isprintable() for char in text)


def test_a_program_error_is_printed_escaped_and_kept_as_written() -> None:
    failed = _failed("Type\x1b[31mError\n", HOSTILE)
    assert str(failed) == f"the program ended with status error: Type\\x1b[31mError\\n: {SHOWN}"
    assert _printable(str(failed))
    assert failed.result.error is not None
    assert failed.result.error.message == HOSTILE
    # A traceback, as an uncaught exception or logging.exception would write it.
    printed = "".join(traceback.format_exception(failed))
    assert "\x1b" not in printed and "\ud800" not in printed
    printed.encode("utf-8")


def test_ordinary_text_stays_readable() -> None:
    failed = _failed("ValueError", "größe ≠ 日本語 (C:\\Temp\\x)")
    assert (
        str(failed)
        == "the program ended with status error: ValueError: größe ≠ 日本語 (C:\\Temp\\x)"
    )


def test_a_long_message_is_bounded() -> None:
    failed = _failed("Error", "\x1b" * 1_000_000)
    shown = str(failed)
    assert len(shown) < 20_000
    assert shown.endswith(f"... ({1_000_000 - 2_000} more characters)")
    assert _printable(shown)
    assert failed.result.error is not None
    assert len(failed.result.error.message) == 1_000_000


def test_a_message_that_cannot_be_made_text_does_not_raise() -> None:
    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no")

    failed = _failed(Unprintable(), "boom", status="\x1b[2Jcrashed")
    assert str(failed) == (
        "the program ended with status \\x1b[2Jcrashed: <unprintable Unprintable>: boom"
    )


def test_a_subscription_drop_reason_is_printed_escaped_and_kept_as_sent() -> None:
    dropped = SubscriptionDropped(HOSTILE)
    assert str(dropped) == SHOWN
    assert dropped.reason == HOSTILE


def test_a_daemon_error_prints_an_upstreams_text_escaped_and_keeps_it_on_the_wire() -> None:
    hostile = "upstream said \x1b]0;owned\x07\nnext line \ud800" + "x" * 5000
    error = UpstreamError(hostile, {"tool": "echo.echo"})
    shown = str(error)
    assert "\x1b" not in shown and "\n" not in shown and "\\x1b" in shown
    assert "\\ud800" in shown and "more characters" in shown
    shown.encode("utf-8")  # printable: no lone surrogate left
    assert error.message == hostile and error.to_wire()["message"] == hostile
