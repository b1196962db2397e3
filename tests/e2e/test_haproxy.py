"""Three `conduit serve` daemons sharing one PostgreSQL record, behind Debian's HAProxy
on deploy/haproxy/haproxy.cfg: a mixed load through it while one daemon is killed."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import shutil
import signal
import socket
import subprocess
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.client import AsyncClient, ConnectionLost
from tests.conftest import MASTER_TOKEN, link_wasm_cache
from tests.e2e.helpers import RunningDaemon, base_env, conduit_serve, wait_available
from tests.e2e.test_audit_process import CONFIG, stored_rows

HAPROXY = shutil.which("haproxy") or next(
    (p for p in ("/usr/sbin/haproxy",) if Path(p).exists()), None
)
DEPLOYED = Path(__file__).parents[2] / "deploy" / "haproxy" / "haproxy.cfg"
DAEMONS = 3
CLIENTS = 6
PROGRAMS_PER_CLIENT = 25
# Answers to have had before the kill, so that every daemon is busy when it lands.
ANSWERED_BEFORE_KILL = 30
# Each client gives up on a program after this many lost connections.
MOST_TRIES = 5

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed: apt-get install haproxy"),
]


def daemon_config(audit_url: str) -> str:
    """Python only (as the kill -9 test's), on TCP and a metrics port of its own, with
    the fleet's one token and record."""
    return (
        f"""
[server]
tcp = "127.0.0.1:0"
[auth]
token = "{MASTER_TOKEN}"
[metrics]
listen = "127.0.0.1:0"
[audit]
url = "{audit_url}"
"""
        + CONFIG
    )


@dataclass
class Member:
    """One daemon of the fleet, and where it serves."""

    daemon: RunningDaemon
    rpc_port: int
    metrics_port: int


async def served_ports(daemon: RunningDaemon) -> tuple[int, int]:
    """The TCP and metrics ports a daemon picked, from its start-up line."""
    with trio.fail_after(30):
        while True:
            for line in daemon.log().splitlines():
                event = json.loads(line)
                if event.get("msg") == "conduit listening":
                    tcp = next(x for x in event["listeners"].split(", ") if x.startswith("tcp:"))
                    metrics = event["metrics"].rsplit(":", 1)[1].removesuffix("/metrics")
                    return int(tcp.rsplit(":", 1)[1]), int(metrics)
            await trio.sleep(0.05)  # the log is a file; nothing announces a new line


@contextlib.asynccontextmanager
async def fleet(
    tmp_path: Path, short_dir: Path, wasm_cache: Path, audit_url: str
) -> AsyncIterator[list[Member]]:
    async with contextlib.AsyncExitStack() as stack:
        members = []
        for n in range(DAEMONS):
            home = tmp_path / f"daemon{n}"
            link_wasm_cache(home / "state", wasm_cache)
            (home / "conduit.toml").write_text(daemon_config(audit_url))
            sock = str(short_dir / f"d{n}.sock")
            serving = conduit_serve(
                home, sock, "--config", str(home / "conduit.toml"), env=base_env(home / "state")
            )
            daemon = await stack.enter_async_context(serving)
            members.append(Member(daemon, *await served_ports(daemon)))
        for member in members:
            await wait_available(member.daemon.socket_path, "wasm-python")
        yield members


def haproxy_config(members: list[Member], port: int, stats: Path) -> str:
    """The deployed configuration, with this test's addresses for its own."""
    lines = []
    for line in DEPLOYED.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("server "):
            continue
        lines.append(f"    bind 127.0.0.1:{port}" if stripped.startswith("bind ") else line)
        if stripped == "global":
            lines.append(f"    stats socket {stats} level admin")
    lines += [
        f"    server conduit{n} 127.0.0.1:{m.rpc_port} check port {m.metrics_port}"
        for n, m in enumerate(members)
    ]
    return "\n".join(lines) + "\n"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def servers_up(stats: Path) -> dict[str, str]:
    """Each server's status, from HAProxy's stats socket."""
    stream = await trio.open_unix_socket(str(stats))
    async with stream:
        await stream.send_all(b"show stat\n")
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    rows = csv.DictReader(io.StringIO(data.decode().lstrip("# ")))
    return {r["svname"]: r["status"] for r in rows if r["svname"].startswith("conduit")}


@contextlib.asynccontextmanager
async def haproxy(tmp_path: Path, members: list[Member]) -> AsyncIterator[int]:
    """HAProxy running the deployed configuration; the port it listens on."""
    assert HAPROXY is not None
    stats = tmp_path / "haproxy.sock"
    port = free_port()
    config = tmp_path / "haproxy.cfg"
    config.write_text(haproxy_config(members, port, stats))
    log = (tmp_path / "haproxy.log").open("wb")
    process = await trio.lowlevel.open_process(
        [HAPROXY, "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        with trio.fail_after(30):
            while True:
                assert process.poll() is None, (tmp_path / "haproxy.log").read_text()
                with contextlib.suppress(OSError):
                    if set((await servers_up(stats)).values()) == {"UP"}:
                        break
                await trio.sleep(0.1)  # health checks run each second
        yield port
    finally:
        process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()
        log.close()


@dataclass
class Load:
    """What the clients saw: each program's answer, and the connections they lost."""

    answered: dict[str, dict[str, Any]] = field(default_factory=dict)  # program → result
    lost: list[str] = field(default_factory=list)
    enough: trio.Event = field(default_factory=trio.Event)

    async def client(self, port: int, n: int) -> None:
        async with AsyncClient(tcp=f"127.0.0.1:{port}", token=MASTER_TOKEN) as client:
            for m in range(PROGRAMS_PER_CLIENT):
                await self._program(client, f"p{n}-{m}", slow=m % 2 == 0)

    async def _program(self, client: AsyncClient, name: str, slow: bool) -> None:
        # Half wait a while (a tool's answer, say), so some are in flight at the kill.
        code = f"import time\ntime.sleep({0.3 if slow else 0})\n{name!r}"
        for _ in range(MOST_TRIES):
            try:
                result = await client.execute(code, language="python")
            except ConnectionLost as exc:
                self.lost.append(str(exc))
                continue  # the next call connects again, through HAProxy
            self.answered[name] = {"id": result.execution_id, "result": result.result}
            if len(self.answered) >= ANSWERED_BEFORE_KILL:
                self.enough.set()
            return
        raise AssertionError(f"{name}: lost {MOST_TRIES} connections in a row")


async def test_a_daemon_killed_under_load_costs_its_clients_one_retry_and_no_record(
    tmp_path: Path, short_dir: Path, wasm_cache: Path, postgres_url: str
) -> None:
    load = Load()
    with trio.fail_after(240):
        async with (
            fleet(tmp_path, short_dir, wasm_cache, postgres_url) as members,
            haproxy(tmp_path, members) as port,
            trio.open_nursery() as nursery,
        ):
            for n in range(CLIENTS):
                nursery.start_soon(load.client, port, n)
            await load.enough.wait()
            members[1].daemon.signal(signal.SIGKILL)
    # Every program was answered in the end, with its own result.
    programs = {f"p{n}-{m}" for n in range(CLIENTS) for m in range(PROGRAMS_PER_CLIENT)}
    assert set(load.answered) == programs
    assert all(answer["result"] == name for name, answer in load.answered.items())
    # The killed daemon's clients were told their connection was lost, then retried.
    assert load.lost and all("connection" in message.lower() for message in load.lost)
    stored = stored_rows(postgres_url)
    # Each answered execution is on record once, as it was answered.
    answered_ids = [answer["id"] for answer in load.answered.values()]
    assert len(set(answered_ids)) == len(answered_ids)
    assert {stored.get(i) for i in answered_ids} == {"ok"}
    # Beyond those: what ran on the killed daemon when it died (at most its slots).
    assert len(set(stored) - set(answered_ids)) <= 4 * 2
    by_daemon = Counter(stored_daemons(postgres_url, answered_ids).values())
    assert len(by_daemon) == DAEMONS  # the load was spread over all three


def stored_daemons(url: str, ids: list[str]) -> dict[str, str]:
    """execution_id → the daemon that recorded it, for `ids`."""
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT execution_id, daemon_id FROM executions WHERE execution_id = ANY(%s)", (ids,)
        ).fetchall()
    return dict(rows)
