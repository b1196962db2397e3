"""The audit store: every execution from its start, and every session's life, kept in
SQLite or PostgreSQL (`audit_backend`), written off the event loop.

```
Executions ─publish(BusEvent .started / .record)─▶ EventBus ─record_nowait─▶ bounded buffer
                                                     (full: the record is dropped and counted)
AuditStore.run ├─ writer: what arrives within WRITE_DELAY_S of a first record (at once
               │          when an answer or a read waits), as one transaction, in one
               │          worker thread at a time; a store that cannot be reached keeps the
               │          batch and tries again, backing off, while the buffer fills
               └─ upkeep: every purge_interval_s, purge by age then by size (oldest
                          first); reopen a store that could not be opened
Executions.execute ─wait_recorded─▶ the answer goes once its record is committed
executions/list|get|stats ─▶ reading connections of their own, in worker threads
```

Guarantees. An execution's `running` row is written with the next batch after it
starts; its end replaces it. Each record is also appended to the journal
(`audit_journal`) as it is handed over, and the answer to a client goes once its
record is there; without a journal (another daemon holds it, it cannot be written, or
it is full) the answer waits (at most `ANSWER_WAIT_S`) for the transaction holding
that end to commit, and waiting answers end the writer's gathering at once, so under
load they share commits. Either way a client that has its result finds its record,
even after `kill -9`: a read waits for the records handed over before it, and the
next start writes what the journal holds before it marks the last life's `running`
rows `interrupted`.

A store that cannot be opened or written is logged once per kind of failure; the daemon
keeps running executions (answers stop waiting for it), records wait in the buffer and
are written when it returns, and those dropped past the buffer are counted
(`dropped`) and logged; reads answer `StoreUnavailable` saying why. A batch no row can
hold is written record by record, and only the records that fail are lost (`lost`).

This module knows nothing of principals: the methods pass the principal whose
executions a caller may see. The backends hold the SQL.
"""

from __future__ import annotations

import enum
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import trio

from conduit.core.errors import InvalidParams, StoreUnavailable
from conduit.daemon.audit_backend import AuditBackend, open_backend
from conduit.daemon.audit_journal import JOURNAL_NAME, RecordJournal
from conduit.daemon.audit_rows import BadCursor, ExecutionQuery, Page
from conduit.daemon.config import AuditConfig
from conduit.daemon.events import BusEvent
from conduit.daemon.records import ExecutionRecord, SessionRecord

__all__ = ["AuditState", "AuditStatistics", "AuditStore", "ExecutionQuery", "Page", "summarise"]

log = logging.getLogger("conduit.audit")

# What the store is handed: an execution started or ended, or a session created or ended.
Record = ExecutionRecord | SessionRecord

T = TypeVar("T")

# Records waiting to be written. At ~2 KB each this is ~8 MB: several seconds of the
# daemon's fastest pace (two records an execution) while the store stalls or is down.
BUFFER_RECORDS = 4096
# Records per transaction: larger batches gain little and keep a purge waiting longer.
MAX_BATCH_RECORDS = 512
# How long the writer gathers records after the first before committing them together,
# when nobody waits for them: a running row, a session's, a record published directly.
# An answer or a read ends the gathering at once.
WRITE_DELAY_S = 0.05
# How long an answer waits for its record's commit before going without it: a commit
# takes well under a millisecond, and seconds on a starved machine; past this the store
# counts as too slow to hold executions up (`unconfirmed`).
ANSWER_WAIT_S = 5.0
# Retrying a store that cannot be reached: from the first delay, doubling to the last.
RETRY_FIRST_S = 0.5
RETRY_MOST_S = 15.0
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
# find its record. A failing store is tried once for a read, never waited for.
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
    FAILING = "failing"  # open, but the last write failed; retried
    UNAVAILABLE = "unavailable"  # could not be opened; retried
    CLOSED = "closed"  # `run` has ended


@dataclass(frozen=True, slots=True)
class AuditStatistics:
    """A snapshot of the store, for `daemon/status` and the metrics."""

    state: AuditState
    path: str  # the SQLite file, or the PostgreSQL URL without its password
    daemon_id: str  # what this daemon's rows carry
    recorded: int  # executions whose end this daemon wrote
    dropped: int  # records refused because the buffer was full, or left at exit
    lost: int  # records no row could hold
    waiting: int  # records in the buffer now
    unconfirmed: int  # answers sent before their record committed (store too slow)
    interrupted: int  # executions of this daemon's last life found running at start
    purged: int  # rows deleted by retention
    size_bytes: int  # what the store takes, as of the last upkeep
    reason: str | None  # why the store is failing or unavailable
    journal: bool  # whether answers go once their records are journaled, not committed


