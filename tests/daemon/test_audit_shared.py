"""The audit store on PostgreSQL as several daemons share it: each sees every daemon's
executions, named by the daemon that ran them; and a server that goes away costs
executions nothing, its records waiting until it is back."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.daemon.audit import AuditState
from tests.conftest import WAIT_S, link_wasm_cache
from tests.daemon.test_audit import PYTHON_ONLY, fabricated, list_all, publish, python
from tests.fixtures.postgres import PostgresServer


def test_the_url_shown_never_holds_the_password() -> None:
    from conduit.daemon.audit_pg import redacted

    assert redacted("postgresql://au:s3cret@db:5432/x?sslmode=require") == (
        "postgresql://au:***@db:5432/x?sslmode=require"
    )
    assert redacted("postgresql://au@/x?host=/run/pg") == "postgresql://au@/x?host=/run/pg"


async def test_every_daemon_lists_every_daemons_executions(
    start_daemon: Any,
    connect: Any,
    postgres_url: str,
    tmp_path: Path,
    short_dir: Path,
    wasm_cache: Path,
) -> None:
    audit = {"url": postgres_url}
    link_wasm_cache(tmp_path / "state-b", wasm_cache)
    server_a, info_a = await start_daemon(audit={**audit, "daemon_id": "a"}, **PYTHON_ONLY)
    other = {"socket": str(short_dir / "b.sock"), "state_dir": str(tmp_path / "state-b")}
    # The second keeps the default id: host name and a digest of its state directory.
    server_b, info_b = await start_daemon(server=other, audit=audit, **PYTHON_ONLY)
    assert server_b.audit.daemon_id not in ("", "a")
    client_a, client_b = await connect(info_a), await connect(info_b)
    ran_a = await client_a.call("execute", python("'on a'"))
    ran_b = await client_b.call("execute", python("'on b'"))

    expected = {ran_a["execution_id"]: "a", ran_b["execution_id"]: server_b.audit.daemon_id}
    for client in (client_a, client_b):
        listed = await list_all(client)
        assert {e["execution_id"]: e["daemon_id"] for e in listed} == expected
        got = await client.call("executions/get", {"execution_id": ran_b["execution_id"]})
        assert got["daemon_id"] == server_b.audit.daemon_id
        only_a = await list_all(client, daemon_id="a")
        assert [e["execution_id"] for e in only_a] == [ran_a["execution_id"]]
        stats = await client.call("executions/stats", {})
        assert stats["total"]["count"] == 2


async def test_a_daemon_marks_only_its_own_running_rows_interrupted(
    start_daemon: Any, connect: Any, postgres_url: str, make_config: Any
) -> None:
    from conduit.daemon.server import Daemon

    now = time.time()
    # What two daemons killed mid-execution left: running rows of each.
    seed = Daemon(make_config(audit={"url": postgres_url, "daemon_id": "seed"}, **PYTHON_ONLY))
    with trio.fail_after(WAIT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(seed.audit.run)
            publish_started(seed, fabricated("ex_mine", now, status="running", daemon_id="a"))
            publish_started(seed, fabricated("ex_theirs", now, status="running", daemon_id="b"))
            await seed.audit.wait_flushed()
            nursery.cancel_scope.cancel()

    server, info = await start_daemon(audit={"url": postgres_url, "daemon_id": "a"}, **PYTHON_ONLY)
    client = await connect(info)
    statuses = {e["execution_id"]: e["status"] for e in await list_all(client)}
    assert statuses == {"ex_mine": "interrupted", "ex_theirs": "running"}
    mine = await client.call("executions/get", {"execution_id": "ex_mine"})
    assert mine["error_type"] == "Interrupted"
    assert server.audit.statistics().interrupted == 1
    interrupted = await list_all(client, status="interrupted")
    assert [e["execution_id"] for e in interrupted] == ["ex_mine"]


def publish_started(server: Any, record: Any) -> None:
    from conduit.daemon.events import BusEvent, EventType

    server.events.publish(
        BusEvent(EventType.EXECUTION_STARTED, {}, record.principal, started=record)
    )


@pytest.fixture
def own_postgres(postgres_server: PostgresServer) -> Iterator[PostgresServer]:
    """A server of the test's own, which it may stop and start again."""
    server = PostgresServer(postgres_server.bindir)
    server.start()
    yield server
    server.stop()


