"""The audit store in a real daemon: what is recorded, how it is read back, who sees
what, retention, concurrency, and how it degrades when its disk fails it.

The tests of behaviour run on both backends (`backend`): the SQLite file and a real
PostgreSQL server; those about the file itself run on SQLite only."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import socket
import sqlite3
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pytest
import trio

from conduit.core.errors import Forbidden, InvalidParams, NotFound, StoreUnavailable
from conduit.daemon import audit
from conduit.daemon.audit import BUFFER_RECORDS, AuditState
from conduit.daemon.audit_db import store_bytes
from conduit.daemon.audit_journal import JOURNAL_NAME, record_from_line
from conduit.daemon.auth import hash_token, new_token
from conduit.daemon.events import BusEvent, EventType
from conduit.daemon.records import ExecutionRecord, ToolCallRecord, code_digest
from tests.conftest import MASTER_TOKEN, WAIT_S, RawClient
from tests.e2e.helpers import wait_upstreams
from tests.fixtures.mcp_echo_server import command as echo_command

# Most tests run Python only: fewer runtimes to start on a shared two-core machine.
PYTHON_ONLY = {"executors": {"deno": {"enabled": False}, "wasm_js": {"enabled": False}}}
ECHO = {"name": "echo", "transport": "stdio", "command": echo_command()[0]}
ECHO["args"] = echo_command()[1:]
DAY_S = 86_400


def python(code: str, **params: Any) -> dict[str, Any]:
    return {"language": "python", "code": code, **params}


def fabricated(execution_id: str, started_at: float, **fields: Any) -> ExecutionRecord:
    """A record as `Executions` makes them, for states no real program reaches quickly
    (a month old, a known duration)."""
    values: dict[str, Any] = {
        "execution_id": execution_id,
        "principal": "master",
        "executor": "wasm-python",
        "language": "python",
        "code_sha256": code_digest(execution_id),
        "code_bytes": len(execution_id),
        "code_snippet": execution_id,
        "allowed_tools": ("*",),
        "status": "ok",
        "started_at": started_at,
        "queue_ms": 0.0,
        "duration_ms": 1.0,
        **fields,
    }
    return ExecutionRecord(**values)


def publish(server: Any, *records: ExecutionRecord) -> None:
    """Hand records to the daemon's bus, as an ending execution does."""
    for record in records:
        server.events.publish(
            BusEvent(EventType.EXECUTION_FINISHED, {}, record.principal, record=record)
        )


