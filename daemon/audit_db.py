"""The audit store's SQLite layer: schema, migrations, writes, queries and purges.

Every function here is synchronous and takes the connection it works on: they run only
in worker threads, the writer's functions on the store's one writing connection (one
thread at a time), the readers' on a connection of their own. This module knows nothing
about Trio, events or principals; `AuditStore` decides who sees what and when.

Schema (version 3, in `PRAGMA user_version`; older stores are migrated on open):

```
executions   one row per execution, `running` from its start until its end is written;
             `seq` is the insertion order; `session_id` the session it was a step of, if
             any; `daemon_id` the daemon that ran it
tool_calls   (execution_id, position) → tool, duration_ms, outcome; deleted with its row
sessions     one row per session: written when it is created, completed when it ends
```
"""

from __future__ import annotations

import math
import os
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from conduit.daemon.audit_rows import (
    COLUMNS,
    INTERRUPTED_ERROR,
    BadCursor,
    Dialect,
    ExecutionQuery,
    Page,
    record_from,
    split_batch,
    summaries,
)
from conduit.daemon.records import ExecutionRecord, SessionRecord

__all__ = [
    "SCHEMA_VERSION",
    "BadCursor",
    "ExecutionQuery",
    "Page",
    "SchemaTooNew",
    "SqliteBackend",
    "count_executions",
    "describe_failure",
    "failure_kind",
    "fetch_execution",
    "fetch_page",
    "fetch_stats_rows",
    "insert_records",
    "mark_interrupted",
    "open_reader",
    "open_writer",
    "purge_before",
    "purge_oldest",
    "release_space",
    "store_bytes",
    "used_bytes",
]

SCHEMA_VERSION = 3

# How long a connection waits for another's lock before failing with SQLITE_BUSY. Only
# the writer writes, so this covers a checkpoint or an outside reader at worst.
BUSY_TIMEOUT_S = 5.0
SQLITE = Dialect(mark="?", prefix_match="{column} GLOB {mark}", wildcard="*")

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
# Found at start, to mark what a killed daemon left running as interrupted.
_RUNNING_INDEX = (
    "CREATE INDEX executions_running ON executions (daemon_id) WHERE status = 'running';"
)
# From version 2: the daemon that ran each execution (the one migrating the file: a
# SQLite store has only ever had one), and rows for executions still running.
_MIGRATE_2_TO_3 = "ALTER TABLE executions ADD COLUMN daemon_id TEXT NOT NULL DEFAULT '';" + (
    _RUNNING_INDEX
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
    files_out TEXT,
    daemon_id TEXT NOT NULL DEFAULT ''
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
    + _RUNNING_INDEX
)

_COLUMNS = COLUMNS  # for the tests that build older stores


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


