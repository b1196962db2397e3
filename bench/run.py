"""Conduit's benchmark: one command, figures side by side with their references.

    python bench/run.py [--quick] [--json FILE]

Starts real `conduit serve` processes (a warm Deno pool, then no pool for cold starts)
on sockets in a temporary directory and measures, over loopback only:

- `ping` requests/s on one pipelined connection and on 8 connections;
- `execute` of a trivial TypeScript program on deno, p50/p99, warm and cold, and
  executions/s with 8 concurrent clients; a plain `deno run` is its reference; and on
  its route (wasm-js, its types erased) paced and back to back, with 8 clients and
  with 100 tool calls, beside deno back to back and the erasure's own time
  (bench/typescript.py);
- `execute` of a trivial Python program (wasm-python) and of trivial JavaScript on
  wasm-js (skipped, with the reason, while that executor is not available), and Python
  executions/s with 8 concurrent clients;
- tool calls to a stdio echo upstream from Deno and from Python programs, and over the
  daemon's socket with no sandbox, against the official MCP SDK client calling it directly;
- the pyodide executor, in daemons of its own (bench/pyodide_bench.py): trivial Python
  warm and cold, tool calls, executions/s with 8 clients, the daemon's memory over 500
  executions, and a plain Pyodide load under `deno run` as the reference;
- the peer, PyPI `llm-wasm-sandbox` (bench/peer.py), running the same Python and
  JavaScript in its own venv, its runs alternating with the Wasmtime series;
- what agents do, in a daemon with every executor on (bench/agent_bench.py): `ping`
  and a trivial execution per executor after the daemon sat idle 2 s and 8 s, beside a
  plain blocking echo server; sixteen programs waiting a second on a tool at once; and
  a realistic program per executor (the standard library, 100 KB of inputs, 5 tool
  calls), p50 and executions/s with 8 clients; 10,000 printed lines and a 500 KB
  result per executor (bench/bulk.py); a session's step (`x += 1`), a 1 MB file
  in and out, and the memory an idle session holds, per executor (bench/sessions.py);
  `python -m bench.files_bench` measures the file round trip alone, beside a trivial run;
- MCP clients on one daemon (bench/mcp_bench.py): a trivial `execute_python` as an MCP
  `tools/call` over streamable HTTP and over stdio, beside the socket, p50 and
  executions/s with 8 clients, and the daemon's memory with 8 MCP clients connected.

Every loop is bounded in count and time. The modules beside this file hold the parts.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

# Run as a script (`python bench/run.py`): make the `bench` package importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trio

from bench import (
    agent_bench,
    machine,
    mcp_bench,
    pyodide_bench,
    tool_calls,
    typescript,
    wasm_bench,
)
from bench.conduit_daemon import daemon, wait_executors, wait_upstream
from bench.latency import execute_latency, plain_deno
from bench.programs import DENO_REQUEST, PYTHON_REQUEST
from bench.report import report
from bench.throughput import execute_throughput, ping_connections, ping_pipelined

THROUGHPUT_CLIENTS = 8
PYTHON_TOOL_CALLS = 50
# Calls per block when the SDK client and the guests take turns (`interleaved_calls`).
INTERLEAVED_CALLS = 50


def iterations(quick: bool) -> dict[str, int]:
    """How many of each measurement; `--quick` runs about a quarter (and a short peer)."""
    full = {
        "ts_tool_calls": 400,
        "ts_hundred_calls": 20,
        "ping": 40_000,
        "ping_per_connection": 10_000,
        "ts_warm": 200,
        "ts_cold": 60,
        # TypeScript on its route (wasm-js), and back to back on deno.
        "ts_route": 1000,
        "ts_deno_back_to_back": 100,
        # A program that computes for a while (fib(27)): on the route, deno, wasm-js.
        "ts_compute": 20,
        "plain_deno": 60,
        "throughput_s": 10,
        # A Wasmtime execution takes a millisecond or two: 1000 span seconds, not one
        # moment of a VM whose speed moves by 2x within minutes.
        "python": 1000,
        "wasm_js": 1000,
        "python_tool_runs": 20,
        "interleaved_rounds": 8,
        "direct_mcp": 400,
        "peer_python": 5,
        "peer_javascript": 10,
        "pyodide_warm": 100,
        "pyodide_back_to_back": 40,
        "pyodide_cold": 20,
        "pyodide_tool_runs": 20,
        "pyodide_memory": 500,
        "pyodide_throughput_s": 10,
        "plain_pyodide": 5,
        # Per executor, each execution once its pool is full: pyodide's take ~0.5 s.
        "realistic": 40,
        # Per executor and program: 10,000 printed lines, a 500 KB result.
        "bulk": 20,
        # Rounds of idle gaps: each is a minute (6 targets, 2 s and 8 s each).
        "idle_rounds": 5,
        # A session's steps, per executor, and 1 MB file round trips.
        "session_steps": 400,
        "file_runs": 20,
        # MCP tools/call of a trivial execute_python, per way in (bench/mcp_bench.py).
        "mcp_calls": 400,
    }
    if not quick:
        return full
    reduced = {name: max(2, count // 4) for name, count in full.items()}
    reduced["pyodide_memory"] = 100
    # A shorter window would measure the ramp of 8 clients on pyodide, not the rate.
    reduced["pyodide_throughput_s"] = full["pyodide_throughput_s"]
    return reduced


async def conduit_figures(workdir: Path, n: dict[str, int]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    async with (
        wasm_bench.peer_runs(workdir) as beside,
        daemon(workdir, "warm", pool_size=2) as path,
    ):
        await wait_upstream(path)
        await wait_executors(path)  # a first start builds the Wasmtime components
        results["tool_call_in_sandbox"] = await tool_calls.ts_calls_in_sandbox(
            path, n["ts_tool_calls"]
        )
        results["hundred_tool_calls"] = await tool_calls.ts_hundred_calls(
            path, n["ts_hundred_calls"]
        )
        results["tool_call_via_socket"] = await tool_calls.daemon_calls(path, n["ts_tool_calls"])
        results["interleaved_tool_calls"] = await tool_calls.interleaved_calls(
            path, INTERLEAVED_CALLS, n["interleaved_rounds"]
        )
        results["ping_pipelined_rps"] = await ping_pipelined(path, n["ping"])
        results["ping_8conn_rps"] = await ping_connections(path, n["ping_per_connection"])
        results["execute_warm"] = await execute_latency(
            path, DENO_REQUEST, n["ts_warm"], warm_pool=2
        )
        results["execute_8clients_per_s"] = await execute_throughput(
            path, DENO_REQUEST, THROUGHPUT_CLIENTS, n["throughput_s"]
        )
        results["typescript"] = await typescript.figures(path, n, THROUGHPUT_CLIENTS)
        results.update(await wasm_figures(path, n, beside))
        results["peer"] = beside.figures()
    # Cold Deno only, as before the Wasmtime executors: nothing else loads or competes.
    async with daemon(workdir, "cold", pool_size=0, wasm=False) as path:
        await wait_executors(path)
        results["execute_cold"] = await execute_latency(path, DENO_REQUEST, n["ts_cold"])
    results["plain_deno_run"] = plain_deno(n["plain_deno"], workdir)
    results["direct_mcp_call"] = await tool_calls.direct_mcp_calls(n["direct_mcp"])
    results["direct_mcp_call_legacy"] = await tool_calls.direct_mcp_calls(
        n["direct_mcp"], mode="legacy"
    )
    return results


async def wasm_figures(path: str, n: dict[str, int], beside: wasm_bench.PeerRuns) -> dict[str, Any]:
    """wasm-python and wasm-js figures from the warm daemon at `path`, their series
    alternating with the peer's runs."""
    return {
        "execute_python": await wasm_bench.python_latency(
            path, n["python"], beside, n["peer_python"]
        ),
        "execute_wasm_js": await wasm_bench.wasm_js_latency(
            path, n["wasm_js"], beside, n["peer_javascript"]
        ),
        "python_tool_calls": await tool_calls.python_calls(
            path, PYTHON_TOOL_CALLS, n["python_tool_runs"]
        ),
        "execute_python_8clients_per_s": await execute_throughput(
            path, PYTHON_REQUEST, THROUGHPUT_CLIENTS, n["throughput_s"]
        ),
    }


