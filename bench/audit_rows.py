"""How many execution records a second each audit backend takes, writing as it does
under load: records handed to the store's writer as fast as its buffer allows, written
in its group commits, until every one is committed.

    .venv/bin/python -m bench.audit_rows [--records 40000]

A daemon never needs more than its executions/s in rows/s (one row per execution,
written twice: running, then ended); past this rate the store's buffer fills and
records are dropped and counted. PostgreSQL runs durable (fsync on) in a temporary
directory, on this machine.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import trio

from conduit.daemon.audit import BUFFER_RECORDS, AuditStore
from conduit.daemon.config import AuditConfig
from conduit.daemon.events import BusEvent, EventType
from conduit.daemon.records import ExecutionRecord, code_digest
from tests.fixtures.postgres import PostgresServer, find_bindir


def _record(n: int) -> ExecutionRecord:
    """An ended execution's record as `Executions` makes one, with short heads."""
    ident = f"ex_bench{n:010d}"
    return ExecutionRecord(
        execution_id=ident,
        principal="master",
        executor="wasm-python",
        language="python",
        code_sha256=code_digest(ident),
        code_bytes=1,
        code_snippet="1",
        allowed_tools=("*",),
        status="ok",
        started_at=time.time(),
        queue_ms=0.0,
        duration_ms=1.0,
        result_head="1",
    )


async def rows_per_s(config: AuditConfig, state_dir: str, records: int) -> float:
    store = AuditStore(config, state_dir)
    events = [
        BusEvent(EventType.EXECUTION_FINISHED, {}, "master", record=_record(n))
        for n in range(records)
    ]
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        began = time.perf_counter()
        for start in range(0, records, BUFFER_RECORDS // 2):
            for event in events[start : start + BUFFER_RECORDS // 2]:
                store.record_nowait(event)
            await store.wait_flushed()
        elapsed = time.perf_counter() - began
        dropped = store.statistics().dropped
        nursery.cancel_scope.cancel()
    assert dropped == 0, f"{dropped} records dropped"
    return records / elapsed


async def figures(records: int, pg: PostgresServer | None) -> dict[str, float]:
    results = {}
    with tempfile.TemporaryDirectory(prefix="conduit-audit-rows-") as directory:
        results["SQLite"] = await rows_per_s(AuditConfig(), directory, records)
        if pg is not None:
            config = AuditConfig(url=pg.new_database())
            results["PostgreSQL"] = await rows_per_s(config, directory, records)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=40_000)
    args = parser.parse_args()
    bindir = find_bindir()
    pg = PostgresServer(bindir, durable=True) if bindir is not None else None
    try:
        if pg is not None:
            pg.start()
        results = trio.run(figures, args.records, pg)
    finally:
        if pg is not None:
            pg.stop()
    for name, rate in results.items():
        print(f"{name:12} {rate:10.0f} records/s")
    if pg is None:
        print("PostgreSQL: not installed")


if __name__ == "__main__":
    main()
