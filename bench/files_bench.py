"""Only the file figures: a 1 MB file in and the same file back out (`sessions.py`'s
`_file_round_trip`), beside a trivial execution, per executor, p50 and p99.

    python -m bench.files_bench [--runs N] [--executors deno,wasm-js]

The daemon is the agent benchmark's (`agent_bench.py`: every executor on, its pools);
file runs and trivial runs alternate in blocks, so a busy moment of the machine falls
on both; each run of either kind starts once the executor's pool is full. The full
benchmark (`bench/run.py`) measures the same round trip among the rest of the
sessions figures.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from bench import sessions
from bench.agent_bench import EXECUTORS, MAX_CONCURRENT, POOLS, settle
from bench.client import Client
from bench.conduit_daemon import daemon, executors, unavailable_reason, wait_executors
from bench.latency import wait_pool_full
from bench.pyodide_bench import wait_pyodide
from bench.stats import percentiles

TRIVIAL = {"python": "1", "javascript": "1", "typescript": "1"}
# Runs of each kind per block: short enough that both kinds see the same machine.
BLOCK = 5


async def figures(workdir: Path, names: list[str], runs: int) -> dict[str, Any]:
    async with daemon(
        workdir,
        "files",
        pool_size=POOLS["deno"],
        pyodide_pool=POOLS["pyodide"],
        max_concurrent=MAX_CONCURRENT,
    ) as path:
        await wait_executors(path)
        await wait_pyodide(path, POOLS["pyodide"])
        infos = await executors(path)
        results: dict[str, Any] = {}
        for name in names:
            why = unavailable_reason(infos, name)
            if why is not None:
                results[name] = {"skipped": why}
                continue
            await settle(path, {name: POOLS.get(name, 0)})
            results[name] = await _alternating(path, name, POOLS.get(name, 0), runs)
        results["wire_reference"] = {"file": await sessions.wire_reference(workdir, runs)}
        return results


async def _alternating(path: str, executor: str, pool: int, runs: int) -> dict[str, Any]:
    client = await Client.open(path)
    request = {"language": sessions.LANGUAGES[executor], "executor": executor}
    trivial = {**request, "code": TRIVIAL[request["language"]]}
    files: list[float] = []
    plain: list[float] = []
    try:
        while len(files) < runs:
            files.extend(await sessions.file_samples(client, executor, pool, BLOCK))
            for _ in range(BLOCK):
                await wait_pool_full(client, pool, executor)
                began = time.perf_counter()
                await client.call("execute", trivial)
                plain.append(time.perf_counter() - began)
    finally:
        await client.aclose()
    return {"file": percentiles(files), "trivial": percentiles(plain)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40, help="file round trips per executor")
    parser.add_argument("--executors", default=",".join(EXECUTORS), help="comma-separated")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cbench-files-", dir="/tmp") as tmp:
        found = trio.run(figures, Path(tmp), args.executors.split(","), args.runs)
    for name, figure in found.items():
        if "skipped" in figure:
            print(f"{name:12s} skipped: {figure['skipped']}")
            continue
        if "trivial" not in figure:
            print(f"{name:12s} file p50 {figure['file']['p50_ms']:7.1f} ms (nothing run)")
            continue
        file, plain = figure["file"], figure["trivial"]
        print(
            f"{name:12s} file p50 {file['p50_ms']:7.1f} ms  p99 {file['p99_ms']:7.1f}  |  "
            f"trivial p50 {plain['p50_ms']:6.1f} ms  p99 {plain['p99_ms']:6.1f}"
        )


if __name__ == "__main__":
    main()
