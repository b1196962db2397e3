"""The latency an agent sees: requests seconds apart, not in a hot loop.

After the daemon sat idle for each of IDLE_GAPS_S, one request is timed: `ping`, and
a trivial execution on each executor; then the same request hot (HOT_REPEATS in a
row). Beside them, in the same rounds, a plain blocking Unix-socket echo server
(`bench/echo_server.py`) answers one line after the same idle gap: what waking a
server and its client costs this machine. The target: each figure after idle within
IDLE_MARGIN_MS of the echo server's plus its own hot figure.

Idle means nothing runs: each gap starts once the executor's pool is full again, so
no refill runs in it. Each round takes every target in turn, so a slow minute of a
shared machine falls on all of them; the whole is bounded by IDLE_BUDGET_S. The
client is the daemon's own blocking one, in a worker thread, as a command-line
agent's would be, and the echo server's client is a blocking socket too.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from bench.latency import check_result, wait_pool_full_blocking
from bench.programs import JAVASCRIPT, PYTHON, TYPESCRIPT
from conduit.client import Client as BlockingClient

IDLE_GAPS_S = (2.0, 8.0)
# Hot samples after each idle one: their median is the figure without the wake-up.
HOT_REPEATS = 5
# The bound: after idle, at most this much above echo server + hot figure.
IDLE_MARGIN_MS = 2.0
# Rounds of 6 targets at 2 s and 8 s each are a minute: five fit with room to spare.
IDLE_BUDGET_S = 420
# Untimed requests per target first (the daemon's own first-call costs).
WARMUP = 10
ECHO = "echo server"
ECHO_SERVER = Path(__file__).with_name("echo_server.py")
# How long the echo server may take to start, answer or stop.
ECHO_TIMEOUT_S = 30
LINE = b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n'


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    params: dict[str, Any] | None  # an execute request; None: `ping`
    pool: int = 0  # idle workers its executor keeps, waited for before each request


def targets(pool_sizes: dict[str, int]) -> list[Target]:
    """`ping` and a trivial execution on each executor in `pool_sizes` (by name, with
    its warm pool's size, 0 for none)."""
    requests = {
        "deno": {"language": "typescript", "executor": "deno", "code": TYPESCRIPT},
        "wasm-python": {"language": "python", "executor": "wasm-python", "code": PYTHON},
        "wasm-js": {"language": "javascript", "executor": "wasm-js", "code": JAVASCRIPT},
        "pyodide": {"language": "python", "executor": "pyodide", "code": PYTHON},
    }
    found = [
        Target(name, request, pool_sizes[name])
        for name, request in requests.items()
        if name in pool_sizes
    ]
    return [Target("ping", None), *found]


async def figures(path: str, chosen: list[Target], rounds: int, workdir: Path) -> dict[str, Any]:
    """Per target (and the echo server): the figures after each idle gap and hot."""
    measure = functools.partial(_measure, path, chosen, rounds, workdir)
    # Abandoned on cancellation: the thread ends when the daemon closes its connection.
    samples = await trio.to_thread.run_sync(measure, abandon_on_cancel=True)
    return {
        "gaps_s": list(IDLE_GAPS_S),
        "margin_ms": IDLE_MARGIN_MS,
        "targets": {
            name: {
                "hot": summary(kinds["hot"]),
                "after_idle": {str(gap): summary(kinds[gap]) for gap in IDLE_GAPS_S},
            }
            for name, kinds in samples.items()
        },
    }


def summary(samples_s: list[float]) -> dict[str, Any]:
    """p50, min and max in milliseconds, and the samples."""
    if not samples_s:
        return {"n": 0}
    ms = sorted(s * 1000 for s in samples_s)
    return {
        "n": len(ms),
        "p50_ms": statistics.median(ms),
        "min_ms": ms[0],
        "max_ms": ms[-1],
        "samples_ms": [round(x, 2) for x in ms],
    }


def _measure(
    path: str, chosen: list[Target], rounds: int, workdir: Path
) -> dict[str, dict[Any, list[float]]]:
    deadline = time.monotonic() + IDLE_BUDGET_S
    names = [ECHO, *(target.name for target in chosen)]
    samples: dict[str, dict[Any, list[float]]] = {
        name: {kind: [] for kind in (*IDLE_GAPS_S, "hot")} for name in names
    }
    with (
        _echo_server(workdir / "echo.sock") as echo,
        BlockingClient(unix_path=path, timeout_s=None) as client,
    ):
        for target in chosen:
            for _ in range(WARMUP):
                _timed(client, target)
        for _ in range(WARMUP):
            _echo_once(echo)
        for _ in range(rounds):
            for gap in IDLE_GAPS_S:
                if time.monotonic() + gap * len(names) > deadline:
                    return samples
                time.sleep(gap)
                samples[ECHO][gap].append(_echo_once(echo))
                samples[ECHO]["hot"] += [_echo_once(echo) for _ in range(HOT_REPEATS)]
                for target in chosen:
                    _settle(client, target)
                    time.sleep(gap)
                    samples[target.name][gap].append(_timed(client, target))
                    for _ in range(HOT_REPEATS):
                        _settle(client, target)
                        samples[target.name]["hot"].append(_timed(client, target))
    return samples


def _settle(client: BlockingClient, target: Target) -> None:
    if target.pool and target.params is not None:
        wait_pool_full_blocking(client, target.pool, target.params["executor"], within_s=30)


def _timed(client: BlockingClient, target: Target) -> float:
    started = time.perf_counter()
    if target.params is None:
        client.call("ping")
        return time.perf_counter() - started
    result = client.call("execute", target.params)
    elapsed = time.perf_counter() - started
    check_result(result)
    return elapsed


def _echo_once(echo: socket.socket) -> float:
    started = time.perf_counter()
    echo.sendall(LINE)
    received = b""
    while not received.endswith(b"\n"):
        chunk = echo.recv(1 << 16)
        if not chunk:
            raise EOFError("the echo server closed the connection")
        received += chunk
    return time.perf_counter() - started


@contextlib.contextmanager
def _echo_server(path: Path) -> Iterator[socket.socket]:
    """The reference echo server, started for the block, and a connection to it."""
    process = subprocess.Popen(
        [sys.executable, str(ECHO_SERVER), str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        if process.stdout.readline().strip() != b"ready":
            raise RuntimeError("the echo server did not start")
        with socket.socket(socket.AF_UNIX) as echo:
            echo.settimeout(ECHO_TIMEOUT_S)
            echo.connect(str(path))
            yield echo
    finally:
        process.kill()
        process.wait(timeout=ECHO_TIMEOUT_S)
