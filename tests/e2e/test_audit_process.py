"""The audit store of `conduit serve` as a process: surviving kill -9 on SQLite and on
PostgreSQL, and `conduit executions` as a person uses it."""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path

import pytest
import trio

from tests.conftest import RawClient
from tests.e2e.helpers import call, conduit_serve, wait_available
from tests.e2e.test_cli import conduit

# Python only: fewer runtimes to start on a shared two-core machine.
CONFIG = """
[limits]
max_concurrent_executions = 4
[executors.deno]
enabled = false
[executors.wasm_js]
enabled = false
"""
# Clients running executions back to back while the daemon is killed.
CLIENTS = 6
# Answers to have had before the kill: several of the writer's transactions, so that it
# is busy when the kill lands.
ANSWERED_BEFORE_KILL = 60
# Each client stops after this many, so the test ends even if the kill never comes.
MOST_PER_CLIENT = 400
# A started execution's running row is committed with the writer's next batch, within
# its gathering delay (50 ms) and a commit: one whose output reached its client this
# long before the kill is on record, however busy the machine.
ON_RECORD_AFTER_S = 2.0


def stored_rows(store: Path | str) -> dict[str, str]:
    """execution_id → status, read directly from the SQLite file or PostgreSQL."""
    if isinstance(store, str):
        import psycopg

        with psycopg.connect(store) as conn:
            return dict(conn.execute("SELECT execution_id, status FROM executions").fetchall())
    db = sqlite3.connect(store)
    try:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        return dict(db.execute("SELECT execution_id, status FROM executions").fetchall())
    finally:
        db.close()


async def listed_ids(sock: str) -> set[str]:
    """Every execution `executions/list` shows, through all its pages."""
    found: set[str] = set()
    cursor = None
    while True:
        reply = await call(sock, "executions/list", {"limit": 1000, "cursor": cursor})
        found |= {e["execution_id"] for e in reply["result"]["executions"]}
        cursor = reply["result"]["next_cursor"]
        if cursor is None:
            return found


class Load:
    """What the clients learnt before the kill: the executions answered (id → status),
    and those whose output arrived but not their answer (id → when it arrived)."""

    def __init__(self) -> None:
        self.answered: dict[str, str] = {}
        self.streaming: dict[str, float] = {}
        self.enough = trio.Event()

    async def keep_executing(self, sock: str, n: int) -> None:
        client = RawClient(await trio.open_unix_socket(sock))
        try:
            for m in range(MOST_PER_CLIENT):
                await self._one(client, n, m)
        except (EOFError, trio.BrokenResourceError, ConnectionResetError):
            pass  # the daemon was killed under this client
        finally:
            await client.aclose()

    async def _one(self, client: RawClient, n: int, m: int) -> None:
        # Most are trivial; every third prints, then runs a while, streaming its output;
        # the first client's run until the kill.
        slow = m % 3 == 0 or n == 0
        code = f"import time\nprint('client {n} run {m}', flush=True)\n"
        code += f"time.sleep({60 if n == 0 else 0.2})\n" if slow else ""
        params = {"language": "python", "code": code + f"{m}", "stream": slow}
        request = {"jsonrpc": "2.0", "id": m, "method": "execute", "params": params}
        await client.send(request)
        while True:
            message = await client.recv()
            if message.get("method") == "execution/output":
                self.streaming.setdefault(message["params"]["execution_id"], trio.current_time())
            elif message.get("id") == m:
                result = message["result"]
                self.answered[result["execution_id"]] = result["status"]
                self.streaming.pop(result["execution_id"], None)
                if len(self.answered) >= ANSWERED_BEFORE_KILL:
                    self.enough.set()
                return