def sqlite_rows(path: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Read the store's file directly, as an operator with sqlite3 would."""
    db = sqlite3.connect(path)
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()


def rows(server: Any, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Read a daemon's store directly, with sqlite3 or psycopg (`?` placeholders)."""
    url = server.audit.config.url
    if not url:
        return sqlite_rows(server.audit.path, sql, *args)
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute(sql.replace("?", "%s"), args).fetchall()


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def audit_url(backend: str, request: pytest.FixtureRequest) -> dict[str, str]:
    """The `[audit]` settings that choose the backend: none for SQLite."""
    if backend == "sqlite":
        return {}
    return {"url": request.getfixturevalue("postgres_url")}


@pytest.fixture
def start_daemon(start_daemon: Any, audit_url: dict[str, str]) -> Any:
    """The daemon of tests/conftest.py, on the backend under test."""

    async def start(config: Any = None, **sections: Any) -> Any:
        if config is None and audit_url:
            sections["audit"] = {**sections.get("audit", {}), **audit_url}
        return await start_daemon(config, **sections)

    return start


sqlite_only = pytest.mark.parametrize("backend", ["sqlite"])


async def list_all(client: Any, **filters: Any) -> list[dict[str, Any]]:
    """Every page of executions/list, followed through its cursors."""
    found: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = await client.call("executions/list", {**filters, "cursor": cursor})
        found += page["executions"]
        cursor = page["next_cursor"]
        if cursor is None:
            return found


# ---- what is recorded ------------------------------------------------------------


async def test_an_execution_is_recorded_with_every_field(start_daemon: Any, connect: Any) -> None:
    server, info = await start_daemon(**PYTHON_ONLY)
    client = await connect(info)
    code = "import sys\nprint('out' * 200)\nprint('err', file=sys.stderr)\n{'n': 42}"
    result = await client.call("execute", python(code, allowed_tools=["echo.*"]))
    assert result["status"] == "ok"

    record = await client.call("executions/get", {"execution_id": result["execution_id"]})
    stdout = "out" * 200 + "\n"
    assert record == {
        "execution_id": result["execution_id"],
        "principal": f"uid:{os.getuid()}",
        "executor": "wasm-python",
        "language": "python",
        "code_sha256": hashlib.sha256(code.encode()).hexdigest(),
        "code_bytes": len(code),
        "code_snippet": code[:200],
        "allowed_tools": ["echo.*"],
        "status": "ok",
        "started_at": record["started_at"],
        "queue_ms": result["queue_ms"],
        "duration_ms": result["duration_ms"],
        "exit_code": 0,
        "error_type": None,
        "error_message": None,
        "limit_hit": None,
        "policy_rule": None,
        "result_bytes": len('{"n":42}'),
        "result_head": '{"n":42}',
        "stdout_bytes": len(stdout),
        "stdout_head": stdout[:256],
        "stderr_bytes": 4,
        "stderr_head": "err\n",
        "memory_peak_bytes": result["memory_peak_bytes"],
        "tool_calls": [],
        "session_id": None,
        "files_in": [],
        "files_out": [],
        "daemon_id": server.audit.daemon_id,
    }
    assert abs(record["started_at"] - time.time()) < 60
    if not server.audit.config.url:
        assert stat_mode(server.audit.path) == 0o600


def stat_mode(path: str) -> int:
    return os.stat(path).st_mode & 0o777


async def test_errors_limits_and_tool_calls_are_recorded(start_daemon: Any, connect: Any) -> None:
    server, info = await start_daemon(upstreams=[ECHO], executors={"wasm_js": {"enabled": False}})
    await wait_upstreams(server, "echo")
    client = await connect(info)
    code = """
await tools.echo.echo({ text: "hi" });
try { await tools.echo.fail({ message: "nope" }); } catch {}
await tools.echo.echo({ text: "one too many" });
"""
    limited = await client.call(
        "execute", {"language": "typescript", "code": code, "limits": {"tool_calls": 2}}
    )
    assert limited["status"] == "tool_limit"
    failed = await client.call("execute", python("raise ValueError('bad ' * 1000)"))
    assert failed["status"] == "error"
    slow = await client.call("execute", python("while True: pass", limits={"timeout_ms": 300}))
    assert slow["status"] == "timeout"

    record = await client.call("executions/get", {"execution_id": limited["execution_id"]})
    assert record["status"] == "tool_limit"
    assert record["limit_hit"] == "tool_calls"
    assert [(c["tool"], c["outcome"]) for c in record["tool_calls"]] == [
        ("echo__echo", "ok"),
        ("echo__fail", "error"),
        ("echo__echo", "tool_limit_reached"),
    ]
    assert all(c["duration_ms"] >= 0 for c in record["tool_calls"])

    record = await client.call("executions/get", {"execution_id": failed["execution_id"]})
    assert record["error_type"] == "ValueError"
    # The message is kept, bounded; the program's whole message was 4000 characters.
    assert record["error_message"].startswith("bad bad")
    assert 1000 <= len(record["error_message"]) <= 2000
    assert record["exit_code"] == failed["exit_code"]

    record = await client.call("executions/get", {"execution_id": slow["execution_id"]})
    assert (record["status"], record["limit_hit"]) == ("timeout", "timeout")
    assert record["duration_ms"] >= 300
    listed = await client.call("executions/list", {})
    assert [e["tool_calls"] for e in listed["executions"]] == [0, 0, 3]


async def test_a_running_execution_is_answered_from_the_running_table(
    start_daemon: Any, connect: Any
) -> None:
    server, info = await start_daemon(**PYTHON_ONLY)
    client, other = await connect(info), await connect(info)
    ended: list[Any] = []

    async def run() -> None:
        ended.append(await client.call("execute", python("while True: pass")))

    async with trio.open_nursery() as nursery:
        with server.events.subscribe([EventType.EXECUTION_STARTED]) as started:
            nursery.start_soon(run)
            with trio.fail_after(WAIT_S):
                execution_id = (await started.__anext__()).data["execution_id"]
        now = await other.call("executions/get", {"execution_id": execution_id})
        assert now["status"] == "running"
        assert now["execution_id"] == execution_id
        assert now["running_ms"] >= 0
        await other.call("executions/cancel", {"execution_id": execution_id})
    after = await other.call("executions/get", {"execution_id": execution_id})
    assert after["status"] == ended[0]["status"] == "cancelled"


async def test_an_execution_whose_client_vanishes_is_recorded_cancelled(
    start_daemon: Any, connect: Any
) -> None:
    server, info = await start_daemon(server={"tcp": "127.0.0.1:0"}, **PYTHON_ONLY)
    stream = await trio.open_tcp_stream(*info.tcp_address)
    gone = RawClient(stream)
    ended_types = [EventType.EXECUTION_STARTED, EventType.EXECUTION_FAILED]
    with server.events.subscribe(ended_types) as events:
        await gone.send(
            {"id": 1, "method": "execute", "params": python("while True: pass"),
             "auth": {"bearerToken": MASTER_TOKEN}}
        )  # fmt: skip
        with trio.fail_after(WAIT_S):
            started = await events.__anext__()
            # A reset, not a close: the daemon cancels what the peer can no longer hear.
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            await stream.aclose()
            ended = await events.__anext__()
    execution_id = started.data["execution_id"]
    assert ended.data["execution_id"] == execution_id
    client = await connect(info)
    record = await client.call("executions/get", {"execution_id": execution_id})
    assert record["status"] == "cancelled"
    assert record["error_type"] == "Cancelled"
    assert record["principal"] == "master"


# ---- reading back ------------------------------------------------------------------


async def test_list_filters_and_pages_newest_first(start_daemon: Any, connect: Any) -> None:
    server, info = await start_daemon()
    client = await connect(info)
    ids = []
    for n in range(5):
        ids.append((await client.call("execute", python(f"{n}")))["execution_id"])
    failed = await client.call(
        "execute", {"language": "typescript", "code": "throw 1", "executor": "deno"}
    )
    js = await client.call("execute", {"language": "javascript", "code": "1"})
    ids += [failed["execution_id"], js["execution_id"]]

    everything = await list_all(client, limit=2)
    assert [e["execution_id"] for e in everything] == ids[::-1]
    started = [e["started_at"] for e in everything]
    assert started == sorted(started, reverse=True)

    by_status = await client.call("executions/list", {"status": "error"})
    assert [e["execution_id"] for e in by_status["executions"]] == [failed["execution_id"]]
    by_executor = await client.call("executions/list", {"executor": "wasm-js"})
    assert [e["execution_id"] for e in by_executor["executions"]] == [js["execution_id"]]
    by_language = await list_all(client, language="py")
    assert [e["execution_id"] for e in by_language] == ids[4::-1]
    digest = code_digest("3")
    by_code = await client.call("executions/list", {"code_sha256": digest[:8].upper()})
    assert [e["execution_id"] for e in by_code["executions"]] == [ids[3]]
    since = everything[1]["started_at"]
    recent = await client.call("executions/list", {"since": since})
    assert [e["execution_id"] for e in recent["executions"]] == ids[:4:-1]
    nobody = await client.call("executions/list", {"principal": "nobody"})
    assert nobody == {"executions": [], "next_cursor": None}

    bad = await client.request("executions/list", {"cursor": "not-a-cursor"})
    assert bad["error"]["code"] == InvalidParams.code
    assert bad["error"]["data"]["field"] == "cursor"
    for params, field in [
        ({"limit": 1001}, "limit"),
        ({"status": "fine"}, "status"),
        ({"code_sha256": "xyz"}, "code_sha256"),
    ]:
        reply = await client.request("executions/list", params)
        assert reply["error"]["code"] == InvalidParams.code
        assert reply["error"]["data"]["field"] == field
    missing = await client.request("executions/get", {"execution_id": "ex_nope"})
    assert missing["error"]["code"] == NotFound.code


async def test_stats_over_a_window_by_executor_and_language(
    start_daemon: Any, connect: Any
) -> None:
    server, info = await start_daemon(**PYTHON_ONLY)
    client = await connect(info)
    now = time.time()
    # 20 wasm-python runs of 1..20 ms: 17 ok, 2 timeouts, 1 error; 5 wasm-js runs.
    statuses = ["ok"] * 17 + ["timeout"] * 2 + ["error"]
    records = [
        fabricated(
            f"ex_py{n}",
            now - n,
            duration_ms=float(n + 1),
            status=status,
            limit_hit="timeout" if status == "timeout" else None,
            tool_calls=(ToolCallRecord("echo__echo", 1.0, "ok"),) * 2,
        )
        for n, status in enumerate(statuses)
    ]
    records += [
        fabricated(f"ex_js{n}", now - n, executor="wasm-js", language="javascript")
        for n in range(5)
    ]
    records.append(fabricated("ex_old", now - 2 * DAY_S, duration_ms=9999.0))
    publish(server, *records)

    stats = await client.call("executions/stats", {"window_s": 3600})
    assert stats["until"] - stats["since"] == pytest.approx(3600)
    python_group = {
        "count": 20,
        "by_status": {"error": 1, "ok": 17, "timeout": 2},
        "success_rate": 0.85,
        "timeouts": 2,
        "limits_hit": 2,
        "tool_calls": 40,
        "duration_ms": {"p50": 10.0, "p95": 19.0, "max": 20.0},
    }
    assert stats["by_executor"]["wasm-python"] == python_group
    assert stats["by_language"]["python"] == python_group
    assert stats["by_executor"]["wasm-js"]["count"] == 5
    assert stats["by_language"]["javascript"]["duration_ms"]["p95"] == 1.0
    assert stats["total"]["count"] == 25
    assert stats["total"]["success_rate"] == 0.88
    assert set(stats["by_executor"]) == {"wasm-python", "wasm-js"}

    # The default window is a day; `since` reaches further back.
    assert (await client.call("executions/stats", {}))["total"]["count"] == 25
    week = await client.call("executions/stats", {"since": now - 7 * DAY_S})
    assert week["total"]["count"] == 26
    assert week["total"]["duration_ms"]["max"] == 9999.0
    empty = await client.call("executions/stats", {"since": now + 60})
    assert empty["total"]["count"] == 0
    assert empty["total"]["success_rate"] is None
    both = await client.request("executions/stats", {"since": now, "window_s": 60})
    assert both["error"]["code"] == InvalidParams.code


async def test_a_principal_sees_only_its_own_executions(start_daemon: Any, connect: Any) -> None:
    tokens = {name: new_token() for name in ("alice", "bob", "runner")}
    clients = [
        {"name": "alice", "sha256": hash_token(tokens["alice"])},
        {"name": "bob", "sha256": hash_token(tokens["bob"])},
        {"name": "runner", "sha256": hash_token(tokens["runner"]), "scopes": ["execute"]},
    ]
    auth = {"peer_credentials": False, "token": MASTER_TOKEN, "clients": clients}
    _, info = await start_daemon(auth=auth, **PYTHON_ONLY)
    who: dict[str, Any] = {}
    for name, token in {**tokens, "master": MASTER_TOKEN}.items():
        who[name] = await connect(info)
        await who[name].call("auth/login", {"token": token})
    alice = (await who["alice"].call("execute", python("1")))["execution_id"]
    bob = (await who["bob"].call("execute", python("2")))["execution_id"]

    mine = await who["alice"].call("executions/list", {})
    assert [e["execution_id"] for e in mine["executions"]] == [alice]
    assert mine["executions"][0]["principal"] == "alice"
    theirs = await who["alice"].request("executions/list", {"principal": "bob"})
    assert theirs["error"]["code"] == Forbidden.code
    assert "only its own" in theirs["error"]["message"]
    hidden = await who["alice"].request("executions/get", {"execution_id": bob})
    assert hidden["error"]["code"] == NotFound.code
    stats = await who["bob"].call("executions/stats", {})
    assert (stats["principal"], stats["total"]["count"]) == ("bob", 1)

    every = await who["master"].call("executions/list", {})
    assert {e["execution_id"] for e in every["executions"]} == {alice, bob}
    only_bob = await who["master"].call("executions/list", {"principal": "bob"})
    assert [e["execution_id"] for e in only_bob["executions"]] == [bob]
    assert (await who["master"].call("executions/get", {"execution_id": bob}))["principal"] == "bob"

    for method in ("executions/list", "executions/get", "executions/stats"):
        refused = await who["runner"].request(method, {"execution_id": alice})
        assert refused["error"]["code"] == Forbidden.code
        assert "'executions' scope" in refused["error"]["message"]


# ---- hostile input -----------------------------------------------------------------


async def test_hostile_text_and_numbers_never_fail_a_write(
    start_daemon: Any, connect: Any, backend: str
) -> None:
    server, info = await start_daemon(**PYTHON_ONLY)
    client = await connect(info)
    now = time.time()
    nasty = "a\x00b\ud800c"
    huge = "x" * 2_000_000
    publish(
        server,
        fabricated("ex_nul", now, stdout_head=nasty, error_type="E\x00", error_message=nasty),
        fabricated(
            "ex_huge",
            now,
            stderr_head=huge,
            memory_peak_bytes=2**70,
            tool_calls=(ToolCallRecord("t\x00\udfff", 1.0, "ok"),),
        ),
    )
    code = "print('nul\\x00here')\nraise ValueError('bad\\x00\\ud800')"
    ran = await client.call("execute", python(code))
    assert ran["status"] == "error"

    with trio.fail_after(WAIT_S):
        await server.audit.wait_flushed()
    stats = server.audit.statistics()
    assert (stats.recorded, stats.lost) == (3, 0)
    # PostgreSQL's text cannot hold NUL: it becomes U+FFFD; SQLite keeps it.
    nul = "\x00" if backend == "sqlite" else "\ufffd"
    got = await client.call("executions/get", {"execution_id": "ex_nul"})
    assert (got["stdout_head"], got["error_type"]) == (f"a{nul}b\ufffdc", f"E{nul}")
    got = await client.call("executions/get", {"execution_id": "ex_huge"})
    assert len(got["stderr_head"]) == len(huge)
    assert got["memory_peak_bytes"] is None
    assert got["tool_calls"][0]["tool"] == f"t{nul}\ufffd"
    got = await client.call("executions/get", {"execution_id": ran["execution_id"]})
    assert got["stdout_head"] == f"nul{nul}here\n"


# ---- concurrency -------------------------------------------------------------------


async def test_forty_concurrent_executions_are_each_recorded_once(
    start_daemon: Any, connect: Any
) -> None:
    server, info = await start_daemon(**PYTHON_ONLY)
    results: list[dict[str, Any]] = []

    async def run(n: int) -> None:
        client = await connect(info)
        results.append(await client.call("execute", python(f"{n} * 2")))

    with trio.fail_after(WAIT_S * 2):
        async with trio.open_nursery() as nursery:
            for n in range(40):
                nursery.start_soon(run, n)
    assert sorted(r["result"] for r in results) == [n * 2 for n in range(40)]
    client = await connect(info)
    listed = await list_all(client, limit=7)
    assert sorted(e["execution_id"] for e in listed) == sorted(r["execution_id"] for r in results)
    stored = rows(server, "SELECT execution_id, count(*) FROM executions GROUP BY 1")
    assert len(stored) == 40
    assert {count for _, count in stored} == {1}
    assert server.audit.statistics().recorded == 40


async def test_a_full_buffer_drops_records_without_blocking(
    start_daemon: Any, connect: Any, caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    monkeypatch.setattr(logging.getLogger("conduit"), "propagate", True)
    server, info = await start_daemon(**PYTHON_ONLY)
    now = time.time()
    extra = 100
    # Published without a checkpoint in between: the writer cannot take any yet.
    publish(server, *(fabricated(f"ex_{n}", now) for n in range(BUFFER_RECORDS + extra)))
    stats = server.audit.statistics()
    # The writer, waiting for a record, may have been handed one past the buffer.
    assert stats.dropped + stats.waiting == BUFFER_RECORDS + extra
    assert stats.dropped in (extra - 1, extra)
    full = [r for r in caplog.records if "audit buffer is full" in r.getMessage()]
    assert len(full) == 1
    with trio.fail_after(WAIT_S):
        await server.audit.wait_flushed()
    assert server.audit.statistics().recorded == stats.waiting
    assert rows(server, "SELECT count(*) FROM executions") == [(stats.waiting,)]


async def test_records_arriving_apart_are_committed_together_and_a_read_ends_the_wait(
    start_daemon: Any, monkeypatch: Any
) -> None:
    # A delay no test outlives: only the reader can have the records written in time.
    monkeypatch.setattr(audit, "WRITE_DELAY_S", 600.0)
    server, _ = await start_daemon(**PYTHON_ONLY)
    batches: list[int] = []
    backend = server.audit._backend
    insert = backend.insert_records

    def counting(records: list[ExecutionRecord]) -> int:
        batches.append(len(records))
        return insert(records)

    monkeypatch.setattr(backend, "insert_records", counting)
    for n in range(3):
        publish(server, fabricated(f"ex_{n}", time.time()))
        await trio.sleep(0.01)  # the writer is scheduled between them
    assert batches == []
    with trio.fail_after(WAIT_S):
        await server.audit.wait_flushed()
    assert batches == [3]
    assert server.audit.statistics().recorded == 3


async def test_records_waiting_at_shutdown_are_written(
    make_config: Any, audit_url: dict[str, str]
) -> None:
    from conduit.daemon.server import Daemon

    server = Daemon(make_config(audit=audit_url, **PYTHON_ONLY))
    with trio.fail_after(WAIT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            publish(server, *(fabricated(f"ex_{n}", time.time()) for n in range(300)))
            assert server.audit.statistics().waiting == 300
            server.shutdown()
    assert rows(server, "SELECT count(*) FROM executions") == [(300,)]

    # On the next start the store is reopened as it was, and a record handed over
    # twice is kept once.
    server = Daemon(make_config(audit=audit_url, **PYTHON_ONLY))
    with trio.fail_after(WAIT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            publish(server, fabricated("ex_1", time.time()), fabricated("ex_new", time.time()))
            await server.audit.wait_flushed()
            assert server.audit.statistics().recorded == 1
            server.shutdown()
    assert rows(server, "SELECT count(*) FROM executions") == [(301,)]


async def test_an_answer_waits_for_its_commit_but_not_for_a_stalled_store(
    start_daemon: Any, connect: Any, monkeypatch: Any, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(logging.getLogger("conduit"), "propagate", True)
    monkeypatch.setattr(audit, "ANSWER_WAIT_S", 0.5)
    # Without the journal (PostgreSQL's default), the answer waits for the commit.
    server, info = await start_daemon(audit={"journal": False}, **PYTHON_ONLY)
    assert not (Path(server.config.server.state_dir) / JOURNAL_NAME).exists()
    assert not server.audit.statistics().journal
    client = await connect(info)
    backend = server.audit._backend
    insert = backend.insert_records
    committed: list[str] = []

    def recording(records: list[Any]) -> int:
        added = insert(records)
        committed.extend(r.execution_id for r in records if r.status != "running")
        return added

    monkeypatch.setattr(backend, "insert_records", recording)
    ran = await client.call("execute", python("1"))
    # The answer came after the commit holding the execution's end.
    assert committed == [ran["execution_id"]]

    release = threading.Event()
    monkeypatch.setattr(backend, "insert_records", stalled(recording, release))
    late = await client.call("execute", python("2"))
    # Answered while the store is still stalled on its record.
    assert late["execution_id"] not in committed
    assert late["status"] == "ok"
    assert server.audit.statistics().unconfirmed == 1
    assert any("answers are going out before" in r.getMessage() for r in caplog.records)
    release.set()
    with trio.fail_after(WAIT_S):
        await server.audit.wait_flushed()
    assert committed[-1] == late["execution_id"]


def stalled(
    insert: Callable[[list[Any]], int], release: threading.Event
) -> Callable[[list[Any]], int]:
    """`insert`, once `release` is set: a store stalled until then."""

    def stalling(records: list[Any]) -> int:
        release.wait(WAIT_S)
        return insert(records)

    return stalling


@sqlite_only
async def test_an_answer_waits_for_its_journal_line_not_its_commit(
    start_daemon: Any, connect: Any, monkeypatch: Any, tmp_path: Path
) -> None:
    # Nothing is committed unless someone asks: only the journal can make the answer safe.
    monkeypatch.setattr(audit, "WRITE_DELAY_S", 600.0)
    server, info = await start_daemon(**PYTHON_ONLY)
    client = await connect(info)
    journal = Path(server.config.server.state_dir) / JOURNAL_NAME
    assert server.audit.statistics().journal
    backend = server.audit._backend
    insert = backend.insert_records
    release = threading.Event()
    monkeypatch.setattr(backend, "insert_records", stalled(insert, release))
    ran = await client.call("execute", python("1"))
    assert ran["status"] == "ok"
    # Answered before any commit, and not as a store too slow to wait for: the journal
    # holds the execution's start and end, as a next start would replay them.
    assert server.audit.statistics().unconfirmed == 0
    assert sqlite_rows(server.audit.path, "SELECT count(*) FROM executions") == [(0,)]
    lines = journal.read_bytes().splitlines()
    held = [record_from_line(line) for line in lines]
    assert [(r.execution_id, r.status) for r in held] == [
        (ran["execution_id"], "running"),
        (ran["execution_id"], "ok"),
    ]
    # A read still finds it: it waits for the records handed over before it.
    release.set()
    with trio.fail_after(WAIT_S):
        got = await client.call("executions/get", {"execution_id": ran["execution_id"]})
    assert got["status"] == "ok"
    # Once everything handed over is committed, the journal is emptied.
    assert journal.read_bytes() == b""


# ---- retention -------------------------------------------------------------------


async def test_retention_purges_by_age_in_the_background(start_daemon: Any, connect: Any) -> None:
    audit = {"retention_days": 7, "purge_interval_s": 0.05}
    server, info = await start_daemon(audit=audit, **PYTHON_ONLY)
    client = await connect(info)
    now = time.time()
    old = [fabricated(f"ex_old{n}", now - (8 + n) * DAY_S) for n in range(50)]
    kept = fabricated("ex_recent", now - 6 * DAY_S)
    publish(server, *old, kept)
    fresh = await client.call("execute", python("1"))
    with trio.fail_after(WAIT_S):
        await server.audit.wait_flushed()
        assert server.audit.statistics().recorded == 52
        await server.audit.wait_upkeep()  # may have begun before the records arrived
        await server.audit.wait_upkeep()
    left = {e["execution_id"] for e in await list_all(client)}
    assert left == {"ex_recent", fresh["execution_id"]}
    assert server.audit.statistics().purged == 50


@sqlite_only
async def test_retention_purges_the_oldest_beyond_max_bytes(start_daemon: Any) -> None:
    max_bytes = 256 * 1024
    server, _ = await start_daemon(audit={"max_bytes": max_bytes}, **PYTHON_ONLY)
    now = time.time()
    bulky = {"stdout_head": "x" * 256, "stderr_head": "y" * 256, "result_head": "z" * 256}
    publish(server, *(fabricated(f"ex_{n:05}", now - 3600 + n, **bulky) for n in range(2000)))
    await server.audit.wait_flushed()
    path = server.audit.path
    assert store_bytes(path) > 2 * max_bytes
    await server.audit.upkeep()

    stats = server.audit.statistics()
    assert 0 < stats.purged < 2000
    # Purged down below the cap, and the space given back to the file system.
    assert stats.size_bytes <= max_bytes
    assert store_bytes(path) <= max_bytes
    left = [row[0] for row in sqlite_rows(path, "SELECT execution_id FROM executions ORDER BY 1")]
    assert left == [f"ex_{n:05}" for n in range(stats.purged, 2000)]
    assert sqlite_rows(path, "PRAGMA integrity_check") == [("ok",)]


# ---- degrading ---------------------------------------------------------------------


class Tmpfs:
    """A small tmpfs mounted on `path`, which tests may fill or make read-only."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def mount(self, *options: str) -> None:
        self.path.mkdir(exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", ",".join(("size=1m", *options)), "tmpfs", self.path],
            capture_output=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")

    async def remount(self, *options: str) -> None:
        await trio.run_process(["mount", "-o", ",".join(("remount", *options)), self.path])

    def fill(self) -> Path:
        """Fill the file system with one file; returns it (unlink it to free the space)."""
        filler = self.path / "filler"
        # Unbuffered: what the failed write left has no flush at close to fail again.
        full = pytest.raises(OSError, match="No space left")
        with filler.open("wb", buffering=0) as handle, full:
            _write_forever(handle)
        return filler

    def unmount(self) -> None:
        subprocess.run(["umount", "--lazy", self.path], check=False)


def _write_forever(handle: BinaryIO) -> None:
    while True:
        handle.write(b"\0" * 65536)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Tmpfs]:
    mounted = Tmpfs(tmp_path / "tmpfs")
    yield mounted
    mounted.unmount()


@sqlite_only
async def test_a_read_only_directory_degrades_to_logging_and_recovers(
    start_daemon: Any,
    connect: Any,
    tmpfs: Tmpfs,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr(logging.getLogger("conduit"), "propagate", True)
    # Root writes through file modes, so the directory is a read-only mount.
    tmpfs.mount("ro")
    path = tmpfs.path / "audit.sqlite3"
    audit = {"path": str(path), "purge_interval_s": 0.05}
    server, info = await start_daemon(audit=audit, **PYTHON_ONLY)
    client = await connect(info)
    for n in range(3):
        assert (await client.call("execute", python(f"{n}")))["status"] == "ok"
    with trio.fail_after(WAIT_S):
        await server.audit.wait_upkeep()  # a reopen tried, and failed again

    reply = await client.request("executions/list", {})
    assert reply["error"]["code"] == StoreUnavailable.code
    message = reply["error"]["message"]
    assert "the audit store is unavailable" in message
    assert str(path) in message
    assert "Read-only file system" in message
    assert "executions still run" in message
    status = (await client.call("daemon/status"))["audit"]
    # Each execution's running and ended records wait for the store.
    assert (status["state"], status["lost"], status["waiting"]) == ("unavailable", 0, 6)
    logged = [r for r in caplog.records if "audit store cannot open" in r.getMessage()]
    assert len(logged) == 1

    await tmpfs.remount("rw")
    with trio.fail_after(WAIT_S):
        # An upkeep under way may have tried before the remount; the next one opens it.
        while server.audit.statistics().state is not AuditState.OPEN:
            await server.audit.wait_upkeep()
    later = await client.call("execute", python("'recorded'"))
    listed = await client.call("executions/list", {})
    # What waited while the store was away is written once it opens.
    assert len(listed["executions"]) == 4
    assert listed["executions"][0]["execution_id"] == later["execution_id"]
    assert {e["status"] for e in listed["executions"]} == {"ok"}
    assert server.audit.statistics().lost == 0
    assert any("audit store working again" in r.getMessage() for r in caplog.records)


@sqlite_only
async def test_a_full_disk_keeps_serving_and_recovers_when_space_returns(
    start_daemon: Any,
    connect: Any,
    tmpfs: Tmpfs,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr(logging.getLogger("conduit"), "propagate", True)
    tmpfs.mount()
    path = tmpfs.path / "audit.sqlite3"
    server, info = await start_daemon(audit={"path": str(path)}, **PYTHON_ONLY)
    client = await connect(info)
    first = await client.call("execute", python("1"))
    await client.call("executions/list", {})
    filler = tmpfs.fill()

    kept = [await client.call("execute", python("print('x' * 300)")) for _ in range(3)]
    assert all(r["status"] == "ok" for r in kept)
    listed = await client.call("executions/list", {})
    assert [e["execution_id"] for e in listed["executions"]] == [first["execution_id"]]
    assert "the disk is full" in listed["warning"]
    assert server.audit.statistics().state is AuditState.FAILING
    logged = [r for r in caplog.records if "audit store cannot write" in r.getMessage()]
    assert len(logged) == 1
    assert "the disk is full" in logged[0].getMessage()

    filler.unlink()
    after = await client.call("execute", python("2"))
    # The read has the waiting records tried at once: written now the space is back.
    listed = await client.call("executions/list", {})
    assert [e["execution_id"] for e in listed["executions"]] == [
        after["execution_id"],
        *(r["execution_id"] for r in reversed(kept)),
        first["execution_id"],
    ]
    assert "warning" not in listed
    assert server.audit.statistics().lost == 0
    assert sqlite_rows(str(path), "PRAGMA integrity_check") == [("ok",)]


@sqlite_only
async def test_a_store_written_by_a_newer_version_is_left_alone(
    start_daemon: Any, connect: Any, tmp_path: Path
) -> None:
    path = tmp_path / "newer.sqlite3"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.close()
    _, info = await start_daemon(audit={"path": str(path)}, **PYTHON_ONLY)
    client = await connect(info)
    assert (await client.call("execute", python("1")))["status"] == "ok"
    reply = await client.request("executions/list", {})
    assert reply["error"]["code"] == StoreUnavailable.code
    assert "schema version 99" in reply["error"]["message"]
    assert "upgrade conduit" in reply["error"]["message"]
    assert sqlite_rows(str(path), "PRAGMA user_version") == [(99,)]


@sqlite_only
async def test_a_disabled_store_records_nothing_and_says_so(
    start_daemon: Any, connect: Any
) -> None:
    server, info = await start_daemon(audit={"enabled": False}, **PYTHON_ONLY)
    client = await connect(info)
    assert (await client.call("execute", python("1")))["status"] == "ok"
    reply = await client.request("executions/stats", {})
    assert reply["error"]["code"] == StoreUnavailable.code
    assert "audit.enabled = false" in reply["error"]["message"]
    assert not Path(server.audit.path).exists()
    assert dataclasses.asdict(server.audit.statistics())["state"] == "off"


@sqlite_only
async def test_a_reload_applies_retention_but_not_a_new_path(
    start_daemon: Any, make_config: Any, tmp_path: Path
) -> None:
    server, _ = await start_daemon(audit={"retention_days": 30}, **PYTHON_ONLY)
    changed = {"retention_days": 1.5, "max_bytes": 1048576, "path": "elsewhere.sqlite3"}
    make_config(audit=changed, **PYTHON_ONLY)  # rewrites the daemon's config file
    await server.reload()
    assert server.audit.config.retention_days == 1.5
    assert server.audit.config.max_bytes == 1048576
    assert server.audit.path == str(tmp_path / "state" / "audit.sqlite3")
    assert server.audit.config.path == ""
