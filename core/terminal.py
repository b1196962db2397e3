"""Text made safe to print on a terminal, whoever wrote it.

A program's output, its error type and message, its code, the tool names it asked for
and anything a client sent can hold bytes a terminal obeys rather than shows: escape
sequences that clear the screen, set the window title or answer back (ESC, and CSI as
the one character U+009B), a carriage return that overwrites what was printed, bidi
controls that reorder what is read (U+202E), and lone surrogates that cannot be encoded
at all. Every one of them is shown escaped instead: `\\x1b`, `\\r`, `\\u202e`.

Backslashes are left alone: what is printed is for a person to read, and doubling them
would make every Windows path and regular expression harder to. The escaped form can
therefore be ambiguous with text that spells it out; it can never be obeyed.

This module knows nothing of the daemon or the wire: the command line uses it for
everything it prints that it did not write itself.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

__all__ = ["MAX_QUOTED_CHARS", "dumps", "escape", "escape_lines", "quoted"]

# What a terminal may obey: DEL and the C1 controls (U+0080-U+009F: U+009B is CSI,
# U+009D OSC); the bidi marks, embeddings, overrides and isolates (Trojan Source);
# every surrogate, which in a `str` is always lone (a pair is one code point). With
# the C0 controls: all of them on one line, all but tab and line feed in output.
_UNSAFE: Final = "\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE_CHAR: Final = re.compile(f"[\x00-\x1f{_UNSAFE}]")
_UNSAFE_IN_LINES: Final = re.compile(f"[\x00-\x08\x0b-\x1f{_UNSAFE}]")
_SHORT: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    if char in _SHORT:
        return _SHORT[char]
    point = ord(char)
    return f"\\x{point:02x}" if point <= 0xFF else f"\\u{point:04x}"


def _json_escaped(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def escape(text: Any) -> str:
    """`text` (made a `str`) on one line: every control, bidi and surrogate character
    escaped, line feeds and tabs included, so it cannot break a table row or a line."""
    text = str(text)
    if text.isascii() and text.isprintable():  # the usual case, and the fast one
        return text
    return _UNSAFE_CHAR.sub(_escaped, text)


# What a message quotes of text someone else wrote: a real error line fits many times
# over, and a hostile one cannot fill a screen or a log line.
MAX_QUOTED_CHARS = 2_000


def quoted(text: object) -> str:
    """`text` fit for a message: bounded, on one line, nothing a terminal would obey.

    Never raises, whatever `text` is: a message that cannot be built would replace the
    error being reported.
    """
    try:
        text = text if isinstance(text, str) else str(text)
    except Exception:
        return f"<unprintable {type(text).__name__}>"
    if len(text) > MAX_QUOTED_CHARS:
        cut = len(text) - MAX_QUOTED_CHARS
        text = f"{text[:MAX_QUOTED_CHARS]}... ({cut} more characters)"
    return escape(text)


def escape_lines(text: str) -> str:
    """`text` as multi-line output: as `escape`, but line feeds and tabs are kept."""
    return _UNSAFE_IN_LINES.sub(_escaped, text)


def dumps(value: Any, *, indent: int | None = None) -> str:
    """`value` as JSON that is safe to print and still valid JSON.

    Non-ASCII text stays readable (`é`, `日本`), but what `escape` would escape is
    written as a `\\uXXXX` escape, which JSON reads back as the same character: DEL,
    C1 and bidi controls and lone surrogates, which `json.dumps` would leave raw.
    """
    text = json.dumps(value, indent=indent, ensure_ascii=False)
    # Outside strings, json.dumps writes only printable ASCII, spaces and line feeds
    # (indent): every match is inside a string, where a \\u escape is valid.
    return _UNSAFE_IN_LINES.sub(_json_escaped, text)
