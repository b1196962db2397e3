"""Sequential `execute` latency through the daemon, and the plain `deno run` reference.

A sequential series is timed through the daemon's own blocking client (the one the
command line uses) in a worker thread, not through the benchmark's Trio client: on
two cores the client shares the machine with the daemon, and the Trio client's own
scheduling cost 6-9% of a trivial wasm-js execution's p50 (alternated blocks of 300,
16 rounds: 1.58 against 1.44 ms). The figure is the daemon's, measured with the
lightest instrument we ship.
"""

from __future__ import annotations

import functools
import itertools
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from bench.client import Client
from bench.conduit_daemon import BIN
from bench.programs import RESULT, TYPESCRIPT
from bench.stats import Figures, percentiles
from conduit.client import Client as BlockingClient

# No latency series may take longer than this, whatever its count.
SERIES_BUDGET_S = 120
# How often a wait for a full pool asks again.
POOL_POLL_S = 0.005

Check = Callable[[dict[str, Any]], None]


async def wait_pool_full(
    client: Client, size: int, executor: str = "deno", *, within_s: float = 5
) -> None:
    """Until `executor`'s pool has `size` idle workers (at most `within_s`), as an
    agent's requests, seconds apart, would find it."""
    with trio.move_on_after(within_s):
        while _idle_workers(await client.call("executors/list"), executor) < size:
            await trio.sleep(POOL_POLL_S)


def wait_pool_full_blocking(
    client: BlockingClient, size: int, executor: str, *, within_s: float = 5
) -> None:
    """`wait_pool_full` for a blocking client."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if _idle_workers(client.call("executors/list"), executor) >= size:
            return
        time.sleep(POOL_POLL_S)


def _idle_workers(listed: dict[str, Any], executor: str) -> int:
    info = next(e for e in listed["executors"] if e["name"] == executor)
    return (info.get("pool") or {}).get("idle", 0)


def check_result(result: dict[str, Any], expected: Any = RESULT) -> None:
    if result.get("status") != "ok" or result.get("result") != expected:
        raise AssertionError(f"unexpected execution result: {result}")


async def execute_latency(path: str, params: dict[str, Any], runs: int, **options: Any) -> Figures:
    """The percentiles of `execute_samples`."""
    return percentiles(await execute_samples(path, params, runs, **options))


async def execute_samples(
    path: str,
    params: dict[str, Any],
    runs: int,
    *,
    warm_pool: int = 0,
    warmup: int = 0,
    pool_of: str = "deno",
    check: Check = check_result,
    pause_s: float = 0.0,
    new_program: bool = False,
    method: str = "execute",
) -> list[float]:
    """`runs` sequential executions of `params`, each timed end to end (seconds), after
        `warmup` untimed ones; with `warm_pool`, each starts when `pool_of`'s pool is full
        again, and with `pause_s`, that long after the one before (else at once: back to
        back). `method` is another request to time in the same way (`ping`: the round trip
    alone). With `new_program`, each program is one the daemon has not seen (a comment
        numbers it), so nothing it read of an earlier one is kept for it. `check` raises if
        a result is not the expected one. Runs in a worker thread (see the module's
        docstring)."""
    series = functools.partial(
        _series,
        path,
        params,
        runs,
        warm_pool,
        warmup,
        pool_of,
        check,
        pause_s,
        new_program,
        method,
    )
    # Abandoned on cancellation: the thread ends when the daemon closes its connection.
    return await trio.to_thread.run_sync(series, abandon_on_cancel=True)


def _series(
    path: str,
    params: dict[str, Any],
    runs: int,
    warm_pool: int,
    warmup: int,
    pool_of: str,
    check: Check,
    pause_s: float,
    new_program: bool,
    method: str,
) -> list[float]:
    deadline = time.monotonic() + SERIES_BUDGET_S
    samples: list[float] = []
    numbered = itertools.count()
    with BlockingClient(unix_path=path, timeout_s=None) as client:
        for _ in range(warmup):
            check(client.call(method, params))
        while len(samples) < runs and time.monotonic() < deadline:
            if warm_pool:
                wait_pool_full_blocking(client, warm_pool, pool_of)
            sent = params
            if new_program:
                sent = {**params, "code": f"{params['code']}\n// {next(numbered)}"}
            if pause_s:
                time.sleep(pause_s)
            started = time.perf_counter()
            result = client.call(method, sent)
            samples.append(time.perf_counter() - started)
            check(result)
    return samples


def plain_deno(runs: int, workdir: Path) -> Figures:
    """`deno run` of the TypeScript program as a file, started fresh each time."""
    script = workdir / "program.ts"
    body = TYPESCRIPT.replace("\n", " return ")
    script.write_text(f"console.log(JSON.stringify((() => {{ {body} }})()));\n")
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
    subprocess.run(command, env=env, capture_output=True, check=True, timeout=60)  # the cache
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(command, env=env, capture_output=True, check=True, timeout=60)
        samples.append(time.perf_counter() - started)
    return percentiles(samples)
