"""The pyodide executor (Python in Pyodide under Deno), and a plain Pyodide load as its
reference.

Two daemons of their own, after the others have stopped, with the Deno pool empty and
the Wasmtime executors off, so nothing else loads or competes for the two cores:

- "pyodide-warm", `pool_size` 2: two worker processes, each running programs one at a
  time in a fresh interpreter and making its next one (~0.2 s of CPU) after each.
  - warm latency: each timed execution starts once both processes have an interpreter
    ready, as an agent's requests seconds apart find them; `cold_starts` counts the
    requests that found none;
  - back to back: sequential executions with no pause, so each also waits for the
    interpreters the last ones used to be made again: the rate the machine sustains;
  - the tool calls (wasm-python's program, paced as the warm series), executions/s
    with 8 clients, and memory: the daemon's RSS before and after `n` executions by 8
    clients, and the RSS of each worker process, idle, before and after them.
- "pyodide-cold", `pool_size` 0: a worker process is started for each execution (it
  compiles Pyodide and makes its first interpreter on the request path).

The reference is `deno run --allow-read=<Pyodide's directory>` of a script that loads
Pyodide the documented way (`loadPyodide()`, no snapshot) and runs `1+1`.

A first start installs Pyodide with npm and builds the snapshot (seconds); when the
executor cannot be made available, the whole section is skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import trio

from bench import tool_calls
from bench.client import Client
from bench.conduit_daemon import (
    BIN,
    BUILD_TIMEOUT_S,
    STATE_DIR,
    daemon,
    executors,
    wait_upstream,
)
from bench.latency import check_result, execute_latency, execute_samples, wait_pool_full
from bench.programs import PYODIDE_REQUEST
from bench.stats import percentiles
from bench.throughput import execute_count, execute_throughput

NAME = "pyodide"
WARM_POOL = 2
CLIENTS = 8
TOOL_CALLS = 50
# Untimed executions before the warm series (the daemon's own first-call costs).
WARMUP = 5
# How long a pool may take to fill, or the daemon to finish what a cancelled
# throughput run left in flight, before we measure anyway.
SETTLE_TIMEOUT_S = 60
# The memory run: 500 executions at ~5/s or more is under 2 min.
MEMORY_BUDGET_S = 400
# Daemon RSS is sampled every this many executions of the memory run.
SAMPLE_EVERY = 50
PLAIN_BUDGET_S = 180
PLAIN_TIMEOUT_S = 120
# What the executor says while npm installs Pyodide or before it started.
PREPARING = ("Pyodide is being installed", "the executor has not been started")

PLAIN_SCRIPT = """\
const dir = Deno.args[0];
const { loadPyodide } = await import(`file://${dir}/pyodide.mjs`);
const pyodide = await loadPyodide({ indexURL: `${dir}/` });
console.log(pyodide.runPython("1+1"));
"""


async def figures(workdir: Path, n: dict[str, int]) -> dict[str, Any]:
    """Every pyodide figure, or {"skipped": why}."""
    results: dict[str, Any] = {}
    warm = daemon(workdir, "pyodide-warm", pool_size=0, wasm=False, pyodide_pool=WARM_POOL)
    async with warm as path:
        reason = await wait_pyodide(path, WARM_POOL)
        if reason is not None:
            return {"skipped": reason}
        results["version"] = (await executors(path))[NAME]["version"]
        await wait_upstream(path)
        results["warm"] = await warm_latency(path, n["pyodide_warm"])
        await settle(path)
        results["back_to_back"] = await back_to_back(path, n["pyodide_back_to_back"])
        results["tool_calls"] = await tool_calls.python_calls(
            path,
            TOOL_CALLS,
            n["pyodide_tool_runs"],
            executor=NAME,
            before_each=_pool_full,
            first_opens_link=True,
        )
        # The same call with no sandbox, in this daemon: the guest's share is the rest.
        # After the last refill, which would otherwise compete with it.
        await settle(path)
        results["tool_call_via_socket"] = await tool_calls.daemon_calls(
            path, n["pyodide_tool_runs"] * TOOL_CALLS
        )
        await settle(path)
        results["throughput_8clients_per_s"] = await execute_throughput(
            path, PYODIDE_REQUEST, CLIENTS, n["pyodide_throughput_s"]
        )
        results["memory"] = await memory(path, n["pyodide_memory"])
    async with daemon(workdir, "pyodide-cold", pool_size=0, wasm=False, pyodide_pool=0) as path:
        reason = await wait_pyodide(path, 0)
        if reason is not None:
            results["cold"] = {"skipped": reason}
        else:
            cold = await execute_latency(path, PYODIDE_REQUEST, n["pyodide_cold"], warmup=1)
            results["cold"] = {"figures": cold}
    results["plain_pyodide_load"] = plain_pyodide(n["plain_pyodide"], workdir)
    return results


async def wait_pyodide(path: str, pool: int) -> str | None:
    """Until the executor is available with `pool` idle workers; why not, or None.

    Bounded by BUILD_TIMEOUT_S (a first start installs Pyodide and builds the snapshot).
    """
    reason = "its pool did not fill"
    with trio.move_on_after(BUILD_TIMEOUT_S):
        while True:
            info = (await executors(path)).get(NAME)
            if info is None:
                return "executors/list does not know it"
            if info.get("available"):
                if (info.get("pool") or {}).get("idle", 0) >= pool:
                    return None
            else:
                reason = info.get("reason") or "unavailable"
                if not reason.startswith(PREPARING):
                    return reason
            await trio.sleep(0.1)
    return f"not ready within {BUILD_TIMEOUT_S} s: {reason}"


async def _pool_full(client: Client) -> None:
    await wait_pool_full(client, WARM_POOL, NAME)


async def _pool(client: Client) -> dict[str, Any]:
    listed = await client.call("executors/list")
    return next(e for e in listed["executors"] if e["name"] == NAME)["pool"]


async def warm_latency(path: str, runs: int) -> dict[str, Any]:
    """Sequential executions, each once the pool is full; and how many found it empty."""
    client = await Client.open(path)
    try:
        for _ in range(WARMUP):
            await _pool_full(client)
            check_result(await client.call("execute", PYODIDE_REQUEST))
        await _pool_full(client)
        before = (await _pool(client))["cold_starts"]
        figures = await execute_latency(
            path, PYODIDE_REQUEST, runs, warm_pool=WARM_POOL, pool_of=NAME
        )
        cold = (await _pool(client))["cold_starts"] - before
    finally:
        await client.aclose()
    return {"figures": figures, "cold_starts": cold}


async def back_to_back(path: str, runs: int) -> dict[str, Any]:
    """Sequential executions with no pause between them; how many found no interpreter
    ready, and how long they queued for one."""
    client = await Client.open(path)
    try:
        await _pool_full(client)
        before = (await _pool(client))["cold_starts"]
        samples = await execute_samples(path, PYODIDE_REQUEST, runs)
        cold = (await _pool(client))["cold_starts"] - before
    finally:
        await client.aclose()
    return {"figures": percentiles(samples), "cold_starts": cold}


async def settle(path: str) -> None:
    """Until no execution runs and the pool is full again (at most SETTLE_TIMEOUT_S)."""
    client = await Client.open(path)
    try:
        with trio.move_on_after(SETTLE_TIMEOUT_S):
            while (await client.call("daemon/status"))["executions"]["running"]:
                await trio.sleep(0.05)
            await wait_pool_full(client, WARM_POOL, NAME, within_s=SETTLE_TIMEOUT_S)
            await trio.sleep(0.5)  # the last worker's task finishes reaping it
    finally:
        await client.aclose()


async def memory(path: str, total: int) -> dict[str, Any]:
    """The daemon's RSS before and after `total` executions by CLIENTS clients, each
    taken with nothing running and the pool full; and its idle workers' RSS."""
    client = await Client.open(path)
    pid = (await client.call("daemon/status"))["pid"]
    await client.aclose()
    await settle(path)
    before = proc_status(pid)
    workers_before = idle_workers(pid)
    samples: list[tuple[int, int]] = [(0, before["VmRSS"])]

    def sample(done: int) -> None:
        if done % SAMPLE_EVERY == 0:
            samples.append((done, proc_status(pid)["VmRSS"]))

    done, elapsed = await execute_count(
        path, PYODIDE_REQUEST, CLIENTS, total, MEMORY_BUDGET_S, on_done=sample
    )
    await settle(path)
    after = proc_status(pid)
    return {
        "executions": done,
        "asked": total,
        "seconds": round(elapsed, 1),
        "per_s": done / elapsed if elapsed else 0.0,
        "daemon_before_kib": before,
        "daemon_after_kib": after,
        "daemon_rss_samples_kib": samples,
        "idle_workers_before_kib": workers_before,
        "idle_workers_after_kib": idle_workers(pid),
    }