async def test_a_server_that_goes_away_costs_executions_nothing(
    start_daemon: Any,
    connect: Any,
    own_postgres: PostgresServer,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr(logging.getLogger("conduit"), "propagate", True)
    url = own_postgres.new_database()
    server, info = await start_daemon(audit={"url": url}, **PYTHON_ONLY)
    client = await connect(info)
    first = await client.call("execute", python("1"))

    own_postgres.halt()
    with trio.fail_after(WAIT_S):
        away = [await client.call("execute", python(f"{n}")) for n in range(3)]
    assert [r["status"] for r in away] == ["ok"] * 3
    stats = server.audit.statistics()
    assert stats.state is AuditState.FAILING
    assert stats.waiting >= 3
    assert (stats.lost, stats.dropped) == (0, 0)
    assert "password" not in (stats.reason or "")
    reply = await client.request("executions/list", {})
    assert "error" in reply or "warning" in reply["result"]
    logged = [r for r in caplog.records if "audit store cannot write" in r.getMessage()]
    assert len(logged) == 1

    own_postgres.resume()
    with trio.fail_after(WAIT_S):
        while server.audit.statistics().waiting:
            await server.audit.wait_flushed()
            await trio.sleep(0.05)
    listed = await list_all(client)
    assert [e["execution_id"] for e in listed] == [
        *(r["execution_id"] for r in reversed(away)),
        first["execution_id"],
    ]
    assert {e["status"] for e in listed} == {"ok"}
    assert server.audit.statistics().state is AuditState.OPEN


async def test_records_past_the_buffer_are_counted_in_the_metrics(
    start_daemon: Any, postgres_url: str
) -> None:
    from conduit.daemon.audit import BUFFER_RECORDS

    server, _ = await start_daemon(audit={"url": postgres_url}, **PYTHON_ONLY)
    now = time.time()
    publish(server, *(fabricated(f"ex_{n}", now) for n in range(BUFFER_RECORDS + 10)))
    exposition = server.metrics.exposition().decode()
    dropped = server.audit.statistics().dropped
    assert dropped >= 9
    assert f"conduit_audit_records_dropped_total {float(dropped)}" in exposition
    with trio.fail_after(WAIT_S):
        await server.audit.wait_flushed()


async def test_retention_purges_the_oldest_beyond_max_bytes_on_postgresql(
    start_daemon: Any, postgres_url: str
) -> None:
    max_bytes = 256 * 1024
    audit = {"url": postgres_url, "max_bytes": max_bytes}
    server, _ = await start_daemon(audit=audit, **PYTHON_ONLY)
    now = time.time()
    bulky = {"stdout_head": "x" * 256, "stderr_head": "y" * 256, "result_head": "z" * 256}
    publish(server, *(fabricated(f"ex_{n:05}", now - 3600 + n, **bulky) for n in range(2000)))
    with trio.fail_after(WAIT_S):
        await server.audit.wait_flushed()
        await server.audit.upkeep()

    stats = server.audit.statistics()
    assert 0 < stats.purged < 2000
    # The live rows fit under the cap; the oldest went first.
    assert await trio.to_thread.run_sync(server.audit._backend.used_bytes) <= max_bytes
    import psycopg

    with psycopg.connect(postgres_url) as conn:
        left = [r[0] for r in conn.execute("SELECT execution_id FROM executions ORDER BY 1")]
    assert left == [f"ex_{n:05}" for n in range(stats.purged, 2000)]
