"""What the audit store's durability costs a trivial execution: an in-process daemon,
one client running `1` on wasm-python back to back, then four clients at once.

Modes: `micro` (a commit of one execution's two records, on each backend, and a
thread hop, measured alone), `off` (no audit store), `after` (the record written after
the answer, no running row: the store before answers waited for their commit), and
`sqlite`, `postgresql` and `postgresql-async` (synchronous_commit off) as the daemon
runs now (running row, answer after commit). PostgreSQL runs durable (fsync on) in a
temporary directory.

    .venv/bin/python -m bench.audit_cost [--runs 400] [--modes off,after,sqlite,postgresql]

Needs the wasm-python component built by the tests (.pytest_cache/d/wasm-components).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from conduit.daemon import audit
from conduit.daemon import server as server_module
from conduit.daemon.config import load_config
from conduit.daemon.server import Daemon
from tests.conftest import MASTER_TOKEN, RawClient, link_wasm_cache
from tests.fixtures.postgres import PostgresServer, find_bindir

ROOT = Path(__file__).resolve().parents[1]
WASM_CACHE = ROOT / ".pytest_cache" / "d" / "wasm-components"
WARMUP = 50
CONCURRENT_CLIENTS = 4


def _asynchronous(pg: PostgresServer | None) -> str:
    """A database whose commits do not wait for the WAL flush (synchronous_commit off)."""
    if pg is None:
        return ""
    import psycopg

    url = pg.new_database()
    name = url.split("@/", 1)[1].split("?", maxsplit=1)[0]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {name} SET synchronous_commit = off")
    return url


def _config(root: Path, audit_table: str) -> Path:
    path = root / "conduit.toml"
    path.write_text(
        f'[server]\nsocket = "{root / "c.sock"}"\nstate_dir = "{root / "state"}"\n'
        f'[auth]\ntoken = "{MASTER_TOKEN}"\n[metrics]\nenabled = false\n'
        "[executors.deno]\nenabled = false\n[executors.wasm_js]\nenabled = false\n" + audit_table
    )
    return path


class _StoreAsBefore(audit.AuditStore):
    """The store as it was: no running rows, answers not waiting for the commit."""

    async def wait_recorded(self) -> None:
        return None

    def record_nowait(self, event: Any) -> None:
        if event.started is None:
            super().record_nowait(event)


class _TimedStore(audit.AuditStore):
    """The store as it runs now, timing what each answer waits for its commit."""

    waits: list[float]

    async def wait_recorded(self) -> None:
        began = time.perf_counter()
        await super().wait_recorded()
        self.waits.append(time.perf_counter() - began)


async def _series(sock: str, runs: int, clients: int) -> tuple[list[float], float, float]:
    """Latencies (s) of `runs` executions over `clients` clients; wall time; CPU time."""
    latencies: list[float] = []

    async def client(count: int) -> None:
        raw = RawClient(await trio.open_unix_socket(sock))
        for _ in range(count):
            began = time.perf_counter()
            await raw.call("execute", {"language": "python", "code": "1"})
            latencies.append(time.perf_counter() - began)
        await raw.aclose()

    cpu, wall = time.process_time(), time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(client, runs // clients)
    return latencies, time.perf_counter() - wall, time.process_time() - cpu


async def measure(mode: str, runs: int, pg: PostgresServer | None, workdir: Path) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(dir=workdir))
    link_wasm_cache(root / "state", WASM_CACHE)
    table = {
        "off": "[audit]\nenabled = false\n",
        "after": "",
        "sqlite": "",
        "postgresql": f'[audit]\nurl = "{pg.new_database() if pg else ""}"\n',
        "postgresql-after": f'[audit]\nurl = "{pg.new_database() if pg else ""}"\n',
        "postgresql-async": f'[audit]\nurl = "{_asynchronous(pg)}"\n',
    }[mode]
    config = load_config(_config(root, table), environ={})
    store_class = server_module.AuditStore
    _TimedStore.waits = []
    server_module.AuditStore = _StoreAsBefore if mode.endswith("after") else _TimedStore  # type: ignore[misc]
    try:
        daemon = Daemon(config)
    finally:
        server_module.AuditStore = store_class  # type: ignore[misc]
    sock = str(root / "c.sock")
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.serve)
        await daemon.registry.wait_ready()
        await _series(sock, WARMUP, 1)
        _TimedStore.waits = []
        one, _, cpu_one = await _series(sock, runs, 1)
        waits_one, _TimedStore.waits = _TimedStore.waits, []
        many, wall_many, cpu_many = await _series(sock, runs, CONCURRENT_CLIENTS)
        waits_many = _TimedStore.waits
        daemon.shutdown()
    waited = {}
    if waits_one:
        waited = {
            "sequential_commit_wait_median_us": round(statistics.median(waits_one) * 1e6),
            "sequential_commit_wait_p95_us": round(
                sorted(waits_one)[int(len(waits_one) * 0.95)] * 1e6
            ),
            f"x{CONCURRENT_CLIENTS}_commit_wait_median_us": round(
                statistics.median(waits_many) * 1e6
            ),
        }
    return {
        **waited,
        "mode": mode,
        "sequential_mean_ms": round(statistics.fmean(one) * 1000, 3),
        "sequential_median_ms": round(statistics.median(one) * 1000, 3),
        "sequential_cpu_ms_per_exec": round(cpu_one / runs * 1000, 3),
        f"x{CONCURRENT_CLIENTS}_exec_per_s": round(runs / wall_many, 1),
        f"x{CONCURRENT_CLIENTS}_cpu_ms_per_exec": round(cpu_many / runs * 1000, 3),
        f"x{CONCURRENT_CLIENTS}_median_ms": round(statistics.median(many) * 1000, 3),
    }


def _commit_pairs(backend: Any, runs: int) -> dict[str, float]:
    """One execution's running and ended records per transaction, as a lone trivial
    execution has them written: wall and this thread's CPU per commit (µs)."""
    from dataclasses import replace

    from tests.daemon.test_audit import fabricated

    backend.open()
    walls, cpus = [], []
    for n in range(runs):
        ended = fabricated(f"ex_{n}", time.time())
        pair = [replace(ended, status="running"), ended]
        wall, cpu = time.perf_counter(), time.thread_time()
        backend.insert_records(pair)
        cpus.append(time.thread_time() - cpu)
        walls.append(time.perf_counter() - wall)
    backend.close()
    return {
        "commit_wall_median_us": round(statistics.median(walls) * 1e6),
        "commit_cpu_median_us": round(statistics.median(cpus) * 1e6),
    }