def main(quick: bool) -> dict[str, Any]:
    n = iterations(quick)
    results: dict[str, Any] = {"quick": quick, "machine": machine.describe(), "iterations": n}
    results["iterations"]["wasm_warmup"] = wasm_bench.WARMUP
    results["iterations"]["wasm_block_warmup"] = wasm_bench.BLOCK_WARMUP
    interference = results["machine"]["interference"] = {}
    with tempfile.TemporaryDirectory(prefix="cbench-", dir="/tmp") as tmp:
        workdir = Path(tmp)
        started = machine.snapshot()
        results.update(trio.run(conduit_figures, workdir, n))
        interference["conduit"] = machine.interference(started, machine.snapshot())
        started = machine.snapshot()
        results["agent"] = trio.run(agent_bench.figures, workdir, n)
        interference["agent"] = machine.interference(started, machine.snapshot())
        started = machine.snapshot()
        results["pyodide"] = trio.run(pyodide_bench.figures, workdir, n)
        interference["pyodide"] = machine.interference(started, machine.snapshot())
        started = machine.snapshot()
        results["mcp"] = trio.run(mcp_bench.run, workdir, n["mcp_calls"], n["throughput_s"])
        interference["mcp"] = machine.interference(started, machine.snapshot())
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="about a quarter of the iterations")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    figures = main(args.quick)
    report(figures)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
