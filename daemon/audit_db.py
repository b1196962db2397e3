"""The audit store's SQLite layer: schema, migrations, writes, queries and purges.

Every function here is synchronous and takes the connection it works on: they run only
in worker threads, the writer's functions on the store's one writing connection (one
thread at a time), the readers' on a connection of their own. This module knows nothing
about Trio, events or principals; `AuditStore` decides who sees what and when.

Schema (version 2, in `PRAGMA user_version`; a version-1 store is migrated on open):

```
executions   one row per ended execution; `seq` is the insertion order; `session_id`
             the session it was a step of, if any
tool_calls   (execution_id, position) → tool, duration_ms, outcome; deleted with its row
sessions     one row per session: written when it is created, completed when it ends
```
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conduit.core import jsontext
from conduit.daemon.records import (
    ExecutionRecord,
    FileRecord,
    SessionRecord,
    ToolCallRecord,
    head,
)

__all__ = [
    "SCHEMA_VERSION",
    "BadCursor",
    "ExecutionQuery",
    "Page",
    "SchemaTooNew",
    "count_executions",
    "describe_failure",
    "failure_kind",
    "fetch_execution",
    "fetch_page",
    "fetch_stats_rows",
    "insert_records",
    "open_reader",
    "open_writer",
    "purge_before",
    "purge_oldest",
    "release_space",
    "store_bytes",
    "used_bytes",
]

SCHEMA_VERSION = 2

# How long a connection waits for another's lock before failing with SQLITE_BUSY. Only
# the writer writes, so this covers a checkpoint or an outside reader at worst.
BUSY_TIMEOUT_S = 5.0
# An error message is the program's own text; keep enough to read, not a flood.
ERROR_MESSAGE_CHARS = 2000

_SESSIONS_SCHEMA = """
CREATE INDEX executions_by_session ON executions (session_id, started_at, seq);
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY,
    principal TEXT NOT NULL,
    executor TEXT NOT NULL,
    language TEXT NOT NULL,
    created_at REAL NOT NULL,
    ended_at REAL,
    end_reason TEXT,
    steps INTEGER NOT NULL,
    resets INTEGER NOT NULL
);
CREATE INDEX sessions_by_creation ON sessions (created_at);
"""
# From version 1: sessions, and the session of each execution.
_MIGRATE_1_TO_2 = (
    "ALTER TABLE executions ADD COLUMN session_id TEXT;"
    "ALTER TABLE executions ADD COLUMN files_in TEXT;"
    "ALTER TABLE executions ADD COLUMN files_out TEXT;" + _SESSIONS_SCHEMA
)

_SCHEMA = (
    """
