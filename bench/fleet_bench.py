"""A fleet behind HAProxy (deploy/haproxy/haproxy.cfg): trivial Python executions over
TCP straight to one daemon, through HAProxy to that one, and through HAProxy to three,
executions/s and p50 with the same clients.

    python -m bench.fleet_bench [--total N] [--clients C]

What HAProxy costs an execution is the second beside the first; what more daemons buy
is the third beside the second, on this machine's cores (three daemons on two cores
share them). Needs `haproxy` (Debian: `apt install haproxy`); says so without it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio

from bench.conduit_daemon import STATE_DIR, daemon, wait_executors
from bench.stats import percentiles
from conduit.client import AsyncClient

HAPROXY = shutil.which("haproxy") or (
    "/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None
)
DEPLOYED = Path(__file__).resolve().parents[1] / "deploy" / "haproxy" / "haproxy.cfg"
TOKEN = "cdt_bench-fleet-token-0123456789abcdef"
# On TCP and a metrics port of its own, with the fleet's one token.
MEMBER = f"""
[server]
tcp = "127.0.0.1:0"
[metrics]
listen = "127.0.0.1:0"
[auth]
token = "{TOKEN}"
"""
PROGRAM = "1"


def _ports(log: Path) -> tuple[int, int] | None:
    """The TCP and metrics ports a daemon picked, once its start-up line is written."""
    for line in log.read_text().splitlines():
        event = json.loads(line)
        if event.get("msg") == "conduit listening":
            tcp = next(x for x in event["listeners"].split(", ") if x.startswith("tcp:"))
            metrics = event["metrics"].rsplit(":", 1)[1].removesuffix("/metrics")
            return int(tcp.rsplit(":", 1)[1]), int(metrics)
    return None


@contextlib.asynccontextmanager
async def member(workdir: Path, name: str, state_dir: Path) -> AsyncIterator[tuple[int, int]]:
    """A daemon of the fleet; its TCP and metrics ports once it can run Python."""
    async with daemon(workdir, name, pool_size=0, extra=MEMBER, state_dir=state_dir) as path:
        await wait_executors(path)
        with trio.fail_after(30):
            while (ports := _ports(workdir / f"{name}.log")) is None:
                await trio.sleep(0.05)
        yield ports


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.asynccontextmanager
async def haproxy(workdir: Path, name: str, members: list[tuple[int, int]]) -> AsyncIterator[int]:
    """HAProxy on the deployed configuration in front of `members`; its port once every
    member is up (its first health checks passed)."""
    assert HAPROXY is not None
    port = _free_port()
    lines = [
        f"    bind 127.0.0.1:{port}" if line.strip().startswith("bind ") else line
        for line in DEPLOYED.read_text().splitlines()
        if not line.strip().startswith("server ")
    ]
    lines += [
        f"    server m{n} 127.0.0.1:{rpc} check port {metrics}"
        for n, (rpc, metrics) in enumerate(members)
    ]
    config = workdir / f"{name}.cfg"
    config.write_text("\n".join(lines) + "\n")
    process = await trio.lowlevel.open_process(
        [HAPROXY, "-db", "-f", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        await trio.sleep(2.5)  # two passing health checks a second apart ("rise 2")
        yield port
    finally:
        process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()


async def load(port: int, total: int, clients: int) -> dict[str, Any]:
    """`total` trivial executions over `clients` connections to `port`."""
    latencies: list[float] = []
    left = total

    async def client() -> None:
        nonlocal left
        async with AsyncClient(tcp=f"127.0.0.1:{port}", token=TOKEN) as connection:
            while left > 0:
                left -= 1
                began = time.perf_counter()
                result = await connection.execute(PROGRAM, language="python")
                latencies.append(time.perf_counter() - began)
                result.raise_for_status()

    began = time.perf_counter()
    with trio.fail_after(300):
        async with trio.open_nursery() as nursery:
            for _ in range(clients):
                nursery.start_soon(client)
    elapsed = time.perf_counter() - began
    return {"executions_per_s": round(len(latencies) / elapsed, 1), **percentiles(latencies)}


async def figures(total: int, clients: int) -> dict[str, Any]:
    if HAPROXY is None:
        return {"skipped": "haproxy is not installed (Debian: apt install haproxy)"}
    with tempfile.TemporaryDirectory(prefix="conduit-fleet-") as directory:
        workdir = Path(directory)
        async with contextlib.AsyncExitStack() as stack:
            # The first on the cache's own state: it builds what a fresh cache lacks.
            first = await stack.enter_async_context(member(workdir, "fleet0", STATE_DIR))
            results = {"one daemon, direct": await load(first[0], total, clients)}
            proxy = await stack.enter_async_context(haproxy(workdir, "haproxy-one", [first]))
            results["one daemon, through HAProxy"] = await load(proxy, total, clients)
            members = [first]
            for n in (1, 2):
                state = workdir / f"fleet{n}-state"
                state.mkdir()
                (state / "wasm").symlink_to(STATE_DIR / "wasm", target_is_directory=True)
                members.append(await stack.enter_async_context(member(workdir, f"fleet{n}", state)))
            proxy = await stack.enter_async_context(haproxy(workdir, "haproxy-three", members))
            results["three daemons, through HAProxy"] = await load(proxy, total, clients)
        return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--total", type=int, default=1000, help="executions per figure")
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    results = trio.run(figures, args.total, args.clients)
    if "skipped" in results:
        print(results["skipped"])
        return
    print(f"{'':34} {'exec/s':>8} {'p50 ms':>8} {'p99 ms':>8}")
    for name, row in results.items():
        print(f"{name:34} {row['executions_per_s']:8.1f} {row['p50_ms']:8.2f} {row['p99_ms']:8.2f}")


if __name__ == "__main__":
    main()
