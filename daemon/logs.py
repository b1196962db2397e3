"""Structured logs on stderr, one event per line, with secrets redacted on the way out.

JSON lines when stderr is not a terminal (journald, files), `key=value` text when it is.
Redaction happens in the formatters, so no call site can forget it: anything shaped like
a Conduit token, and any value registered with `redact`, is replaced in the message, in
every `extra` field (keys, values, nested containers) and in exception text, before the
event is serialised (so escaping cannot hide a secret from the scrubber).

One event is one line: JSON escapes every line break, and the text format escapes them
in the message and the fields. The one exception is a traceback in the text format,
which follows its event on lines indented by two spaces, so no line of it can pass for
an event of its own.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

from conduit.core.redaction import scrub

__all__ = ["configure_logging"]

_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
_TRACEBACK_INDENT = "  "


def _scrubbed(value: Any) -> Any:
    """`value` as JSON-ready data with every string in it scrubbed; anything that is not
    JSON becomes its scrubbed `str`."""
    if isinstance(value, str):
        return scrub(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, Mapping):
        return {scrub(str(k)): _scrubbed(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_scrubbed(item) for item in value]
    return scrub(str(value))


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD}


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            event["exc"] = self.formatException(record.exc_info)
        # ensure_ascii: every non-ASCII line separator (U+2028, NEL) is escaped too.
        return json.dumps(_scrubbed(event), ensure_ascii=True)


def _one_line(text: str) -> str:
    """`text` with line breaks and other control characters escaped, as JSON would."""
    return text if text.isprintable() else json.dumps(text)[1:-1]


def _text_value(value: Any) -> str:
    """A field's value for `key=value`: quoted when a space or quote would make the
    line ambiguous, escaped when it holds a line break."""
    text = json.dumps(value) if isinstance(value, list | dict) else str(value)
    if text.isprintable() and not any(c in text for c in ' "='):
        return text
    return json.dumps(text)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        fields = _scrubbed(_fields(record))
        extras = " ".join(f"{k}={_text_value(v)}" for k, v in fields.items())
        message = _one_line(scrub(record.getMessage()))
        line = f"{stamp} {record.levelname.lower():7} {message} {extras}".rstrip()
        if record.exc_info:
            trace = scrub(self.formatException(record.exc_info))
            line += "".join(
                f"\n{_TRACEBACK_INDENT}{_one_line(part)}" for part in trace.splitlines()
            )
        return line


def configure_logging(level: str = "info", stream: TextIO | None = None) -> None:
    """Send the `conduit` loggers to `stream` (stderr) in the format that suits it."""
    stream = stream or sys.stderr
    handler = logging.StreamHandler(stream)
    handler.setFormatter(_TextFormatter() if stream.isatty() else _JsonFormatter())
    root = logging.getLogger("conduit")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