STATUS_FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")


def proc_status(pid: int) -> dict[str, int]:
    """Memory lines of /proc/<pid>/status, in KiB (those that are there)."""
    figures = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in STATUS_FIELDS:
                figures[key] = int(value.split()[0])
    return figures


def idle_workers(daemon_pid: int) -> list[dict[str, int]]:
    """/proc status of the daemon's Pyodide worker processes (all idle when settled):
    its children running the worker script, or, inside the operating-system sandbox,
    those of its `bwrap` children."""
    processes = _processes()
    parents = {daemon_pid} | {
        pid for pid, (ppid, name, _) in processes.items() if ppid == daemon_pid and name == "bwrap"
    }
    return [
        proc_status(pid)
        for pid, (ppid, name, cmdline) in processes.items()
        if ppid in parents and name != "bwrap" and b"pyodide_worker.js" in cmdline
    ]


def _processes() -> dict[int, tuple[int, str, bytes]]:
    """Every process's parent, name and command line, by pid (those that exit as they
    are read are left out)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="ascii", errors="replace")
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            ppid = int(stat.rpartition(")")[2].split()[1])
            found[int(entry.name)] = (ppid, name, (entry / "cmdline").read_bytes())
        except (OSError, ValueError, IndexError):
            continue  # exited meanwhile
    return found


def pyodide_dir() -> Path | None:
    """The Pyodide package the daemon installed (the newest, if several are)."""
    found = sorted(
        (STATE_DIR / "pyodide").glob("pyodide-npm-*/node_modules/pyodide/pyodide.mjs"),
        key=lambda mjs: mjs.stat().st_mtime,
    )
    return found[-1].parent if found else None


def plain_pyodide(runs: int, workdir: Path) -> dict[str, Any]:
    """`deno run` of a script that loads Pyodide (no snapshot) and runs 1+1, each run a
    fresh process, after one untimed run (Deno's module cache); {"skipped": why} if
    Pyodide is not installed."""
    directory = pyodide_dir()
    if directory is None:
        return {"skipped": f"no Pyodide installed under {STATE_DIR / 'pyodide'}"}
    script = workdir / "load_pyodide.mjs"
    script.write_text(PLAIN_SCRIPT)
    deno = shutil.which("deno", path=str(BIN)) or "deno"
    command = [deno, "run", "--no-prompt", f"--allow-read={directory}", str(script)]
    command.append(str(directory))
    env = {
        "DENO_DIR": str(workdir / "deno-dir-pyodide"),
        "NO_COLOR": "1",
        "PATH": os.environ.get("PATH", ""),
    }

    def once() -> float:
        started = time.perf_counter()
        done = subprocess.run(
            command, env=env, capture_output=True, check=True, timeout=PLAIN_TIMEOUT_S
        )
        elapsed = time.perf_counter() - started
        if done.stdout.strip() != b"2":
            raise AssertionError(f"plain Pyodide printed {done.stdout!r}, not 2")
        return elapsed

    once()
    samples: list[float] = []
    deadline = time.monotonic() + PLAIN_BUDGET_S
    while len(samples) < runs and time.monotonic() < deadline:
        samples.append(once())
    return {"figures": percentiles(samples), "pyodide": str(directory)}
