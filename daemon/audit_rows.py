"""What both audit backends share: a record as a row and back, a query as a WHERE
clause, and the statements that write them, in either placeholder style.

SQLite (`audit_db`) and PostgreSQL (`audit_pg`) hold the same tables with the same
columns; only the placeholder (`?` or `%s`), the prefix match and what text may hold
differ. This module knows no connection and no driver.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from conduit.core import jsontext
from conduit.daemon.records import (
    INTERRUPTED,
    RUNNING,
    ExecutionRecord,
    FileRecord,
    SessionRecord,
    ToolCallRecord,
    head,
)

__all__ = [
    "COLUMNS",
    "INTERRUPTED_ERROR",
    "SESSION_COLUMNS",
    "SUMMARY",
    "BadCursor",
    "Batch",
    "Dialect",
    "ExecutionQuery",
    "Page",
    "record_from",
    "split_batch",
    "storable_text",
    "summaries",
]

# An error message is the program's own text; keep enough to read, not a flood.
ERROR_MESSAGE_CHARS = 2000

# The record's fields as stored, in column order (tool calls live in their own table).
COLUMNS = (
    "execution_id", "principal", "executor", "language", "code_sha256", "code_bytes",
    "code_snippet", "allowed_tools", "status", "started_at", "queue_ms", "duration_ms",
    "exit_code", "error_type", "error_message", "limit_hit", "policy_rule", "result_bytes",
    "result_head", "stdout_bytes", "stdout_head", "stderr_bytes", "stderr_head",
    "memory_peak_bytes", "tool_call_count", "session_id", "files_in", "files_out",
    "daemon_id",
)  # fmt: skip
# What `executions/list` shows of each execution: enough to pick one to `get`.
SUMMARY = (
    "execution_id", "started_at", "principal", "executor", "language", "status",
    "duration_ms", "queue_ms", "exit_code", "error_type", "limit_hit", "policy_rule",
    "code_sha256",
    "code_bytes", "memory_peak_bytes", "session_id", "daemon_id",
)  # fmt: skip
SESSION_COLUMNS = (
    "session_id", "principal", "executor", "language", "created_at", "ended_at",
    "end_reason", "steps", "resets",
)  # fmt: skip
# What an execution whose daemon died before its end was written says of itself.
INTERRUPTED_ERROR = (
    "Interrupted",
    "the daemon that ran this execution stopped (killed or crashed) before it ended; "
    "its result was never sent",
)

_INT64 = (-(2**63), 2**63 - 1)


def storable_text(value: str) -> str:
    """Text without lone surrogates: what every store can hold."""
    return jsontext.clean_text(value)


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one database spells what differs: its placeholder, its case-sensitive prefix
    match (`{mark}` is the placeholder; the argument is the prefix plus `wildcard`), and
    what its text columns may hold."""

    mark: str
    prefix_match: str
    wildcard: str
    text: Callable[[str], str] = storable_text

    def marks(self, count: int) -> str:
        return ", ".join([self.mark] * count)

    def storable(self, value: Any) -> Any:
        """`value` as a column holds it: clean text, an integer within 64 bits (else
        NULL). A record carries what programs chose; none may stop the writer."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value if _INT64[0] <= value <= _INT64[1] else None
        return value

    # ---- statements ----------------------------------------------------------------

    def insert_started(self) -> str:
        """A running execution's row; if its row is there already and still running,
        only its executor is updated (a program moved: `execution.moved`), and a row
        that has ended is left as it is."""
        return (
            f"INSERT INTO executions ({', '.join(COLUMNS)}) VALUES ({self.marks(len(COLUMNS))}) "
            "ON CONFLICT (execution_id) DO UPDATE SET executor = excluded.executor "
            f"WHERE executions.status = '{RUNNING}'"
        )

    def upsert_ended(self) -> str:
        """An ended execution's row: new, or completing its running row; a row that
        has ended already is left as it is, so a record written twice is kept once."""
        updates = ", ".join(f"{name} = excluded.{name}" for name in COLUMNS[1:])
        return (
            f"INSERT INTO executions ({', '.join(COLUMNS)}) VALUES ({self.marks(len(COLUMNS))}) "
            f"ON CONFLICT (execution_id) DO UPDATE SET {updates} "
            f"WHERE executions.status = '{RUNNING}'"
        )

    def insert_tool_call(self) -> str:
        return (
            "INSERT INTO tool_calls (execution_id, position, tool, duration_ms, outcome) "
            f"VALUES ({self.marks(5)}) ON CONFLICT DO NOTHING"
        )

    def upsert_session(self) -> str:
        """A session's row is written when it is created and completed when it ends."""
        return (
            f"INSERT INTO sessions ({', '.join(SESSION_COLUMNS)}) "
            f"VALUES ({self.marks(len(SESSION_COLUMNS))}) "
            "ON CONFLICT (session_id) DO UPDATE SET ended_at = excluded.ended_at, "
            "end_reason = excluded.end_reason, steps = excluded.steps, "
            "resets = excluded.resets"
        )

    def mark_interrupted(self) -> str:
        """(error_type, error_message, daemon_id): its running rows become interrupted."""
        return (
            f"UPDATE executions SET status = '{INTERRUPTED}', error_type = {self.mark}, "
            f"error_message = {self.mark} WHERE status = '{RUNNING}' AND daemon_id = {self.mark}"
        )

    # ---- rows ----------------------------------------------------------------------

    def execution_row(self, record: ExecutionRecord, daemon_id: str) -> tuple[Any, ...]:
        values = {
            **{name: getattr(record, name, None) for name in COLUMNS},
            "allowed_tools": jsontext.dumps(list(record.allowed_tools)),
            "error_message": (
                None
                if record.error_message is None
                else head(record.error_message, ERROR_MESSAGE_CHARS)
            ),
            "tool_call_count": len(record.tool_calls),
            "files_in": _files_text(record.files_in),
            "files_out": _files_text(record.files_out),
            "daemon_id": record.daemon_id or daemon_id,
        }
        return tuple(self.storable(values[name]) for name in COLUMNS)

    def tool_call_rows(self, records: Sequence[ExecutionRecord]) -> list[tuple[Any, ...]]:
        return [
            (
                record.execution_id,
                position,
                self.storable(call.tool),
                call.duration_ms,
                self.storable(call.outcome),
            )
            for record in records
            for position, call in enumerate(record.tool_calls)
        ]

    def session_row(self, record: SessionRecord) -> tuple[Any, ...]:
        return tuple(self.storable(getattr(record, name)) for name in SESSION_COLUMNS)

    # ---- reading -------------------------------------------------------------------

    def where(self, query: ExecutionQuery) -> tuple[str, list[Any]]:
        """The WHERE clause (or "") and its arguments for `query`'s filters."""
        clauses: list[str] = []
        args: list[Any] = []
        for column in ("principal", "status", "executor", "language", "daemon_id"):
            value = getattr(query, column)
            if value is not None:
                clauses.append(f"{column} = {self.mark}")
                args.append(value)
        if query.since is not None:
            clauses.append(f"started_at >= {self.mark}")
            args.append(query.since)
        if query.ended_only:
            clauses.append(f"status <> '{RUNNING}'")
        if query.code_sha256 is not None:
            clauses.append(self.prefix_match.format(column="code_sha256", mark=self.mark))
            args.append(query.code_sha256.lower() + self.wildcard)
        if query.cursor is not None:
            clauses.append(f"(started_at, seq) < ({self.mark}, {self.mark})")
            args.extend(_decode_cursor(query.cursor))
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", args

    def page_query(self, query: ExecutionQuery) -> tuple[str, list[Any]]:
        where, args = self.where(query)
        sql = (
            f"SELECT seq, tool_call_count, {', '.join(SUMMARY)} FROM executions{where} "
            f"ORDER BY started_at DESC, seq DESC LIMIT {self.mark}"
        )
        return sql, [*args, query.limit + 1]

    def stats_query(self, since: float, principal: str | None) -> tuple[str, list[Any]]:
        """(executor, language, status, duration_ms, limit_hit, tool_call_count) of the
        ended executions that started at or after `since` (of `principal`, if given)."""
        where, args = self.where(ExecutionQuery(principal=principal, since=since, ended_only=True))
        sql = (
            "SELECT executor, language, status, duration_ms, limit_hit, tool_call_count "
            f"FROM executions{where}"
        )
        return sql, args


