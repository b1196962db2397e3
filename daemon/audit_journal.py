"""The audit journal: each record appended to a local file the moment it is handed to
the store, so an answer need not wait for the store's commit to be safe.

```
AuditStore.record_nowait ─append─▶ <state_dir>/audit.journal  (one JSON line a record)
                         ─buffer─▶ writer ─commit─▶ SQLite / PostgreSQL
writer caught up (everything handed is committed) ─clear─▶ the journal is emptied
next start ─replay─▶ what the journal holds is written before the last life's
                     running rows are marked interrupted
```

An append is one `write` to a file in the page cache, a few microseconds: it survives
the daemon being killed as a commit does (SQLite's WAL with `synchronous = NORMAL`
does not survive a power cut either). What it spares an answer is the commit's trip
through the writer thread and back, most of a session step's time.

Replay is safe to repeat: a running row is added only if missing, an end completes a
running row and is ignored once the row has ended, and the lines are replayed in the
order they were written, so a session's last record is the one that stays.

One daemon uses a journal at a time (an exclusive `flock`): a daemon that finds it
taken, or cannot open or write it, goes without, and its answers wait for commits as
before. The journal never holds more than `MAX_BYTES`; past that, appends stop until
the writer catches up and clears it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

from conduit.core import jsontext
from conduit.daemon.records import ExecutionRecord, FileRecord, SessionRecord, ToolCallRecord

__all__ = ["JOURNAL_NAME", "RecordJournal", "journal_line", "record_from_line"]

log = logging.getLogger("conduit.audit")

JOURNAL_NAME: Final = "audit.journal"
# A record is a few KB: this holds thousands, more than the store's buffer.
MAX_BYTES: Final = 16 * 1024 * 1024

_EXECUTION: Final = "execution"
_SESSION: Final = "session"
_FIELD_NAMES: Final = {
    kind: tuple(field.name for field in dataclasses.fields(kind))
    for kind in (ExecutionRecord, SessionRecord, ToolCallRecord, FileRecord)
}


class RecordJournal:
    """An open journal file, locked by this daemon; `open` recovers what it held."""

    def __init__(self, path: Path, fd: int, size: int) -> None:
        self.path = path
        self._fd: int | None = fd
        self._size = size

    def __repr__(self) -> str:
        state = "open" if self._fd is not None else "closed"
        return f"<RecordJournal {self.path} {state} {self._size} bytes>"

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    @classmethod
    def open(cls, path: Path) -> tuple[RecordJournal, list[ExecutionRecord | SessionRecord]]:
        """The journal at `path`, locked, and the records a past life left in it.
        Raises OSError if it cannot be opened or another daemon holds it."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            data = _read_all(fd)
        except OSError:
            os.close(fd)
            raise
        return cls(path, fd, len(data)), list(_records_in(data))

    def append(self, record: ExecutionRecord | SessionRecord) -> bool:
        """Whether `record` is now in the journal (False: full, closed or failing)."""
        if self._fd is None:
            return False
        line = journal_line(record)
        if self._size + len(line) > MAX_BYTES:
            return False
        try:
            _write_all(self._fd, line)
        except OSError as exc:
            log.warning(
                "audit journal %s cannot be written (%s): answers wait for commits instead",
                self.path,
                exc,
            )
            self.close(remove=False)
            return False
        self._size += len(line)
        return True

    def clear(self) -> None:
        """Empty the journal: everything it held is committed."""
        if self._fd is None or not self._size:
            return
        try:
            os.ftruncate(self._fd, 0)
        except OSError as exc:
            log.warning("audit journal %s cannot be emptied (%s)", self.path, exc)
            self.close(remove=False)
            return
        self._size = 0

    def close(self, *, remove: bool) -> None:
        """Release the journal; `remove` deletes it (it must be empty)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if remove and not self._size:
            with contextlib.suppress(OSError):  # left behind empty, it replays nothing
                self.path.unlink()
        os.close(fd)


def journal_line(record: ExecutionRecord | SessionRecord) -> bytes:
    """One record as a line of JSON."""
    kind = _SESSION if isinstance(record, SessionRecord) else _EXECUTION
    return jsontext.encode({"kind": kind, "record": _plain(record)}) + b"\n"


def _plain(record: Any) -> dict[str, Any]:
    """A record's fields as JSON-ready data, the nested records as objects: what
    `dataclasses.asdict` makes, without its deep copy (most of an append's time)."""
    plain = {name: getattr(record, name) for name in _FIELD_NAMES[type(record)]}
    for name, value in plain.items():
        if isinstance(value, tuple) and value and not isinstance(value[0], str):
            plain[name] = [_plain(item) for item in value]
    return plain


def record_from_line(line: bytes) -> ExecutionRecord | SessionRecord:
    """The record a journal line holds; raises ValueError or TypeError for any other."""
    entry = jsontext.loads(line)
    fields = entry["record"]
    if not isinstance(fields, dict):
        raise TypeError("a journal line's record is not an object")
    if entry["kind"] == _SESSION:
        return SessionRecord(**fields)
    if entry["kind"] != _EXECUTION:
        raise ValueError(f"unknown record kind {entry['kind']!r}")
    return ExecutionRecord(
        **{
            **fields,
            "allowed_tools": tuple(fields["allowed_tools"]),
            "tool_calls": tuple(ToolCallRecord(**call) for call in fields["tool_calls"]),
            "files_in": _files(fields["files_in"]),
            "files_out": _files(fields["files_out"]),
        }
    )


def _files(entries: Iterable[dict[str, Any]]) -> tuple[FileRecord, ...]:
    return tuple(FileRecord(**entry) for entry in entries)


def _records_in(data: bytes) -> Iterable[ExecutionRecord | SessionRecord]:
    """The records whole lines of `data` hold. A line cut short by a kill, or one
    that holds no record, is skipped and logged."""
    for number, line in enumerate(data.split(b"\n"), 1):
        if not line:
            continue
        try:
            yield record_from_line(line)
        except (ValueError, TypeError, KeyError) as exc:
            log.warning("audit journal: line %d holds no record (%s); skipped", number, exc)


def _read_all(fd: int) -> bytes:
    chunks = []
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