class AuditStore:
    """Keeps a record of every execution; `run` owns its writer and upkeep tasks.

    Register `record_nowait` as a sink on the event bus, start `run` in the daemon's
    root nursery, and have answers `await wait_recorded()`. Reads (`list_executions`,
    `get_execution`, `stats`) run in worker threads on connections of their own and
    raise `StoreUnavailable` when the store is off or could not be opened.
    """

    def __init__(self, config: AuditConfig, state_dir: str) -> None:
        self.config = config
        self.daemon_id = config.daemon_name(state_dir)
        self._backend: AuditBackend = open_backend(config, state_dir, self.daemon_id)
        self.path = self._backend.location
        self._send, self._receive = trio.open_memory_channel[Record](BUFFER_RECORDS)
        self._opened = False
        self._swept = False  # the last life's running rows are marked
        self._opening = trio.Lock()
        # One writer: the writing connection is used by one thread at a time.
        self._writer = trio.CapacityLimiter(1)
        self._readers = trio.CapacityLimiter(READERS)
        self._state = AuditState.STARTING if config.enabled else AuditState.OFF
        self._reason: str | None = None
        # Kinds of failure logged since the store last worked: each is logged once.
        self._logged: set[str] = set()
        self._recorded = self._dropped = self._lost = self._purged = self._size_bytes = 0
        self._unconfirmed = self._interrupted = 0
        # Records handed over, and records the writer is done with (written or lost).
        self._handed = self._done = 0
        self._attempts = 0  # writes tried, successful or not
        self._progress = trio.lowlevel.ParkingLot()
        # Set to end the writer's gathering early: an answer or a reader waits, or a
        # batch is full.
        self._write_now = trio.Event()
        # Set to end a retry's back-off early: a reader waits, or the store reopened.
        self._retry_now = trio.Event()
        # Taken from the buffer and not yet written (kept across failed attempts).
        self._pending: list[Record] = []
        self._upkept = trio.Event()
        # Every record handed over is also appended here (`audit_journal`), so an
        # answer need not wait for its commit; None if it could not be had.
        self._journal_path = Path(state_dir) / JOURNAL_NAME
        self._journal: RecordJournal | None = None
        # Whether every record handed over since the journal was last emptied is in it.
        self._journal_whole = False
        # What the journal held at start, written before the last life's running rows
        # are marked interrupted.
        self._replaying: list[Record] = []

    def __repr__(self) -> str:
        return (
            f"<AuditStore {self._state} {self.path} recorded={self._recorded} "
            f"waiting={self._handed - self._done}>"
        )

    # ---- taking records ------------------------------------------------------------

    def record_nowait(self, event: BusEvent) -> None:
        """The event bus's sink: queue the record an event carries, never waiting.

        With the buffer full the record is dropped and counted, and that is logged
        once until the writer catches up.
        """
        record = event.record or event.started or event.session
        if record is None or self._state is AuditState.OFF:
            return
        try:
            self._send.send_nowait(record)
        except trio.WouldBlock:
            self._dropped += 1
            self._log_once(
                "buffer full",
                f"the audit buffer is full ({BUFFER_RECORDS} records waiting): records are "
                "being dropped, and counted in conduit_audit_records_dropped, until the "
                "store catches up; is it slow or down?",
                level=logging.WARNING,
            )
            return
        except trio.ClosedResourceError:  # the store has stopped: the daemon is exiting
            self._dropped += 1
            return
        self._handed += 1
        if self._journal is not None and not self._journal.append(record):
            self._journal_whole = False
        if self._handed - self._done >= MAX_BATCH_RECORDS:
            self._write_now.set()

    async def wait_flushed(self) -> None:
        """Return once every record handed over before this call is written or lost.

        A store that cannot be written is tried once more for it, not waited for; one
        that is not open is not waited for at all.
        """
        target = self._handed
        while self._done < target and self._state in (AuditState.OPEN, AuditState.FAILING):
            attempts = self._attempts
            self._write_now.set()
            self._retry_now.set()
            await self._progress.park()
            if self._state is AuditState.FAILING and self._attempts > attempts:
                return

    async def wait_recorded(self) -> None:
        """Return once the records handed over before this call are safe: in the
        journal, or else committed. What an answer waits for. Returns at once while the
        store is not working (off, failing, unavailable), and after `ANSWER_WAIT_S` if
        it is too slow."""
        if self._state is not AuditState.OPEN or self._done >= self._handed:
            return
        if self._journal_whole:
            return
        with trio.move_on_after(ANSWER_WAIT_S) as waited:
            await self.wait_flushed()
        if waited.cancelled_caught:
            self._unconfirmed += 1
            self._log_once(
                "slow",
                f"audit store writes take longer than {ANSWER_WAIT_S:g} s: answers are "
                "going out before their records are committed",
                level=logging.WARNING,
            )

    async def wait_upkeep(self) -> None:
        """Return once the next upkeep (reopen, purges) has finished."""
        await self._upkept.wait()

    # ---- running -------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Open the store, then write and purge until cancelled.

        `started()` comes once the store is open or known not to open now: the daemon
        serves either way. On cancellation the records still waiting are written
        (within `FINAL_FLUSH_S`; what is left is counted dropped and logged) and the
        connections are closed.
        """
        if self._state is AuditState.OFF:
            task_status.started()
            return
        if self.config.uses_journal():
            await self._open_journal()
        await self._open()
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._upkeep_forever)
                await self._write_forever()
        finally:
            self._send.close()
            with trio.CancelScope(shield=True):
                with trio.move_on_after(FINAL_FLUSH_S):
                    while self._opened and await self._write_pending():
                        pass
                self._count_left_behind()
                await self._close()
                if self._journal is not None:
                    self._journal.close(remove=True)

    async def _write_forever(self) -> None:
        backoff_s = RETRY_FIRST_S
        while True:
            if not self._pending:
                self._pending = [await self._receive.receive()]
                with trio.move_on_after(WRITE_DELAY_S):
                    await self._write_now.wait()
            self._write_now = trio.Event()
            if await self._write_pending():
                backoff_s = RETRY_FIRST_S
                continue
            # The store is down: the batch stays pending, the buffer fills meanwhile.
            self._retry_now = trio.Event()
            with trio.move_on_after(backoff_s):
                await self._retry_now.wait()
            backoff_s = min(backoff_s * 2, RETRY_MOST_S)

    async def _write_pending(self) -> bool:
        """Write what was taken and what else waits (up to a batch); False if the store
        could not be reached, the batch then kept for the next attempt."""
        batch = self._pending + self._take_waiting(MAX_BATCH_RECORDS - len(self._pending))
        self._pending = batch
        if not batch:
            return False
        if not self._opened and not await self._open():
            self._attempted()
            return False
        written = await self._write(batch)
        if written:
            self._pending = []
        return written

    def _take_waiting(self, most: int) -> list[Record]:
        batch: list[Record] = []
        while len(batch) < most:
            try:
                batch.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        return batch

    async def _in_writer(self, work: Callable[..., T], *args: Any) -> T:
        """Run `work(*args)` in the one writer thread (backend methods only)."""
        return await trio.to_thread.run_sync(work, *args, limiter=self._writer)

    async def _write(self, batch: list[Record]) -> bool:
        """Write `batch`; False (nothing written) if the store cannot be reached."""
        try:
            # A batch taken from the buffer is written even if the run is being
            # cancelled: the write is bounded, and the thread could not be stopped.
            with trio.CancelScope(shield=True):
                self._recorded += await self._in_writer(self._backend.insert_records, batch)
        except Exception as exc:
            if self._backend.unavailable(exc):
                self._fail(AuditState.FAILING, exc)
                self._attempted()
                return False
            with trio.CancelScope(shield=True):
                await self._write_one_by_one(batch)
        self._recovered()
        self._done += len(batch)
        if self._handed == self._done:
            self._logged.discard("buffer full")
            self._caught_up()
        self._attempted()
        return True

    async def _write_one_by_one(self, batch: list[Record]) -> None:
        """A batch no transaction could hold: write each record alone, losing (and
        logging) only those that cannot be written."""
        log.warning("audit: a batch of %d records failed; writing them one by one", len(batch))
        for record in batch:
            try:
                self._recorded += await self._in_writer(self._backend.insert_records, [record])
            except Exception:
                self._lost += 1
                log.exception(
                    "audit: a record could not be written and is lost",
                    extra={"record_id": getattr(record, "execution_id", None)},
                )

    def _attempted(self) -> None:
        self._attempts += 1
        self._progress.unpark_all()

    def _count_left_behind(self) -> None:
        """At exit: what could not be written is counted and said, not silently lost
        (or, all in the journal, said to wait there for the next start)."""
        left = len(self._pending) + len(self._take_waiting(BUFFER_RECORDS))
        self._pending = []
        if left and self._journal_whole:
            log.warning(
                "audit: %d records wait in the journal for the next start to write them",
                left,
                extra={"path": self.path, "reason": self._reason},
            )
        elif left:
            self._dropped += left
            log.error(
                "audit: %d records could not be written before the daemon stopped",
                left,
                extra={"path": self.path, "reason": self._reason},
            )

    async def _open(self) -> bool:
        """Open the store and mark the last life's running rows; whether it is open."""
        async with self._opening:
            if self._opened:
                return True
            try:
                await self._in_writer(self._backend.open)
                await self._replay()
                if not self._swept:
                    self._interrupted = await self._in_writer(self._backend.mark_interrupted)
                    self._swept = True
            except Exception as exc:
                if not self._backend.unavailable(exc):
                    raise
                self._fail(AuditState.UNAVAILABLE, exc)
                return False
            self._opened = True
        self._recovered()
        log.info("audit store open", extra={"path": self.path, "daemon_id": self.daemon_id})
        if self._interrupted:
            log.warning(
                "audit: %d executions were running when this daemon last stopped; "
                "they are recorded as interrupted",
                self._interrupted,
                extra={"path": self.path},
            )
        self._retry_now.set()
        return True

    async def _open_journal(self) -> None:
        """Take the journal, keeping what a past life left in it for `_replay`."""
        try:
            journal, self._replaying = await trio.to_thread.run_sync(
                RecordJournal.open, self._journal_path
            )
        except OSError as exc:
            # Held by another daemon sharing the state directory: theirs, and no fault.
            level = logging.INFO if isinstance(exc, BlockingIOError) else logging.WARNING
            log.log(
                level,
                "audit journal %s cannot be had (%s): answers wait for their records' commits",
                self._journal_path,
                exc,
            )
            return
        self._journal, self._journal_whole = journal, True

    async def _replay(self) -> None:
        """Write what the journal held at start, before running rows are marked."""
        if not self._replaying:
            return
        try:
            await self._in_writer(self._backend.insert_records, self._replaying)
        except Exception as exc:
            if self._backend.unavailable(exc):
                raise
            await self._write_one_by_one(self._replaying)
        log.info("audit: %d records written from the journal", len(self._replaying))
        self._replaying = []
        if self._handed == self._done:
            self._caught_up()

    def _caught_up(self) -> None:
        """Everything handed over is committed: the journal may be emptied."""
        if self._journal is not None and not self._replaying:
            self._journal.clear()
            self._journal_whole = self._journal.is_open

    async def _close(self) -> None:
        self._opened = False
        self._state, self._reason = AuditState.CLOSED, "the daemon is shutting down"
        self._progress.unpark_all()  # answers still waiting go without their commit
        await trio.to_thread.run_sync(self._backend.close, limiter=self._writer)

    def _fail(self, state: AuditState, exc: BaseException) -> None:
        self._state = state
        self._reason = self._backend.describe_failure(exc)
        what = "cannot open" if state is AuditState.UNAVAILABLE else "cannot write"
        self._log_once(
            f"{what}: {self._backend.failure_kind(exc)}",
            f"audit store {what} {self._reason}; executions still run, and their records "
            f"wait (up to {BUFFER_RECORDS}) until this is fixed",
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
            if not self._opened:
                interval = min(interval, REOPEN_INTERVAL_S)
            await trio.sleep(interval)

    async def upkeep(self) -> None:
        """Reopen a store that could not be opened, then purge executions older than
        `retention_days`, then the oldest while the rows take more than `max_bytes`.

        The background task does this every `purge_interval_s`. A failure is logged
        once per kind and leaves the rows for the next upkeep.
        """
        try:
            if not self._opened and self._state not in (AuditState.OFF, AuditState.CLOSED):
                await self._open()
            if self._opened:
                try:
                    await self._purge()
                    self._size_bytes = await self._in_writer(self._backend.store_bytes)
                except Exception as exc:
                    if not self._backend.unavailable(exc):
                        raise
                    self._log_once(
                        f"cannot purge: {self._backend.failure_kind(exc)}",
                        f"audit store cannot purge {self._backend.describe_failure(exc)}",
                    )
        finally:
            self._upkept.set()
            self._upkept = trio.Event()

    async def _purge(self) -> None:
        backend = self._backend
        cutoff = time.time() - self.config.retention_days * _SECONDS_PER_DAY
        purged = 0
        while deleted := await self._in_writer(backend.purge_before, cutoff, PURGE_CHUNK_ROWS):
            purged += deleted
        if await self._in_writer(backend.used_bytes) > self.config.max_bytes:
            target = int(self.config.max_bytes * PURGE_TARGET_FRACTION)
            while deleted := await self._in_writer(backend.purge_oldest, target, PURGE_CHUNK_ROWS):
                purged += deleted
        if purged:
            await self._in_writer(backend.release_space)
            self._purged += purged
            log.info("audit store purged", extra={"rows": purged, "path": self.path})

    def reconfigure(self, config: AuditConfig) -> None:
        """Apply a reloaded `[audit]`: retention and interval from the next upkeep on."""
        fixed = ("enabled", "path", "url", "daemon_id", "journal")
        if any(getattr(config, name) != getattr(self.config, name) for name in fixed):
            log.warning(
                "audit.enabled, path, url, daemon_id and journal changes take effect on restart"
            )
        self.config = config.model_copy(update={name: getattr(self.config, name) for name in fixed})

    def statistics(self) -> AuditStatistics:
        return AuditStatistics(
            state=self._state,
            path=self.path,
            daemon_id=self.daemon_id,
            recorded=self._recorded,
            dropped=self._dropped,
            lost=self._lost,
            waiting=self._handed - self._done,
            unconfirmed=self._unconfirmed,
            interrupted=self._interrupted,
            purged=self._purged,
            size_bytes=self._size_bytes,
            reason=self._reason,
            journal=self._journal is not None and self._journal.is_open,
        )

    # ---- reading -------------------------------------------------------------------

    async def _read(self, work: Callable[..., T], *args: Any) -> T:
        """`work(*args)` (a backend's read) in a worker thread."""
        if self._state is AuditState.OFF:
            raise StoreUnavailable(
                "the audit store is off (audit.enabled = false): executions are not "
                "recorded; turn it on in the config and restart the daemon"
            )
        if not self._opened:
            raise StoreUnavailable(
                f"the audit store is unavailable: {self._reason or 'not open yet'}; "
                "executions still run, and their records wait to be written. Fix the "
                "cause (or set audit.path or audit.url); the daemon tries again every "
                f"{min(self.config.purge_interval_s, REOPEN_INTERVAL_S):g} s",
                {"path": self.path},
            )
        with trio.move_on_after(READ_WAIT_S):
            await self.wait_flushed()
        try:
            return await trio.to_thread.run_sync(work, *args, limiter=self._readers)
        except Exception as exc:
            if not self._backend.unavailable(exc):
                raise
            raise StoreUnavailable(
                f"the audit store cannot be read: {self._backend.describe_failure(exc)}",
                {"path": self.path},
            ) from exc

    async def list_executions(self, query: ExecutionQuery) -> Page:
        """One page of the executions matching `query`, newest first.

        Raises `StoreUnavailable`, and `InvalidParams` for a cursor it did not give.
        """
        try:
            return await self._read(self._backend.fetch_page, query)
        except BadCursor:
            raise InvalidParams(
                "invalid params: cursor is not one this daemon gave out; list again without it",
                {"field": "cursor", "reason": "not a cursor this daemon gave out"},
            ) from None

    async def get_execution(self, execution_id: str) -> ExecutionRecord | None:
        """The stored record of `execution_id`, or None. Raises `StoreUnavailable`."""
        return await self._read(self._backend.fetch_execution, execution_id)

    async def stats(self, since: float, principal: str | None) -> dict[str, Any]:
        """`summarise` over the ended executions started at or after `since` (of
        `principal` only, if not None). Raises `StoreUnavailable`."""
        rows = await self._read(self._backend.fetch_stats_rows, since, principal)
        return summarise(list(rows))


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
