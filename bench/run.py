"""Conduit's benchmark: one command, figures side by side with the reference.

    python bench/run.py [--quick]

Starts real `conduit serve` processes (warm pool, and no pool for cold starts) on
sockets in a temporary directory and measures, over loopback only:

- `ping` requests/s on one pipelined connection and on 8 connections;
- `execute` of a trivial TypeScript program, p50/p99, warm and cold;
- sustained executions/s with 8 concurrent clients;
- a plain `deno run` of the same program, the reference a sandbox has to beat.

Every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

BIN = Path(sys.executable).parent
PROGRAM = "const xs = [1, 2, 3];\nxs.reduce((a, b) => a + b, 0)"
START_TIMEOUT_S = 60


class Client:
    """Minimal pipelining NDJSON client."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""
        self.ids = itertools.count()

    @classmethod
    async def open(cls, path: str) -> Client:
        return cls(await trio.open_unix_socket(path))

    async def send(self, method: str, params: dict[str, Any] | None = None) -> None:
        message = {"jsonrpc": "2.0", "id": next(self.ids), "method": method}
        if params is not None:
            message["params"] = params
        await self.stream.send_all(json.dumps(message).encode() + b"\n")

    async def send_many(self, payload: bytes) -> None:
        await self.stream.send_all(payload)

    async def recv_available(self) -> list[bytes]:
        """Every complete line available now, at least one."""
        while b"\n" not in self.buffer:
            chunk = await self.stream.receive_some(1 << 20)
            if not chunk:
                raise EOFError
            self.buffer += chunk
        *complete, self.buffer = self.buffer.split(b"\n")
        return complete

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        await self.send(method, params)
        reply = json.loads((await self.recv_available())[0])
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply["result"]


ECHO_SERVER = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "mcp_echo_server.py"
UPSTREAM = f"""
[[upstreams]]
name = "echo"
transport = "stdio"
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(ECHO_SERVER))}]
"""
# A program that times each of `n` sequential tool calls from inside the sandbox.
TOOL_LOOP = """
const times = [];
for (let i = 0; i < inputs.n; i++) {
  const started = performance.now();
  await tools.echo.echo({ text: "x" });
  times.push(performance.now() - started);
}
return times;
"""