def _files_text(files: tuple[FileRecord, ...]) -> str | None:
    """Files as a column holds them: `[[path, size], ...]`, or NULL for none."""
    return jsontext.dumps([[f.path, f.size] for f in files]) if files else None


def _files_from(text: str | None) -> tuple[FileRecord, ...]:
    return tuple(FileRecord(str(path), int(size)) for path, size in json.loads(text or "[]"))


@dataclass(frozen=True, slots=True)
class Batch:
    """A batch of records as the writer sends them: the started rows still needed (not
    those whose end is in the same batch), the ended ones and the sessions."""

    started: list[ExecutionRecord]
    ended: list[ExecutionRecord]
    sessions: list[SessionRecord]


def split_batch(batch: Sequence[ExecutionRecord | SessionRecord]) -> Batch:
    executions = [record for record in batch if isinstance(record, ExecutionRecord)]
    ended = [record for record in executions if record.status != RUNNING]
    ended_ids = {record.execution_id for record in ended}
    started = [
        record
        for record in executions
        if record.status == RUNNING and record.execution_id not in ended_ids
    ]
    sessions = [record for record in batch if isinstance(record, SessionRecord)]
    return Batch(started, ended, sessions)


def record_from(row: Mapping[str, Any], calls: Sequence[Sequence[Any]]) -> ExecutionRecord:
    """The record a stored row and its tool calls (tool, duration_ms, outcome) hold."""
    fields = {name: row[name] for name in COLUMNS if name != "tool_call_count"}
    fields["allowed_tools"] = tuple(json.loads(fields["allowed_tools"]))
    fields["tool_calls"] = tuple(ToolCallRecord(*call) for call in calls)
    fields["files_in"] = _files_from(fields["files_in"])
    fields["files_out"] = _files_from(fields["files_out"])
    return ExecutionRecord(**fields)


def summaries(rows: Sequence[Mapping[str, Any]], limit: int) -> Page:
    """The page `rows` (at most `limit` + 1, from `page_query`) make."""
    more = len(rows) > limit
    rows = rows[:limit]
    found = [
        {**{name: row[name] for name in SUMMARY}, "tool_calls": row["tool_call_count"]}
        for row in rows
    ]
    last = rows[-1] if rows and more else None
    cursor = _encode_cursor(last["started_at"], last["seq"]) if last is not None else None
    return Page(found, cursor)


# ---- queries and pages ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExecutionQuery:
    """Which executions to list: every filter that is not None must match."""

    principal: str | None = None
    status: str | None = None
    executor: str | None = None
    language: str | None = None
    since: float | None = None  # Unix time; executions that started at or after it
    code_sha256: str | None = None  # the whole hex digest, or a prefix of it
    daemon_id: str | None = None  # only the executions this daemon ran
    ended_only: bool = False  # leave out the executions still running
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
