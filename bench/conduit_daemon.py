"""Starting a real `conduit serve` for the benchmark and waiting until it can be measured.

The daemon's state directory is kept in the user's cache (not the run's temporary
directory) so that the Wasmtime components it builds on first start (~12 s for
wasm-python, more for wasm-js), and the Pyodide install and snapshot, are made once,
not once per benchmark run; the deno executor keeps nothing there that outlives a
worker. Daemons run one after another, so sharing it is safe. The audit store is the
exception: each daemon gets a fresh one in the run's directory. Kept in the cache it
grew with every run up to its 256 MiB cap, and a daemon then started by purging it
while the first series were measured, and wrote into indexes far larger than its page
cache: run after run would not have measured the same daemon.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from bench.client import Client

BIN = Path(sys.executable).parent
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "conduit-bench"
STATE_DIR = CACHE_DIR / "daemon-state"
START_TIMEOUT_S = 60
# A first start builds the Wasmtime components; past this we measure what is ready.
BUILD_TIMEOUT_S = 600
# What an executor that is still building its component reports as its state.
PREPARING_STATES = frozenset({"not started", "building"})

ECHO_SERVER = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "mcp_echo_server.py"
INSTANT_SERVER = Path(__file__).resolve().parent / "instant_upstream.py"
# The SDK's echo server, and one that answers at once (`instant`): what a call costs
# the daemon, apart from what it costs the server.
UPSTREAM = f"""
[[upstreams]]
name = "echo"
transport = "stdio"
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(ECHO_SERVER))}]

[[upstreams]]
name = "instant"
transport = "stdio"
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(INSTANT_SERVER))}]
"""


def _config(
    pool_size: int,
    wasm: bool,
    pyodide_pool: int | None,
    max_concurrent: int,
    audit_path: Path,
    extra: str,
) -> str:
    pyodide = (
        f"[executors.pyodide]\nenabled = true\npool_size = {pyodide_pool}\n"
        if pyodide_pool is not None
        else ""
    )
    return (
        f"[executors.deno]\npool_size = {pool_size}\n"
        f"[executors.wasm_python]\nenabled = {json.dumps(wasm)}\n"
        f"[executors.wasm_js]\nenabled = {json.dumps(wasm)}\n"
        + pyodide
        + f"[limits]\nmax_concurrent_executions = {max_concurrent}\nqueue_size = 256\n"
        + f"[audit]\npath = {json.dumps(str(audit_path))}\n"
        + UPSTREAM
        + extra
    )


@asynccontextmanager
async def daemon(
    workdir: Path,
    name: str,
    *,
    pool_size: int,
    wasm: bool = True,
    pyodide_pool: int | None = None,
    max_concurrent: int = 8,
    extra: str = "",
    state_dir: Path = STATE_DIR,
) -> AsyncIterator[str]:
    """A `conduit serve` process with the echo upstream; yields its socket path once
    it answers `ping` (executors may still be building: see `wait_executors`).
    `wasm=False` leaves the Wasmtime executors out (a Deno-only daemon); a
    `pyodide_pool` turns the pyodide executor on with that many warm workers;
    `max_concurrent` is its `limits.max_concurrent_executions`; `extra` is TOML
    appended to its configuration; `state_dir` one of its own, for a daemon that runs
    beside another (it should link the cache's `wasm` in, so as not to build again)."""
    config = workdir / f"{name}.toml"
    audit = workdir / f"{name}-audit.sqlite3"
    config.write_text(_config(pool_size, wasm, pyodide_pool, max_concurrent, audit, extra))
    socket_path = str(workdir / f"{name}.sock")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONDUIT_")}
    env["CONDUIT_STATE_DIR"] = str(state_dir)
    log = (workdir / f"{name}.log").open("wb")
    process = await trio.lowlevel.open_process(
        [str(BIN / "conduit"), "--config", str(config), "serve", "--socket", socket_path],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        await _wait_ping(socket_path)
        yield socket_path
    finally:
        process.terminate()
        with trio.move_on_after(10):
            await process.wait()
        log.close()


async def _wait_ping(socket_path: str) -> None:
    with trio.fail_after(START_TIMEOUT_S):
        while True:
            try:
                client = await Client.open(socket_path)
                await client.call("ping")
                await client.aclose()
                return
            except OSError:
                await trio.sleep(0.05)


async def executors(path: str) -> dict[str, dict[str, Any]]:
    """`executors/list`, by executor name."""
    client = await Client.open(path)
    try:
        listed = await client.call("executors/list")
    finally:
        await client.aclose()
    return {info["name"]: info for info in listed["executors"]}


def _preparing(info: dict[str, Any]) -> bool:
    return (info.get("pool") or {}).get("state") in PREPARING_STATES


async def wait_executors(path: str) -> None:
    """Until no executor is still building its component (bounded by BUILD_TIMEOUT_S:
    after that, whatever is not ready is reported unavailable and skipped)."""
    with trio.move_on_after(BUILD_TIMEOUT_S):
        while any(_preparing(info) for info in (await executors(path)).values()):
            await trio.sleep(0.1)


async def wait_upstream(path: str) -> None:
    client = await Client.open(path)
    with trio.fail_after(START_TIMEOUT_S):
        while any(
            upstream["state"] != "ready"
            for upstream in (await client.call("upstreams/list"))["upstreams"]
        ):
            await trio.sleep(0.05)
    await client.aclose()


def unavailable_reason(infos: dict[str, dict[str, Any]], name: str) -> str | None:
    """Why executor `name` cannot be measured, or None if it is available."""
    info = infos.get(name)
    if info is None:
        return "executors/list does not know it"
    if not info.get("available"):
        return info.get("reason") or "unavailable"
    return None