@asynccontextmanager
async def daemon(workdir: Path, name: str, pool_size: int) -> AsyncIterator[str]:
    """A `conduit serve` process with the echo upstream; yields its socket path."""
    config = workdir / f"{name}.toml"
    config.write_text(
        f"[executors.deno]\npool_size = {pool_size}\n"
        "[limits]\nmax_concurrent_executions = 8\nqueue_size = 256\n" + UPSTREAM
    )
    socket_path = str(workdir / f"{name}.sock")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONDUIT_")}
    env["CONDUIT_STATE_DIR"] = str(workdir / f"{name}-state")
    log = (workdir / f"{name}.log").open("wb")
    process = await trio.lowlevel.open_process(
        [str(BIN / "conduit"), "--config", str(config), "serve", "--socket", socket_path],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        with trio.fail_after(START_TIMEOUT_S):
            while True:
                try:
                    client = await Client.open(socket_path)
                    await client.call("ping")
                    await client.stream.aclose()
                    break
                except OSError:
                    await trio.sleep(0.05)
        yield socket_path
    finally:
        process.terminate()
        with trio.move_on_after(10):
            await process.wait()
        log.close()


def percentiles(samples_s: list[float]) -> dict[str, float]:
    ordered = sorted(samples_s)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000  # noqa: E731
    return {
        "n": len(ordered),
        "p50_ms": pick(0.50),
        "p99_ms": pick(0.99),
        "mean_ms": statistics.fmean(ordered) * 1000,
    }


async def ping_pipelined(path: str, total: int, window: int = 256) -> float:
    """Requests/s with up to `window` pings in flight on one connection."""
    client = await Client.open(path)
    line = b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n'
    started = time.perf_counter()
    sent = received = 0
    while received < total:
        room = min(window - (sent - received), total - sent)
        if room > 0:
            await client.send_many(line * room)
            sent += room
        received += len(await client.recv_available())
    elapsed = time.perf_counter() - started
    await client.stream.aclose()
    return total / elapsed


async def ping_connections(path: str, per_connection: int, connections: int = 8) -> float:
    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(connections):
            nursery.start_soon(ping_pipelined, path, per_connection)
    return per_connection * connections / (time.perf_counter() - started)


async def wait_pool_full(client: Client, size: int) -> None:
    with trio.move_on_after(5):
        while True:
            listed = await client.call("executors/list")
            deno = next(e for e in listed["executors"] if e["name"] == "deno")
            if (deno.get("pool") or {}).get("idle", 0) >= size:
                return
            await trio.sleep(0.005)


async def execute_latency(path: str, runs: int, *, warm_pool: int) -> dict[str, float]:
    """Sequential executions; with a pool, each one starts when the pool is full again."""
    client = await Client.open(path)
    params = {"language": "typescript", "code": PROGRAM}
    samples: list[float] = []
    for _ in range(runs):
        if warm_pool:
            await wait_pool_full(client, warm_pool)
        started = time.perf_counter()
        result = await client.call("execute", params)
        samples.append(time.perf_counter() - started)
        assert result["status"] == "ok" and result["result"] == 6, result
    await client.stream.aclose()
    return percentiles(samples)


async def execute_throughput(path: str, clients: int, duration_s: float) -> float:
    done = 0
    params = {"language": "typescript", "code": PROGRAM}

    async def worker() -> None:
        nonlocal done
        client = await Client.open(path)
        while True:
            await client.call("execute", params)
            done += 1

    started = time.perf_counter()
    with trio.move_on_after(duration_s):
        async with trio.open_nursery() as nursery:
            for _ in range(clients):
                nursery.start_soon(worker)
    return done / (time.perf_counter() - started)


def plain_deno(runs: int, workdir: Path) -> dict[str, float]:
    """`deno run` of the same program as a file, started fresh each time."""
    script = workdir / "program.ts"
    script.write_text(
        f"console.log(JSON.stringify((() => {{ {PROGRAM.replace(chr(10), ' return ')} }})()));\n"
    )
    deno = shutil.which("deno", path=str(BIN)) or "deno"
    command = [
        deno,
        "run",
        "--no-prompt",
        "--no-remote",
        "--no-config",
        "--no-lock",
        "--no-npm",
        str(script),
    ]
    env = {
        "DENO_DIR": str(workdir / "deno-dir"),
        "NO_COLOR": "1",
        "PATH": os.environ.get("PATH", ""),
    }
    subprocess.run(command, env=env, capture_output=True, check=True)  # fill the cache once
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(command, env=env, capture_output=True, check=True)
        samples.append(time.perf_counter() - started)
    return percentiles(samples)


async def wait_upstream(path: str) -> None:
    client = await Client.open(path)
    with trio.fail_after(START_TIMEOUT_S):
        while (await client.call("upstreams/list"))["upstreams"][0]["state"] != "ready":
            await trio.sleep(0.05)
    await client.stream.aclose()


async def tool_calls_in_sandbox(path: str, calls: int) -> dict[str, float]:
    """Per-call round trip measured inside the program (the first call opens the link)."""
    client = await Client.open(path)
    params = {
        "language": "typescript",
        "code": TOOL_LOOP,
        "inputs": {"n": calls + 1},
        "limits": {"tool_calls": calls + 1, "timeout_ms": 60_000},
    }
    result = await client.call("execute", params)
    assert result["status"] == "ok", result
    await client.stream.aclose()
    return percentiles([ms / 1000 for ms in result["result"][1:]])


async def hundred_calls_end_to_end(path: str, runs: int) -> dict[str, float]:
    """`execute` of a program making 100 sequential tool calls, whole request timed."""
    client = await Client.open(path)
    code = "for (let i = 0; i < 100; i++) await tools.echo.echo({ text: 'x' });\n'done'"
    samples = []
    for _ in range(runs):
        await wait_pool_full(client, 2)
        started = time.perf_counter()
        result = await client.call("execute", {"language": "typescript", "code": code})
        samples.append(time.perf_counter() - started)
        assert result["result"] == "done", result
    await client.stream.aclose()
    return percentiles(samples)


async def direct_mcp_calls(calls: int) -> dict[str, float]:
    """The same calls made straight to the upstream with the official MCP SDK client."""
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    server = StdioServerParameters(command=sys.executable, args=[str(ECHO_SERVER)])
    samples = []
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        await session.call_tool("echo", {"text": "x"})
        for _ in range(calls):
            started = time.perf_counter()
            await session.call_tool("echo", {"text": "x"})
            samples.append(time.perf_counter() - started)
    return percentiles(samples)


def row(name: str, figures: dict[str, float]) -> str:
    p50, p99 = figures["p50_ms"], figures["p99_ms"]
    return f"  {name:44} p50 {p50:8.2f} ms   p99 {p99:8.2f} ms   (n={figures['n']})"


async def main(quick: bool) -> dict[str, Any]:
    scale = 0.25 if quick else 1.0
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="cbench-", dir="/tmp") as tmp:
        workdir = Path(tmp)
        async with daemon(workdir, "warm", pool_size=2) as path:
            await wait_upstream(path)
            results["tool_call_in_sandbox"] = await tool_calls_in_sandbox(path, int(400 * scale))
            results["hundred_tool_calls"] = await hundred_calls_end_to_end(path, int(20 * scale))
            results["ping_pipelined_rps"] = await ping_pipelined(path, int(40_000 * scale))
            results["ping_8conn_rps"] = await ping_connections(path, int(10_000 * scale))
            results["execute_warm"] = await execute_latency(path, int(200 * scale), warm_pool=2)
            results["execute_8clients_per_s"] = await execute_throughput(path, 8, 10 * scale)
        async with daemon(workdir, "cold", pool_size=0) as path:
            results["execute_cold"] = await execute_latency(path, int(60 * scale), warm_pool=0)
        results["plain_deno_run"] = plain_deno(int(60 * scale), workdir)
    results["direct_mcp_call"] = await direct_mcp_calls(int(400 * scale))
    return results


