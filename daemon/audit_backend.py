"""The interface the audit store writes and reads through, and the choice of backend.

```
AuditStore ──▶ AuditBackend ├─ SqliteBackend    (audit_db: a file, the default)
                            └─ PostgresBackend  (audit_pg: `audit.url`, shared by daemons)
```

Every method is synchronous and blocking: the store calls them in worker threads, the
writer's (`open`, `insert_records`, `mark_interrupted`, the purges, `close`) one at a
time, the readers' (`fetch_*`) up to `AuditStore`'s reader limit at once on connections
of their own. This module knows nothing of Trio or of when things are written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from conduit.daemon.audit_rows import ExecutionQuery, Page
from conduit.daemon.config import AuditConfig
from conduit.daemon.records import ExecutionRecord, SessionRecord

__all__ = ["AuditBackend", "open_backend"]


class AuditBackend(Protocol):
    """One store's tables, wherever they live.

    Failures: `unavailable(exc)` says whether an exception means the store cannot be
    reached or written now (worth retrying the same records later), as opposed to a
    batch no row can hold.
    """

    # Where the store is, for messages and `daemon/status`: a path, or a URL without
    # its password.
    location: str

    def open(self) -> None:
        """Connect, create or migrate the tables. Idempotent; raises on failure."""

    def close(self) -> None:
        """Close every connection. Idempotent."""

    def insert_records(self, batch: Sequence[ExecutionRecord | SessionRecord]) -> int:
        """Write `batch` in one transaction; how many executions ended (rows new or
        completed). Nothing is written if it raises."""

    def mark_interrupted(self) -> int:
        """This daemon's running rows, left by its last life, become `interrupted`."""

    def purge_before(self, cutoff: float, limit: int) -> int: ...

    def used_bytes(self) -> int: ...

    def purge_oldest(self, target_bytes: int, limit: int) -> int: ...

    def release_space(self) -> None: ...

    def store_bytes(self) -> int: ...

    def fetch_page(self, query: ExecutionQuery) -> Page: ...

    def fetch_execution(self, execution_id: str) -> ExecutionRecord | None: ...

    def fetch_stats_rows(self, since: float, principal: str | None) -> list[Mapping[str, Any]]: ...

    def unavailable(self, exc: BaseException) -> bool: ...

    def failure_kind(self, exc: BaseException) -> str: ...

    def describe_failure(self, exc: BaseException) -> str: ...


def open_backend(config: AuditConfig, state_dir: str, daemon_id: str) -> AuditBackend:
    """The backend `config` names: PostgreSQL for a `postgresql://` URL, else SQLite at
    `database_path`. Opens nothing. Raises `ConfigError` if psycopg is missing."""
    if config.url:
        from conduit.daemon.audit_pg import PostgresBackend

        return PostgresBackend(config.url, daemon_id)
    from conduit.daemon.audit_db import SqliteBackend

    return SqliteBackend(config.database_path(state_dir), daemon_id)
