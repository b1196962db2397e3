"""The audit store: every ended execution, and every session's life, kept in SQLite,
written off the event loop.

```
Executions ─publish(BusEvent with .record)─▶ EventBus ─record_nowait─▶ bounded buffer
                                                   (full: the record is dropped and counted)
AuditStore.run ├─ writer: what arrives within WRITE_DELAY_S of a first record (less if
               │          a read waits), as one transaction on one connection, in one
               │          worker thread at a time
               └─ upkeep: every purge_interval_s, purge by age then by size (oldest
                          first); reopen a store that could not be opened
executions/list|get|stats ─▶ a read connection of their own, in a worker thread
```

Guarantees. A record is written a moment after its execution ends (at most
`WRITE_DELAY_S`, so that a busy daemon commits many records at once rather than one
transaction per execution): the client may have its result before the row is
committed. Readers first wait (at most `READ_WAIT_S`) for the records handed over
before their call, and have them written at once, so a client that has its result
finds its record. A committed row survives the daemon being killed (write-ahead log);
a kill loses only the records still waiting in the buffer. On shutdown they are
written.

A store that cannot be opened or written is logged once per kind of failure; the daemon
keeps running executions, and reads answer `StoreUnavailable` saying why. An unopened
store is retried at every upkeep; a failing one at every write.

This module knows nothing of principals: the methods pass the principal whose
executions a caller may see. `audit_db` holds the SQL.
"""

from __future__ import annotations

import enum
import logging
import math
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import trio

from conduit.core.errors import InvalidParams, StoreUnavailable
from conduit.daemon import audit_db
from conduit.daemon.audit_db import BadCursor, ExecutionQuery, Page
from conduit.daemon.config import AuditConfig
from conduit.daemon.events import BusEvent
from conduit.daemon.records import ExecutionRecord, SessionRecord

__all__ = ["AuditState", "AuditStatistics", "AuditStore", "ExecutionQuery", "Page", "summarise"]

log = logging.getLogger("conduit.audit")

# What the store is handed: an ended execution, or a session created or ended.
Record = ExecutionRecord | SessionRecord

T = TypeVar("T")

# Records waiting to be written. At ~2 KB each this is ~8 MB, and several seconds of
# the daemon's fastest pace while the disk stalls.
BUFFER_RECORDS = 4096
# Records per transaction: larger batches gain little and keep a purge waiting longer.
MAX_BATCH_RECORDS = 512
# How long the writer gathers records after the first before committing them together.
# One transaction per execution cost the daemon ~1 ms of CPU per execution on two cores
# (a thread hop and a commit each); 50 ms holds at most 20 commits a second, and loses
# nothing anyone waits for: a read, a full batch or shutdown writes at once.
WRITE_DELAY_S = 0.05
# Rows per purge transaction, so records never wait long behind a purge.
PURGE_CHUNK_ROWS = 5000
# A purge by size goes down to this share of max_bytes, so the next upkeep need not.
PURGE_TARGET_FRACTION = 0.9
# How often a store that could not be opened is tried again (or every
# purge_interval_s, if that is shorter).
REOPEN_INTERVAL_S = 30.0
# How long a read waits for records handed over before it, then reads anyway. A write
# takes milliseconds; on a starved two-core machine (a component build beside a burst of
# executions) it was seen to take over 2 s, and a client that has its result should
# find its record. A failing write counts as done, so a broken disk never waits here.
READ_WAIT_S = 10.0
# On shutdown, how long the records still waiting get to be written.
FINAL_FLUSH_S = 5.0
# Reads at once; each holds a worker thread and the machine has two cores.
READERS = 2
_SECONDS_PER_DAY = 86_400


class AuditState(enum.StrEnum):
    """Where the store is in its life; `statistics().state`."""

    OFF = "off"  # audit.enabled = false
    STARTING = "starting"  # not opened yet
    OPEN = "open"
    FAILING = "failing"  # open, but the last write failed
    UNAVAILABLE = "unavailable"  # could not be opened; retried at every upkeep
    CLOSED = "closed"  # `run` has ended


@dataclass(frozen=True, slots=True)
class AuditStatistics:
    """A snapshot of the store, for `daemon/status`."""

    state: AuditState
    path: str
    recorded: int  # rows this daemon wrote
    dropped: int  # records refused because the buffer was full
    lost: int  # records the store could not write (failing or unavailable)
    waiting: int  # records in the buffer now
    purged: int  # rows deleted by retention
    size_bytes: int  # the database and its log, as of the last upkeep
    reason: str | None  # why the store is failing or unavailable


