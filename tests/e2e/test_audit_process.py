"""The audit store of `conduit serve` as a process: surviving kill -9, and
`conduit executions` as a person uses it."""

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
# Rows to see committed before the kill: several of the writer's transactions, so that
# it is busy when the kill lands.
ROWS_BEFORE_KILL = 60
# Each client stops after this many, so the test ends even if the kill never comes.
MOST_PER_CLIENT = 400


def stored_ids(path: Path) -> list[str]:
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        return [row[0] for row in db.execute("SELECT execution_id FROM executions")]
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


@pytest.mark.slow
async def test_kill_9_while_writing_keeps_every_committed_row(
    tmp_path: Path, short_dir: Path
) -> None:
    """The guarantee: a row once committed survives kill -9, and the file stays sound.
    A client may have its result before its row is committed (the write follows the
    answer), so rows seen through executions/list before the kill are what must
    survive; executions answered but not yet written may be lost."""
    sock = str(short_dir / "c.sock")
    config = tmp_path / "conduit.toml"
    config.write_text(CONFIG)
    store = tmp_path / "state" / "audit.sqlite3"
    answered: set[str] = set()
    seen: set[str] = set()

    async def keep_executing(n: int) -> None:
        client = RawClient(await trio.open_unix_socket(sock))
        try:
            for m in range(MOST_PER_CLIENT):
                code = f"print('client {n} run {m}')\n{m}"
                result = await client.call("execute", {"language": "python", "code": code})
                answered.add(result["execution_id"])
        except (EOFError, trio.BrokenResourceError):
            pass  # the daemon was killed under this client
        finally:
            await client.aclose()

    serving = conduit_serve(tmp_path, sock, "--config", str(config))
    async with serving as daemon, trio.open_nursery() as nursery:
        await wait_available(sock, "wasm-python")
        for n in range(CLIENTS):
            nursery.start_soon(keep_executing, n)
        with trio.fail_after(180):
            # Each list waits for the records handed over before it: no sleep needed.
            while len(seen) < ROWS_BEFORE_KILL:
                seen |= await listed_ids(sock)
        daemon.signal(signal.SIGKILL)
        with trio.fail_after(30):
            await daemon.process.wait()

    stored = set(stored_ids(store))
    assert seen <= stored
    # Every row is an execution the daemon ran; at most one per client was committed
    # and then killed before its answer went out.
    assert len(stored - answered) <= CLIENTS
    # The executions still waiting to be written at the kill are few, not the store.
    assert len(answered - stored) < len(answered) // 2

    async with conduit_serve(tmp_path, sock, "--config", str(config)):
        after_restart = await listed_ids(sock)
        await wait_available(sock, "wasm-python")
        new = await call(sock, "execute", {"language": "python", "code": "'after'"})
        status = await call(sock, "daemon/status")
        again = await listed_ids(sock)
    assert after_restart == stored
    assert again == stored | {new["result"]["execution_id"]}
    assert status["result"]["audit"]["state"] == "open"
    assert len(stored_ids(store)) == len(again)


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
