"""Sequential `execute` latency through the daemon, and the plain `deno run` reference."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import trio

from bench.client import Client
from bench.conduit_daemon import BIN
from bench.programs import RESULT, TYPESCRIPT
from bench.stats import Figures, percentiles

# No latency series may take longer than this, whatever its count.
SERIES_BUDGET_S = 120


async def wait_pool_full(
    client: Client, size: int, executor: str = "deno", *, within_s: float = 5
) -> None:
    """Until `executor`'s pool has `size` idle workers (at most `within_s`), as an
    agent's requests, seconds apart, would find it."""
    with trio.move_on_after(within_s):
        while True:
            listed = await client.call("executors/list")
            info = next(e for e in listed["executors"] if e["name"] == executor)
            if (info.get("pool") or {}).get("idle", 0) >= size:
                return
            await trio.sleep(0.005)


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
) -> list[float]:
    """`runs` sequential executions of `params`, each timed end to end (seconds), after
    `warmup` untimed ones; with `warm_pool`, each starts when `pool_of`'s pool is full
    again."""
    client = await Client.open(path)
    samples: list[float] = []
    with trio.move_on_after(SERIES_BUDGET_S):
        for _ in range(warmup):
            check_result(await client.call("execute", params))
        for _ in range(runs):
            if warm_pool:
                await wait_pool_full(client, warm_pool, pool_of)
            started = time.perf_counter()
            result = await client.call("execute", params)
            samples.append(time.perf_counter() - started)
            check_result(result)
    await client.aclose()
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