def report(results: dict[str, Any]) -> None:
    print(
        f"conduit bench — {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
        f"{time.strftime('%Y-%m-%d')}"
    )
    print(
        "ping (one connection, pipelined)      "
        f"{results['ping_pipelined_rps']:10.0f} req/s   (target >= 15000)"
    )
    print(f"ping (8 connections)                  {results['ping_8conn_rps']:10.0f} req/s")
    print("execute, trivial TypeScript, end to end:")
    print(row("conduit, warm pool", results["execute_warm"]))
    print(row("conduit, cold (no pool)", results["execute_cold"]))
    print(row("reference: plain `deno run`", results["plain_deno_run"]))
    speedup = results["plain_deno_run"]["p50_ms"] / results["execute_warm"]["p50_ms"]
    print(
        f"  warm conduit vs plain deno run: {speedup:.1f}x faster at p50 "
        "(target >= 3x, p50 <= 8 ms)"
    )
    print(f"execute throughput, 8 clients         {results['execute_8clients_per_s']:10.1f} exec/s")
    print("tool calls to a trivial stdio upstream:")
    print(row("from inside a Deno sandbox, per call", results["tool_call_in_sandbox"]))
    print(row("reference: MCP SDK client, directly", results["direct_mcp_call"]))
    overhead = results["tool_call_in_sandbox"]["p50_ms"] - results["direct_mcp_call"]["p50_ms"]
    print(f"  conduit's overhead per call at p50: {overhead:.3f} ms (target <= 1 ms)")
    print(row("execute with 100 sequential calls", results["hundred_tool_calls"]))
    print("  (target: 100 calls <= 150 ms end to end)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a quarter of the iterations")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    figures = trio.run(main, args.quick)
    report(figures)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