def open_writer(path: str, daemon_id: str = "") -> sqlite3.Connection:
    """Open (creating if needed) the store at `path` for writing, migrated to this schema
    (rows from before daemon ids are `daemon_id`'s).

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
        _migrate(db, path, daemon_id)
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


# The script that takes a store from each version to the next.
_MIGRATIONS = {1: _MIGRATE_1_TO_2, 2: _MIGRATE_2_TO_3}


def _migrate(db: sqlite3.Connection, path: str, daemon_id: str) -> None:
    if _check_version(db, path) == SCHEMA_VERSION:
        return
    with _transaction(db, begin=True):
        # Another process may have created or migrated it since the first look.
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version == 0:
            _run_script(db, _SCHEMA)
        elif version < SCHEMA_VERSION:
            for step in range(version, SCHEMA_VERSION):
                _run_script(db, _MIGRATIONS[step])
            db.execute("UPDATE executions SET daemon_id = ? WHERE daemon_id = ''", (daemon_id,))
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


def insert_records(
    db: sqlite3.Connection,
    batch: Sequence[ExecutionRecord | SessionRecord],
    daemon_id: str = "",
) -> int:
    """Write `batch` in one transaction; returns how many executions ended (new rows, or
    running rows completed).

    A running record adds a row unless one is there; an ended record adds or completes
    its row, and is skipped if the row has ended already, so writing one twice keeps one
    row; a session's record replaces what its row said of its end. Raises
    `sqlite3.Error` with nothing written.
    """
    parts = split_batch(batch)
    with _transaction(db, begin=True):
        db.executemany(
            SQLITE.insert_started(), [SQLITE.execution_row(r, daemon_id) for r in parts.started]
        )
        before = db.total_changes
        db.executemany(
            SQLITE.upsert_ended(), [SQLITE.execution_row(r, daemon_id) for r in parts.ended]
        )
        added = db.total_changes - before
        db.executemany(SQLITE.insert_tool_call(), SQLITE.tool_call_rows(parts.ended))
        db.executemany(SQLITE.upsert_session(), [SQLITE.session_row(r) for r in parts.sessions])
    return added


def mark_interrupted(db: sqlite3.Connection, daemon_id: str) -> int:
    """`daemon_id`'s running rows, left by a daemon killed mid-execution, become
    `interrupted`; returns how many."""
    with _transaction(db, begin=True):
        cursor = db.execute(SQLITE.mark_interrupted(), (*INTERRUPTED_ERROR, daemon_id))
    return cursor.rowcount


# ---- reading -----------------------------------------------------------------------


def fetch_page(db: sqlite3.Connection, query: ExecutionQuery) -> Page:
    """The executions matching `query`, newest first, at most `query.limit` of them.

    Raises `BadCursor` for a cursor this store did not give out.
    """
    sql, args = SQLITE.page_query(query)
    return summaries(db.execute(sql, args).fetchall(), query.limit)


def fetch_execution(db: sqlite3.Connection, execution_id: str) -> ExecutionRecord | None:
    """The stored record of one execution, tool calls included, or None."""
    row = db.execute(
        f"SELECT {', '.join(COLUMNS)} FROM executions WHERE execution_id = ?", (execution_id,)
    ).fetchone()
    if row is None:
        return None
    calls = db.execute(
        "SELECT tool, duration_ms, outcome FROM tool_calls WHERE execution_id = ? "
        "ORDER BY position",
        (execution_id,),
    ).fetchall()
    return record_from(row, calls)


def fetch_stats_rows(
    db: sqlite3.Connection, since: float, principal: str | None
) -> list[sqlite3.Row]:
    """(executor, language, status, duration_ms, limit_hit, tool_call_count) of every
    ended execution that started at or after `since`, of `principal` if not None."""
    sql, args = SQLITE.stats_query(since, principal)
    return db.execute(sql, args).fetchall()


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


# ---- the backend -------------------------------------------------------------------

# Errors that say a batch cannot be held by any row, rather than that the file cannot
# be written now: the batch is written record by record, the rest kept.
_BAD_DATA = (sqlite3.IntegrityError, sqlite3.DataError, sqlite3.ProgrammingError)


class SqliteBackend:
    """The embedded store: one file, one writing connection, a reader connection per
    read. See `AuditBackend` for the contract."""

    def __init__(self, path: str, daemon_id: str) -> None:
        self.location = path
        self.daemon_id = daemon_id
        self._db: sqlite3.Connection | None = None

    def __repr__(self) -> str:
        return f"<SqliteBackend {self.location} {'open' if self._db else 'closed'}>"

    def _writer(self) -> sqlite3.Connection:
        if self._db is None:
            raise sqlite3.OperationalError("the store is not open")
        return self._db

    def open(self) -> None:
        if self._db is None:
            self._db = open_writer(self.location, self.daemon_id)

    def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            db.close()

    def insert_records(self, batch: Sequence[ExecutionRecord | SessionRecord]) -> int:
        return insert_records(self._writer(), batch, self.daemon_id)

    def mark_interrupted(self) -> int:
        return mark_interrupted(self._writer(), self.daemon_id)

    def purge_before(self, cutoff: float, limit: int) -> int:
        return purge_before(self._writer(), cutoff, limit)

    def used_bytes(self) -> int:
        return used_bytes(self._writer())

    def purge_oldest(self, target_bytes: int, limit: int) -> int:
        return purge_oldest(self._writer(), target_bytes, limit)

    def release_space(self) -> None:
        release_space(self._writer())

    def store_bytes(self) -> int:
        return store_bytes(self.location)

    def _reading(self, work: Any, *args: Any) -> Any:
        db = open_reader(self.location)
        try:
            return work(db, *args)
        finally:
            db.close()

    def fetch_page(self, query: ExecutionQuery) -> Page:
        return self._reading(fetch_page, query)

    def fetch_execution(self, execution_id: str) -> ExecutionRecord | None:
        return self._reading(fetch_execution, execution_id)

    def fetch_stats_rows(self, since: float, principal: str | None) -> list[Mapping[str, Any]]:
        return self._reading(fetch_stats_rows, since, principal)

    def unavailable(self, exc: BaseException) -> bool:
        return isinstance(exc, (sqlite3.Error, OSError, SchemaTooNew)) and not isinstance(
            exc, _BAD_DATA
        )

    def failure_kind(self, exc: BaseException) -> str:
        return failure_kind(exc)

    def describe_failure(self, exc: BaseException) -> str:
        return describe_failure(self.location, exc)