async def _thread_hop_us(runs: int) -> float:
    """What handing work to a worker thread and back costs (µs, median)."""
    hops = []
    for _ in range(runs):
        began = time.perf_counter()
        await trio.to_thread.run_sync(int)
        hops.append(time.perf_counter() - began)
    return round(statistics.median(hops) * 1e6)


async def micro(runs: int, pg: PostgresServer | None, workdir: Path) -> None:
    from conduit.daemon.audit_db import SqliteBackend

    root = Path(tempfile.mkdtemp(dir=workdir))
    print(json.dumps({"thread_hop_median_us": await _thread_hop_us(runs)}))
    sqlite = SqliteBackend(str(root / "audit.sqlite3"), "bench")
    print(json.dumps({"backend": "sqlite", **_commit_pairs(sqlite, runs)}))
    if pg is not None:
        from conduit.daemon.audit_pg import PostgresBackend

        postgres = PostgresBackend(pg.new_database(), "bench")
        print(json.dumps({"backend": "postgresql (fsync on)", **_commit_pairs(postgres, runs)}))
        postgres = PostgresBackend(_asynchronous(pg), "bench")
        print(
            json.dumps(
                {"backend": "postgresql (synchronous_commit off)", **_commit_pairs(postgres, runs)}
            )
        )


async def run(modes: list[str], runs: int, rounds: int, pg: PostgresServer | None) -> None:
    with tempfile.TemporaryDirectory(prefix="cd-bench-", dir="/tmp") as workdir:
        for _ in range(rounds):
            for mode in modes:
                if mode == "micro":
                    await micro(runs, pg, Path(workdir))
                else:
                    result = await measure(mode, runs, pg, Path(workdir))
                    print(json.dumps(result), flush=True)


def main(modes: list[str], runs: int, rounds: int) -> None:
    """Run the modes; the PostgreSQL server is stopped however the run ends (SIGTERM
    included), outside Trio, which need not unwind cleanly from a signal."""
    pg = None
    if any(m.startswith("postgresql") or m == "micro" for m in modes):
        bindir = find_bindir()
        if bindir is None:
            sys.exit("PostgreSQL is not installed")
        pg = PostgresServer(bindir, durable=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        if pg is not None:
            pg.start()
        trio.run(run, modes, runs, rounds, pg)
    finally:
        if pg is not None:
            pg.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", default="off,after,sqlite,postgresql-after,postgresql")
    args = parser.parse_args()
    main(args.modes.split(","), args.runs, args.rounds)