def backend_config(backend: str, request: pytest.FixtureRequest) -> tuple[str, Path | str]:
    """The config's `[audit]` table for `backend`, and where its rows are read."""
    if backend == "sqlite":
        return "", Path("state") / "audit.sqlite3"
    url = request.getfixturevalue("postgres_url")
    return f'[audit]\nurl = "{url}"\n', url


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_kill_9_under_load_leaves_every_answered_execution_on_record(
    tmp_path: Path, short_dir: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """The guarantee: an answer goes only once its execution's record is safe (in the
    journal beside a SQLite store, committed on PostgreSQL), so after kill -9 every
    answered execution is on record as it was answered; one that was running is found
    at the next start and recorded `interrupted`."""
    sock = str(short_dir / "c.sock")
    audit_table, store = backend_config(backend, request)
    if isinstance(store, Path):
        store = tmp_path / store
    config = tmp_path / "conduit.toml"
    config.write_text(CONFIG + audit_table)
    load = Load()

    serving = conduit_serve(tmp_path, sock, "--config", str(config))
    async with serving as daemon, trio.open_nursery() as nursery:
        await wait_available(sock, "wasm-python")
        for n in range(CLIENTS):
            nursery.start_soon(load.keep_executing, sock, n)
        with trio.fail_after(180):
            await load.enough.wait()
            while (
                not load.streaming
                or trio.current_time() - min(load.streaming.values()) < ON_RECORD_AFTER_S
            ):
                await trio.sleep(0.05)
        daemon.signal(signal.SIGKILL)
        killed_at = trio.current_time()
        with trio.fail_after(30):
            await daemon.process.wait()

    stored = stored_rows(store)  # what was committed at the kill
    answered = load.answered
    long_running = {i for i, t in load.streaming.items() if killed_at - t >= ON_RECORD_AFTER_S}
    assert long_running
    assert {stored.get(i) for i in long_running} == {"running"}
    if backend == "postgresql":  # no journal: every answer was committed before it went
        assert {i: stored.get(i) for i in answered} == answered

    async with conduit_serve(tmp_path, sock, "--config", str(config)):
        status = (await call(sock, "daemon/status"))["result"]["audit"]
        after_restart = await listed_ids(sock)
        await wait_available(sock, "wasm-python")
        new = await call(sock, "execute", {"language": "python", "code": "'after'"})
        again = await listed_ids(sock)
    assert again == after_restart | {new["result"]["execution_id"]}
    after = stored_rows(store)
    del after[new["result"]["execution_id"]]
    # Every answer is on record with the status it gave: committed before the kill, or
    # in the journal and written at this start before anything was marked.
    assert {i: after.get(i) for i in answered} == answered
    assert after_restart == set(after) >= set(stored)
    # Beyond those: executions running at the kill (one per client at most), and those
    # recorded whose answers the kill stopped.
    assert len(set(after) - set(answered)) <= CLIENTS
    assert "running" not in after.values()
    interrupted = {i for i, s in after.items() if s == "interrupted"}
    assert not interrupted & set(answered)
    assert long_running <= interrupted
    assert status["state"] == "open"
    assert status["interrupted"] == len(interrupted)


@pytest.mark.slow
async def test_conduit_executions_prints_tables(tmp_path: Path, short_dir: Path) -> None:
    sock = str(short_dir / "c.sock")
    config = tmp_path / "conduit.toml"
    config.write_text(CONFIG)
    async with conduit_serve(tmp_path, sock, "--config", str(config)):
        await wait_available(sock, "wasm-python")
        # One through `conduit exec`, as a person runs it; the others as a client does.
        hi = b"print('hi')\n1 + 1"
        ran = await conduit("exec", "--socket", sock, "--lang", "py", "-", stdin=hi)
        assert (ran.returncode, ran.stdout) == (0, b"hi\n2\n"), ran.stderr
        for program in ("raise KeyError('k')", "2"):
            await call(sock, "execute", {"language": "python", "code": program})
        at = ("--socket", sock)
        listing = await conduit("executions", "list", *at)
        as_json = await conduit("executions", "list", *at, "--json")
        errors = await conduit("executions", "list", *at, "--status", "error")
        paged = await conduit("executions", "list", *at, "--limit", "2")
        recent = await conduit("executions", "list", *at, "--since", "1h")
        executions = json.loads(as_json.stdout)["executions"]
        first = executions[-1]["execution_id"]
        shown = await conduit("executions", "get", first, *at)
        stats = await conduit("executions", "stats", *at, "--window", "1h")
        bad = await conduit("executions", "stats", *at, "--window", "soon")

    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.decode().splitlines()
    header = lines[0]
    assert header.split() == [
        "ID", "STARTED", "PRINCIPAL", "EXECUTOR", "LANGUAGE", "STATUS", "DURATION", "TOOLS",
        "ERROR",
    ]  # fmt: skip
    assert len(lines) == 4
    # Aligned: every row's status sits under STATUS.
    column = header.index("STATUS")
    assert [line[column:].split()[0] for line in lines[1:]] == ["ok", "error", "ok"]
    assert [e["status"] for e in executions] == ["ok", "error", "ok"]
    assert lines[2].split()[-1] == "KeyError"
    assert all("wasm-python" in line for line in lines[1:])

    assert len(errors.stdout.decode().splitlines()) == 2
    assert len(paged.stdout.decode().splitlines()) == 3
    assert "more: conduit executions list --cursor " in paged.stderr.decode()
    assert len(recent.stdout.decode().splitlines()) == 4

    assert shown.returncode == 0, shown.stderr
    text = shown.stdout.decode()
    assert f"execution      {first}" in text
    assert "status         ok, exit code 0" in text
    assert 'stdout         3 B "hi\\n"' in text
    assert "code (first lines):\n  print('hi')\n  1 + 1" in text

    assert stats.returncode == 0, stats.stderr
    table = [line.split() for line in stats.stdout.decode().splitlines()]
    assert table[0][:2] == ["executions", "started"]
    assert table[1][:4] == ["GROUP", "COUNT", "OK", "P50"]
    assert table[2][:3] == ["all", "3", "66.7%"]
    assert table[3][:4] == ["executor", "wasm-python", "3", "66.7%"]
    assert table[4][:4] == ["language", "python", "3", "66.7%"]
    assert bad.returncode == 2
    assert "'soon' is not a duration" in bad.stderr.decode()