class AuditStore:
    """Keeps a record of every ended execution; `run` owns its writer and upkeep tasks.

    Register `record_nowait` as a sink on the event bus and start `run` in the daemon's
    root nursery. Reads (`list_executions`, `get_execution`, `stats`) run in worker
    threads on connections of their own and raise `StoreUnavailable` when the store is
    off or could not be opened.
    """

    def __init__(self, config: AuditConfig, state_dir: str) -> None:
        self.config = config
        self.path = config.database_path(state_dir)
        self._send, self._receive = trio.open_memory_channel[Record](BUFFER_RECORDS)
        self._db: sqlite3.Connection | None = None
        # One writer: the writing connection is used by one thread at a time.
        self._writer = trio.CapacityLimiter(1)
        self._readers = trio.CapacityLimiter(READERS)
        self._state = AuditState.STARTING if config.enabled else AuditState.OFF
        self._reason: str | None = None
        # Kinds of failure logged since the store last worked: each is logged once.
        self._logged: set[str] = set()
        self._recorded = self._dropped = self._lost = self._purged = self._size_bytes = 0
        # Records handed over, and records the writer is done with (written or lost).
        self._handed = self._done = 0
        self._progress = trio.lowlevel.ParkingLot()
        # Set to end the writer's gathering early: a reader waits, or a batch is full.
        self._write_now = trio.Event()
        # Taken from the buffer and not yet written (written on shutdown too).
        self._pending: list[Record] = []
        self._upkept = trio.Event()

    def __repr__(self) -> str:
        return (
            f"<AuditStore {self._state} {self.path} recorded={self._recorded} "
            f"waiting={self._handed - self._done}>"
        )

    # ---- taking records ------------------------------------------------------------

    def record_nowait(self, event: BusEvent) -> None:
        """The event bus's sink: queue the record an ending event carries, never waiting.

        With the buffer full the record is dropped and counted, and that is logged
        once until the writer catches up.
        """
        record = event.record or event.session
        if record is None or self._state is AuditState.OFF:
            return
        try:
            self._send.send_nowait(record)
        except trio.WouldBlock:
            self._dropped += 1
            self._log_once(
                "buffer full",
                f"the audit buffer is full ({BUFFER_RECORDS} records waiting): records are "
                "being dropped until the store catches up; is its disk slow?",
                level=logging.WARNING,
            )
            return
        except trio.ClosedResourceError:  # the store has stopped: the daemon is exiting
            self._dropped += 1
            return
        self._handed += 1
        if self._handed - self._done >= MAX_BATCH_RECORDS:
            self._write_now.set()

    async def wait_flushed(self) -> None:
        """Return once every record handed over before this call is written or lost."""
        target = self._handed
        while self._done < target:
            self._write_now.set()
            await self._progress.park()

    async def wait_upkeep(self) -> None:
        """Return once the next upkeep (reopen, purges) has finished."""
        await self._upkept.wait()

    # ---- running -------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Open the store, then write and purge until cancelled.

        `started()` comes once the store is open or known not to open: the daemon
        serves either way. On cancellation the records still waiting are written
        (within `FINAL_FLUSH_S`) and the connection is closed.
        """
        if self._state is AuditState.OFF:
            task_status.started()
            return
        await self._open()
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._upkeep_forever)
                while True:
                    self._pending = [await self._receive.receive()]
                    if self._db is not None:  # else they are counted lost at once
                        with trio.move_on_after(WRITE_DELAY_S):
                            await self._write_now.wait()
                    self._write_now = trio.Event()
                    await self._write_pending()
        finally:
            self._send.close()
            with trio.CancelScope(shield=True):
                with trio.move_on_after(FINAL_FLUSH_S):
                    while await self._write_pending():
                        pass
                await self._close()

    async def _write_pending(self) -> bool:
        """Write what was taken and what else waits (up to a batch); whether any was."""
        batch = self._pending + self._take_waiting(MAX_BATCH_RECORDS - len(self._pending))
        self._pending = []
        if batch:
            await self._write(batch)
        return bool(batch)

    def _take_waiting(self, most: int) -> list[Record]:
        batch: list[Record] = []
        while len(batch) < most:
            try:
                batch.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        return batch

    async def _in_writer(self, work: Callable[..., T], *args: Any) -> T:
        """Run `work(db, *args)` on the writing connection, in the one writer thread."""
        return await trio.to_thread.run_sync(work, self._db, *args, limiter=self._writer)

    async def _write(self, batch: list[Record]) -> None:
        try:
            if self._db is None:
                self._lost += len(batch)  # why was logged when opening failed
                return
            try:
                # A batch taken from the buffer is written even if the run is being
                # cancelled: the write is short, and the thread could not be stopped.
                with trio.CancelScope(shield=True):
                    self._recorded += await self._in_writer(audit_db.insert_records, batch)
            except (sqlite3.Error, OSError) as exc:
                self._lost += len(batch)
                self._fail(AuditState.FAILING, exc)
                return
            except Exception:
                # A record no row can hold: this batch is lost, the writer goes on.
                self._lost += len(batch)
                log.exception("audit: a batch of %d records could not be written", len(batch))
                return
            self._recovered()
        finally:
            self._done += len(batch)
            self._progress.unpark_all()
            if self._handed == self._done:
                self._logged.discard("buffer full")

    async def _open(self) -> None:
        try:
            db = await trio.to_thread.run_sync(
                audit_db.open_writer, self.path, limiter=self._writer
            )
        except (OSError, sqlite3.Error, audit_db.SchemaTooNew) as exc:
            self._fail(AuditState.UNAVAILABLE, exc)
            return
        self._db = db
        self._recovered()
        log.info("audit store open", extra={"path": self.path})

    async def _close(self) -> None:
        db, self._db = self._db, None
        self._state, self._reason = AuditState.CLOSED, "the daemon is shutting down"
        if db is not None:
            await trio.to_thread.run_sync(db.close, limiter=self._writer)

    def _fail(self, state: AuditState, exc: BaseException) -> None:
        self._state = state
        self._reason = audit_db.describe_failure(self.path, exc)
        what = "cannot open" if state is AuditState.UNAVAILABLE else "cannot write"
        self._log_once(
            f"{what}: {audit_db.failure_kind(exc)}",
            f"audit store {what} {self._reason}; executions still run but are not "
            "recorded until this is fixed",
        )

    def _recovered(self) -> None:
        was = self._state
        self._state, self._reason = AuditState.OPEN, None
        if was in (AuditState.FAILING, AuditState.UNAVAILABLE):
            log.warning(
                "audit store working again",
                extra={"path": self.path, "lost": self._lost, "dropped": self._dropped},
            )
            self._logged.clear()

    def _log_once(self, kind: str, message: str, *, level: int = logging.ERROR) -> None:
        if kind not in self._logged:
            self._logged.add(kind)
            log.log(level, message, extra={"path": self.path, "kind": kind})

    # ---- upkeep --------------------------------------------------------------------

    async def _upkeep_forever(self) -> None:
        while True:
            await self.upkeep()
            interval = self.config.purge_interval_s
            if self._db is None:
                interval = min(interval, REOPEN_INTERVAL_S)
            await trio.sleep(interval)

    async def upkeep(self) -> None:
        """Reopen a store that could not be opened, then purge executions older than
        `retention_days`, then the oldest while the rows take more than `max_bytes`.

        The background task does this every `purge_interval_s`. A failure is logged
        once per kind and leaves the rows for the next upkeep.
        """
        try:
            if self._db is None and self._state not in (AuditState.OFF, AuditState.CLOSED):
                await self._open()
            if self._db is not None:
                try:
                    await self._purge()
                except (sqlite3.Error, OSError) as exc:
                    self._log_once(
                        f"cannot purge: {audit_db.failure_kind(exc)}",
                        f"audit store cannot purge {audit_db.describe_failure(self.path, exc)}",
                    )
                self._size_bytes = await trio.to_thread.run_sync(audit_db.store_bytes, self.path)
        finally:
            self._upkept.set()
            self._upkept = trio.Event()

    async def _purge(self) -> None:
        cutoff = time.time() - self.config.retention_days * _SECONDS_PER_DAY
        purged = 0
        while deleted := await self._in_writer(audit_db.purge_before, cutoff, PURGE_CHUNK_ROWS):
            purged += deleted
        if await self._in_writer(audit_db.used_bytes) > self.config.max_bytes:
            target = int(self.config.max_bytes * PURGE_TARGET_FRACTION)
            while deleted := await self._in_writer(audit_db.purge_oldest, target, PURGE_CHUNK_ROWS):
                purged += deleted
        if purged:
            await self._in_writer(audit_db.release_space)
            self._purged += purged
            log.info("audit store purged", extra={"rows": purged, "path": self.path})

    def reconfigure(self, config: AuditConfig) -> None:
        """Apply a reloaded `[audit]`: retention and interval from the next upkeep on."""
        if (config.enabled, config.path) != (self.config.enabled, self.config.path):
            log.warning("audit.enabled and audit.path changes take effect on restart")
        self.config = config.model_copy(
            update={"enabled": self.config.enabled, "path": self.config.path}
        )

    def statistics(self) -> AuditStatistics:
        return AuditStatistics(
            state=self._state,
            path=self.path,
            recorded=self._recorded,
            dropped=self._dropped,
            lost=self._lost,
            waiting=self._handed - self._done,
            purged=self._purged,
            size_bytes=self._size_bytes,
            reason=self._reason,
        )

    # ---- reading -------------------------------------------------------------------

    async def _read(self, work: Callable[..., T], *args: Any) -> T:
        """`work(db, *args)` on a read connection of its own, in a worker thread."""
        if self._state is AuditState.OFF:
            raise StoreUnavailable(
                "the audit store is off (audit.enabled = false): executions are not "
                "recorded; turn it on in the config and restart the daemon"
            )
        if self._db is None:
            raise StoreUnavailable(
                f"the audit store is unavailable: {self._reason or 'not open yet'}; "
                "executions still run but are not recorded. Fix the cause (or set "
                "audit.path); the daemon tries again every "
                f"{min(self.config.purge_interval_s, REOPEN_INTERVAL_S):g} s",
                {"path": self.path},
            )
        with trio.move_on_after(READ_WAIT_S):
            await self.wait_flushed()

        def read() -> T:
            db = audit_db.open_reader(self.path)
            try:
                return work(db, *args)
            finally:
                db.close()

        try:
            return await trio.to_thread.run_sync(read, limiter=self._readers)
        except sqlite3.Error as exc:
            raise StoreUnavailable(
                f"the audit store cannot be read: {audit_db.describe_failure(self.path, exc)}",
                {"path": self.path},
            ) from exc

    async def list_executions(self, query: ExecutionQuery) -> Page:
        """One page of the executions matching `query`, newest first.

        Raises `StoreUnavailable`, and `InvalidParams` for a cursor it did not give.
        """
        try:
            return await self._read(audit_db.fetch_page, query)
        except BadCursor:
            raise InvalidParams(
                "invalid params: cursor is not one this daemon gave out; list again without it",
                {"field": "cursor", "reason": "not a cursor this daemon gave out"},
            ) from None

    async def get_execution(self, execution_id: str) -> ExecutionRecord | None:
        """The stored record of `execution_id`, or None. Raises `StoreUnavailable`."""
        return await self._read(audit_db.fetch_execution, execution_id)

    async def stats(self, since: float, principal: str | None) -> dict[str, Any]:
        """`summarise` over the executions started at or after `since` (of `principal`
        only, if not None). Raises `StoreUnavailable`."""

        def work(db: sqlite3.Connection) -> dict[str, Any]:
            return summarise(audit_db.fetch_stats_rows(db, since, principal))

        return await self._read(work)


# ---- statistics ----------------------------------------------------------------------


def _percentile(ordered: list[float], percent: float) -> float | None:
    """Nearest-rank percentile of an ordered list: a value that occurred, never a blend."""
    if not ordered:
        return None
    return ordered[max(0, math.ceil(percent / 100 * len(ordered)) - 1)]


def _group(rows: list[Any]) -> dict[str, Any]:
    count = len(rows)
    statuses = Counter(row["status"] for row in rows)
    durations = sorted(row["duration_ms"] for row in rows)
    return {
        "count": count,
        "by_status": dict(sorted(statuses.items())),
        "success_rate": round(statuses["ok"] / count, 4) if count else None,
        "timeouts": statuses["timeout"],
        "limits_hit": sum(1 for row in rows if row["limit_hit"]),
        "tool_calls": sum(row["tool_call_count"] for row in rows),
        "duration_ms": {
            "p50": _percentile(durations, 50),
            "p95": _percentile(durations, 95),
            "max": durations[-1] if durations else None,
        },
    }


def _grouped(rows: Iterable[Any], key: str) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[Any]] = {}
    for row in rows:
        groups.setdefault(row[key], []).append(row)
    return {name: _group(members) for name, members in sorted(groups.items())}


def summarise(rows: list[Any]) -> dict[str, Any]:
    """Counts, statuses, success rate, timeouts and p50/p95 durations of `rows` (each
    with executor, language, status, duration_ms, limit_hit, tool_call_count): in all,
    by executor and by language. Percentiles are nearest-rank."""
    return {
        "total": _group(rows),
        "by_executor": _grouped(rows, "executor"),
        "by_language": _grouped(rows, "language"),
    }