CREATE TABLE executions (
    seq INTEGER PRIMARY KEY,
    execution_id TEXT NOT NULL UNIQUE,
    principal TEXT NOT NULL,
    executor TEXT NOT NULL,
    language TEXT NOT NULL,
    code_sha256 TEXT NOT NULL,
    code_bytes INTEGER NOT NULL,
    code_snippet TEXT NOT NULL,
    allowed_tools TEXT NOT NULL,
    status TEXT NOT NULL,
    started_at REAL NOT NULL,
    queue_ms REAL NOT NULL,
    duration_ms REAL NOT NULL,
    exit_code INTEGER,
    error_type TEXT,
    error_message TEXT,
    limit_hit TEXT,
    policy_rule TEXT,
    result_bytes INTEGER NOT NULL,
    result_head TEXT NOT NULL,
    stdout_bytes INTEGER NOT NULL,
    stdout_head TEXT NOT NULL,
    stderr_bytes INTEGER NOT NULL,
    stderr_head TEXT NOT NULL,
    memory_peak_bytes INTEGER,
    tool_call_count INTEGER NOT NULL,
    session_id TEXT,
    files_in TEXT,
    files_out TEXT
);
CREATE INDEX executions_by_start ON executions (started_at, seq);
CREATE INDEX executions_by_principal ON executions (principal, started_at, seq);
CREATE INDEX executions_by_status ON executions (status, started_at, seq);
CREATE INDEX executions_by_executor ON executions (executor, started_at, seq);
CREATE INDEX executions_by_code ON executions (code_sha256, started_at, seq);
CREATE TABLE tool_calls (
    execution_id TEXT NOT NULL REFERENCES executions (execution_id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    tool TEXT NOT NULL,
    duration_ms REAL NOT NULL,
    outcome TEXT NOT NULL,
    PRIMARY KEY (execution_id, position)
) WITHOUT ROWID;
"""
    + _SESSIONS_SCHEMA
)

# The record's fields as stored, in column order (tool calls live in their own table).
_COLUMNS = (
    "execution_id", "principal", "executor", "language", "code_sha256", "code_bytes",
    "code_snippet", "allowed_tools", "status", "started_at", "queue_ms", "duration_ms",
    "exit_code", "error_type", "error_message", "limit_hit", "policy_rule", "result_bytes",
    "result_head", "stdout_bytes", "stdout_head", "stderr_bytes", "stderr_head",
    "memory_peak_bytes", "tool_call_count", "session_id", "files_in", "files_out",
)  # fmt: skip
_INSERT_EXECUTION = (
    f"INSERT OR IGNORE INTO executions ({', '.join(_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(_COLUMNS))})"
)
_INSERT_TOOL_CALL = (
    "INSERT OR IGNORE INTO tool_calls (execution_id, position, tool, duration_ms, outcome) "
    "VALUES (?, ?, ?, ?, ?)"
)
# What `executions/list` shows of each execution: enough to pick one to `get`.
_SUMMARY = (
    "execution_id", "started_at", "principal", "executor", "language", "status",
    "duration_ms", "queue_ms", "exit_code", "error_type", "limit_hit", "policy_rule",
    "code_sha256",
    "code_bytes", "memory_peak_bytes", "session_id",
)  # fmt: skip
_SESSION_COLUMNS = (
    "session_id", "principal", "executor", "language", "created_at", "ended_at",
    "end_reason", "steps", "resets",
)  # fmt: skip
# A session's row is written when it is created and completed when it ends.
_UPSERT_SESSION = (
    f"INSERT INTO sessions ({', '.join(_SESSION_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(_SESSION_COLUMNS))}) "
    "ON CONFLICT (session_id) DO UPDATE SET ended_at = excluded.ended_at, "
    "end_reason = excluded.end_reason, steps = excluded.steps, resets = excluded.resets"
)


class SchemaTooNew(Exception):
    """The store was written by a newer Conduit; this one must not touch it."""


# ---- connections -------------------------------------------------------------------


def _connect(path: str) -> sqlite3.Connection:
    # Autocommit (isolation_level None): transactions are the explicit BEGINs below.
    # Worker threads differ from call to call; the store's limiters serialise use.
    db = sqlite3.connect(
        path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_S
    )
    db.row_factory = sqlite3.Row
    return db


def open_writer(path: str) -> sqlite3.Connection:
    """Open (creating if needed) the store at `path` for writing, migrated to this schema.

    The file is created 0600: it holds code snippets and output heads. Raises `OSError`
    or `sqlite3.Error` when the file cannot be made or opened, `SchemaTooNew` when a
    newer version wrote it.
    """
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # SQLite gives its -wal and -shm files the database file's mode.
    os.close(os.open(file, os.O_RDWR | os.O_CREAT, 0o600))
    db = _connect(path)
    try:
        # Before changing anything in a newer version's file.
        if _check_version(db, path) == 0:
            # A new file. Incremental auto-vacuum lets a purge give freed pages back to
            # the file system; it must be chosen before the file is first written.
            db.execute("PRAGMA auto_vacuum = INCREMENTAL")
        mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode != "wal":
            raise sqlite3.OperationalError(f"cannot use write-ahead logging here (got {mode})")
        # WAL with NORMAL survives a killed process with every commit intact; only a
        # power cut may lose the last commits. FULL would fsync every batch for that.
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute("PRAGMA foreign_keys = ON")
        _migrate(db, path)
    except BaseException:
        db.close()
        raise
    return db


def open_reader(path: str) -> sqlite3.Connection:
    """A connection that only reads; the caller closes it. Raises `sqlite3.Error`."""
    db = _connect(path)
    db.execute("PRAGMA query_only = ON")
    return db


def _check_version(db: sqlite3.Connection, path: str) -> int:
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"{path} has schema version {version}, newer than this conduit's "
            f"{SCHEMA_VERSION}: upgrade conduit, or move the file away to start a new store"
        )
    return version


def _migrate(db: sqlite3.Connection, path: str) -> None:
    if _check_version(db, path) == SCHEMA_VERSION:
        return
    with _transaction(db, begin=True):
        # Another process may have created or migrated it since the first look.
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version < SCHEMA_VERSION:
            _run_script(db, _SCHEMA if version == 0 else _MIGRATE_1_TO_2)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _run_script(db: sqlite3.Connection, script: str) -> None:
    # One statement at a time: `executescript` would commit the transaction around it.
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)


@contextmanager
def _transaction(db: sqlite3.Connection, begin: bool = False) -> Iterator[None]:
    """Commit what the block does, or roll it back; `begin` issues BEGIN IMMEDIATE."""
    if begin:
        db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        # A failed COMMIT (disk full) may or may not have ended the transaction.
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


# ---- failures ----------------------------------------------------------------------

# SQLite's primary result codes, worded for a person.
_SQLITE_MEANINGS = {
    "SQLITE_FULL": "the disk is full",
    "SQLITE_READONLY": "the database is read-only",
    "SQLITE_CANTOPEN": "the database file cannot be opened or created",
    "SQLITE_IOERR": "an I/O error",
    "SQLITE_CORRUPT": "the database file is damaged",
    "SQLITE_NOTADB": "the file is not a SQLite database",
    "SQLITE_BUSY": "another process holds the database locked",
    "SQLITE_PERM": "permission denied",
}


def failure_kind(exc: BaseException) -> str:
    """A short name for the kind of a failure: what is logged once, not every time."""
    if isinstance(exc, sqlite3.Error):
        name = getattr(exc, "sqlite_errorname", "") or type(exc).__name__
        # SQLITE_READONLY_DBMOVED → SQLITE_READONLY: one kind per primary code.
        return "_".join(name.split("_")[:2])
    if isinstance(exc, OSError) and exc.errno is not None:
        return os.strerror(exc.errno)
    return type(exc).__name__


def describe_failure(path: str, exc: BaseException) -> str:
    """One line for a person: what failed at `path`, and why."""
    if isinstance(exc, SchemaTooNew):
        return str(exc)
    if isinstance(exc, OSError):
        return f"{path}: {exc.strerror or exc}"
    meaning = _SQLITE_MEANINGS.get(failure_kind(exc))
    return f"{path}: {meaning} ({exc})" if meaning else f"{path}: {exc}"


# ---- writing -----------------------------------------------------------------------


def _row(record: ExecutionRecord) -> tuple[Any, ...]:
    values = {
        **{name: getattr(record, name, None) for name in _COLUMNS},
        "allowed_tools": jsontext.dumps(list(record.allowed_tools)),
        "error_message": (
            None
            if record.error_message is None
            else head(record.error_message, ERROR_MESSAGE_CHARS)
        ),
        "tool_call_count": len(record.tool_calls),
        "files_in": _files_text(record.files_in),
        "files_out": _files_text(record.files_out),
    }
    return tuple(_storable(values[name]) for name in _COLUMNS)


def _files_text(files: tuple[FileRecord, ...]) -> str | None:
    """Files as a column holds them: `[[path, size], ...]`, or NULL for none."""
    return jsontext.dumps([[f.path, f.size] for f in files]) if files else None


def _files_from(text: str | None) -> tuple[FileRecord, ...]:
    return tuple(FileRecord(str(path), int(size)) for path, size in json.loads(text or "[]"))


_INT64 = (-(2**63), 2**63 - 1)


def _storable(value: Any) -> Any:
    """`value` as SQLite can hold it: text without lone surrogates, an integer within
    64 bits (else NULL). A record carries what programs chose; none may stop the writer."""
    if isinstance(value, str):
        return jsontext.clean_text(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value if _INT64[0] <= value <= _INT64[1] else None
    return value


def insert_records(db: sqlite3.Connection, batch: Sequence[ExecutionRecord | SessionRecord]) -> int:
    """Write `batch` in one transaction; returns how many executions were new.

    A record whose execution id is already stored is skipped, so writing one twice
    keeps one row; a session's record replaces what its row said of its end. Raises
    `sqlite3.Error` with nothing written.
    """
    records = [record for record in batch if isinstance(record, ExecutionRecord)]
    sessions = [_session_row(record) for record in batch if isinstance(record, SessionRecord)]
    calls = [
        (record.execution_id, position, _storable(call.tool), call.duration_ms, call.outcome)
        for record in records
        for position, call in enumerate(record.tool_calls)
    ]
    with _transaction(db, begin=True):
        before = db.total_changes
        db.executemany(_INSERT_EXECUTION, [_row(record) for record in records])
        added = db.total_changes - before
        db.executemany(_INSERT_TOOL_CALL, calls)
        db.executemany(_UPSERT_SESSION, sessions)
    return added


def _session_row(record: SessionRecord) -> tuple[Any, ...]:
    return tuple(_storable(getattr(record, name)) for name in _SESSION_COLUMNS)


# ---- reading -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExecutionQuery:
    """Which executions to list: every filter that is not None must match."""

    principal: str | None = None
    status: str | None = None
    executor: str | None = None
    language: str | None = None
    since: float | None = None  # Unix time; executions that started at or after it
    code_sha256: str | None = None  # the whole hex digest, or a prefix of it
    limit: int = 50
    cursor: str | None = None


@dataclass(frozen=True, slots=True)
class Page:
    """One page of summaries, newest first; `next_cursor` fetches the next (None: last)."""

    executions: list[dict[str, Any]]
    next_cursor: str | None


class BadCursor(ValueError):
    """A cursor this store did not give out."""


def _encode_cursor(started_at: float, seq: int) -> str:
    return base64.urlsafe_b64encode(f"{started_at!r}:{seq}".encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[float, int]:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        started, _, seq = text.partition(":")
        return float(started), int(seq)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise BadCursor(cursor) from None


def _where(query: ExecutionQuery) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    args: list[Any] = []
    for column in ("principal", "status", "executor", "language"):
        value = getattr(query, column)
        if value is not None:
            clauses.append(f"{column} = ?")
            args.append(value)
    if query.since is not None:
        clauses.append("started_at >= ?")
        args.append(query.since)
    if query.code_sha256 is not None:
        # GLOB (unlike LIKE) is case-sensitive and uses the index for a prefix.
        clauses.append("code_sha256 GLOB ?")
        args.append(query.code_sha256.lower() + "*")
    if query.cursor is not None:
        clauses.append("(started_at, seq) < (?, ?)")
        args.extend(_decode_cursor(query.cursor))
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", args


def fetch_page(db: sqlite3.Connection, query: ExecutionQuery) -> Page:
    """The executions matching `query`, newest first, at most `query.limit` of them.

    Raises `BadCursor` for a cursor this store did not give out.
    """
    where, args = _where(query)
    rows = db.execute(
        f"SELECT seq, tool_call_count, {', '.join(_SUMMARY)} FROM executions{where} "
        "ORDER BY started_at DESC, seq DESC LIMIT ?",
        [*args, query.limit + 1],
    ).fetchall()
    more = len(rows) > query.limit
    rows = rows[: query.limit]
    summaries = [
        {**{name: row[name] for name in _SUMMARY}, "tool_calls": row["tool_call_count"]}
        for row in rows
    ]
    last = rows[-1] if rows and more else None
    cursor = _encode_cursor(last["started_at"], last["seq"]) if last is not None else None
    return Page(summaries, cursor)


def fetch_execution(db: sqlite3.Connection, execution_id: str) -> ExecutionRecord | None:
    """The stored record of one execution, tool calls included, or None."""
    row = db.execute(
        f"SELECT {', '.join(_COLUMNS)} FROM executions WHERE execution_id = ?", (execution_id,)
    ).fetchone()
    if row is None:
        return None
    calls = db.execute(
        "SELECT tool, duration_ms, outcome FROM tool_calls WHERE execution_id = ? "
        "ORDER BY position",
        (execution_id,),
    ).fetchall()
    fields = {name: row[name] for name in _COLUMNS if name != "tool_call_count"}
    fields["allowed_tools"] = tuple(json.loads(fields["allowed_tools"]))
    fields["tool_calls"] = tuple(ToolCallRecord(*call) for call in calls)
    fields["files_in"] = _files_from(fields["files_in"])
    fields["files_out"] = _files_from(fields["files_out"])
    return ExecutionRecord(**fields)


def fetch_stats_rows(
    db: sqlite3.Connection, since: float, principal: str | None
) -> list[sqlite3.Row]:
    """(executor, language, status, duration_ms, limit_hit, tool_call_count) of every
    execution that started at or after `since`, of `principal` if it is not None."""
    query = ExecutionQuery(principal=principal, since=since)
    where, args = _where(query)
    return db.execute(
        "SELECT executor, language, status, duration_ms, limit_hit, tool_call_count "
        f"FROM executions{where}",
        args,
    ).fetchall()


def count_executions(db: sqlite3.Connection) -> int:
    return int(db.execute("SELECT count(*) FROM executions").fetchone()[0])


# ---- retention ---------------------------------------------------------------------


def used_bytes(db: sqlite3.Connection) -> int:
    """Bytes the rows take: the database's pages less the free ones."""
    page_size = db.execute("PRAGMA page_size").fetchone()[0]
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    free = db.execute("PRAGMA freelist_count").fetchone()[0]
    return int(page_size * (pages - free))


def store_bytes(path: str) -> int:
    """What the store takes on disk: the database and its write-ahead log."""
    total = 0
    for suffix in ("", "-wal"):
        with suppress(FileNotFoundError):
            total += os.stat(path + suffix).st_size
    return total


def purge_before(db: sqlite3.Connection, cutoff: float, limit: int) -> int:
    """Delete up to `limit` of the oldest executions that started before `cutoff`."""
    with _transaction(db, begin=True):
        cursor = db.execute(
            "DELETE FROM executions WHERE seq IN (SELECT seq FROM executions "
            "WHERE started_at < ? ORDER BY started_at, seq LIMIT ?)",
            (cutoff, limit),
        )
        # A session's row goes with its time: its end, or its start if it never ended
        # (a daemon killed while it lived).
        db.execute("DELETE FROM sessions WHERE COALESCE(ended_at, created_at) < ?", (cutoff,))
    return cursor.rowcount


def purge_oldest(db: sqlite3.Connection, target_bytes: int, limit: int) -> int:
    """Delete the oldest executions, up to `limit`, towards `target_bytes` of rows.

    Deletes as many as the rows' average size says are over the target (at least
    one while over it); returns how many went. Call again until it returns 0.
    """
    used = used_bytes(db)
    if used <= target_bytes:
        return 0
    count = count_executions(db)
    if count == 0:
        return 0
    over = math.ceil((used - target_bytes) / (used / count))
    with _transaction(db, begin=True):
        cursor = db.execute(
            "DELETE FROM executions WHERE seq IN (SELECT seq FROM executions "
            "ORDER BY started_at, seq LIMIT ?)",
            (max(1, min(over, limit)),),
        )
        _purge_ended_sessions(db)
    return cursor.rowcount


def _purge_ended_sessions(db: sqlite3.Connection) -> None:
    """Delete the sessions whose time (their end, or their start if they never ended)
    is before the oldest execution still kept; all of them once none is."""
    db.execute(
        "DELETE FROM sessions WHERE COALESCE(ended_at, created_at) < "
        "COALESCE((SELECT MIN(started_at) FROM executions), 9e999)"
    )


def release_space(db: sqlite3.Connection) -> None:
    """Give freed pages back to the file system and fold the log into the database."""
    # The vacuum frees one page per step, and execute() steps once: executescript()
    # steps it to the end.
    db.executescript("PRAGMA incremental_vacuum;")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
