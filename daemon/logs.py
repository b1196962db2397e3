"""Structured logs on stderr, one event per line, with secrets redacted on the way out.

JSON lines when stderr is not a terminal (journald, files), `key=value` text when it is.
Redaction happens in the formatter, so no call site can forget it: anything shaped like
a Conduit token, and any value registered with `redact`, is replaced before writing.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any, ClassVar, TextIO

__all__ = ["configure_logging", "redact"]

_TOKEN_SHAPE = re.compile(r"cdt_[A-Za-z0-9_-]{16,}")
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class _Redactor:
    secrets: ClassVar[set[str]] = set()

    @classmethod
    def scrub(cls, text: str) -> str:
        text = _TOKEN_SHAPE.sub("[redacted]", text)
        for secret in cls.secrets:
            if secret in text:
                text = text.replace(secret, "[redacted]")
        return text


def redact(secret: str) -> None:
    """Never write `secret` to the log, whatever shape it has."""
    if len(secret) >= 8:
        _Redactor.secrets.add(secret)


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
        return _Redactor.scrub(json.dumps(event, default=str))


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        extras = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        line = f"{stamp} {record.levelname.lower():7} {record.getMessage()} {extras}".rstrip()
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return _Redactor.scrub(line)


def configure_logging(level: str = "info", stream: TextIO | None = None) -> None:
    """Send the `conduit` loggers to `stream` (stderr) in the format that suits it."""
    stream = stream or sys.stderr
    handler = logging.StreamHandler(stream)
    handler.setFormatter(_TextFormatter() if stream.isatty() else _JsonFormatter())
    root = logging.getLogger("conduit")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
