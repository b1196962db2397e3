"""The audit store's SQLite layer on its own: migrating a version-1 store, sessions'
rows, and a moved execution's running row. No daemon is started."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

from conduit.daemon import audit_db
from conduit.daemon.records import ExecutionRecord, SessionRecord, code_digest


def record(execution_id: str, started_at: float, session_id: str | None = None) -> ExecutionRecord:
    return ExecutionRecord(
        execution_id=execution_id,
        principal="alice",
        executor="wasm-python",
        language="python",
        code_sha256=code_digest(execution_id),
        code_bytes=1,
        code_snippet="1",
        allowed_tools=("*",),
        status="ok",
        started_at=started_at,
        queue_ms=0.0,
        duration_ms=1.0,
        session_id=session_id,
    )


def version_1_store(path: Path) -> None:
    """A store as a version-1 daemon wrote it, with one execution."""
    added = (
        ",\n    session_id TEXT,\n    files_in TEXT,\n    files_out TEXT,"
        "\n    daemon_id TEXT NOT NULL DEFAULT ''"
    )
    script = audit_db._SCHEMA.replace(added, "")
    script = script.replace(audit_db._SESSIONS_SCHEMA, "").replace(audit_db._RUNNING_INDEX, "")
    assert "session" not in script
    assert "daemon_id" not in script
    db = sqlite3.connect(path)
    db.executescript(script)
    newer = ("session_id", "files_in", "files_out", "daemon_id")
    columns = [c for c in audit_db._COLUMNS if c not in newer]
    values = {**{c: getattr(record("ex_old", 1.0), c, None) for c in columns}}
    values |= {"allowed_tools": '["*"]', "tool_call_count": 0}
    db.execute(
        f"INSERT INTO executions ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
        [values[c] for c in columns],
    )
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()


def test_a_version_1_store_is_migrated_and_keeps_its_executions(tmp_path: Path) -> None:
    path = tmp_path / "audit.sqlite3"
    version_1_store(path)
    db = audit_db.open_writer(str(path), "host-a")
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == audit_db.SCHEMA_VERSION == 3
        old = audit_db.fetch_execution(db, "ex_old")
        assert old is not None and old.session_id is None
        # Its rows were this daemon's: a SQLite store has only ever had one.
        assert old.daemon_id == "host-a"
        audit_db.insert_records(db, [record("ex_new", 2.0, session_id="ses_1")])
        new = audit_db.fetch_execution(db, "ex_new")
        assert new is not None and new.session_id == "ses_1"
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        db.close()


def test_a_sessions_row_is_written_when_made_and_completed_when_it_ends(tmp_path: Path) -> None:
    db = audit_db.open_writer(str(tmp_path / "audit.sqlite3"))
    try:
        made = SessionRecord("ses_1", "alice", "wasm-python", "python", created_at=10.0)
        ended = SessionRecord(
            "ses_1", "alice", "wasm-python", "python", 10.0, 50.0, "expired", steps=3, resets=1
        )
        added = audit_db.insert_records(db, [made, record("ex_1", 20.0, "ses_1")])
        assert added == 1
        assert tuple(db.execute("SELECT ended_at, steps FROM sessions").fetchone()) == (None, 0)
        audit_db.insert_records(db, [ended])
        row = tuple(db.execute("SELECT * FROM sessions").fetchone())
        assert row == ("ses_1", "alice", "wasm-python", "python", 10.0, 50.0, "expired", 3, 1)
        # A purge by age takes the sessions that ended before the cutoff with it.
        audit_db.insert_records(db, [SessionRecord("ses_2", "bob", "deno", "typescript", 60.0)])
        audit_db.purge_before(db, cutoff=55.0, limit=100)
        assert [r[0] for r in db.execute("SELECT session_id FROM sessions")] == ["ses_2"]
    finally:
        db.close()


def test_a_running_row_names_the_executor_a_program_moved_to(tmp_path: Path) -> None:
    """`execution.moved` carries the running record again with its new executor: the
    running row takes it; an ended row never goes back to running or changes."""
    db = audit_db.open_writer(str(tmp_path / "audit.sqlite3"))
    running = dataclasses.replace(record("ex_1", 1.0), status="running", executor="wasm-js")
    moved = dataclasses.replace(running, executor="deno")
    ended = dataclasses.replace(moved, status="ok")

    def row() -> tuple[str, str]:
        return tuple(db.execute("SELECT executor, status FROM executions").fetchone())

    try:
        audit_db.insert_records(db, [running])
        assert row() == ("wasm-js", "running")
        audit_db.insert_records(db, [moved])
        assert row() == ("deno", "running")
        audit_db.insert_records(db, [ended])
        assert row() == ("deno", "ok")
        audit_db.insert_records(db, [running])  # a journal's replay, after the end
        assert row() == ("deno", "ok")
    finally:
        db.close()
