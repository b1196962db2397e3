"""What the operating-system sandbox costs: the same requests to a daemon whose Deno and
Pyodide workers run inside bubblewrap (the default) and to one whose workers run
under Deno's permissions alone, taking turns in blocks so a busy moment of the
machine falls on both.

    python -m bench.os_sandbox_bench [--runs N]

Figures, p50 and p99: a trivial TypeScript execution on a warm pool (each once the
pool is full, as the warm figures in docs/performance.md); a cold one (a heap size no
warm worker has, so a worker starts for it); and a trivial Python execution on
Pyodide (paced the same way). The daemon without the sandbox is told to use a bwrap
that does not exist, with `executors.os_sandbox = "optional"`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from bench.client import Client
from bench.conduit_daemon import CACHE_DIR, daemon, executors
from bench.latency import check_result, wait_pool_full
from bench.pyodide_bench import wait_pyodide
from bench.stats import percentiles

POOL = 2
# Runs of each kind per block, each daemon in turn.
BLOCK = 5
WITHOUT = '[executors]\nos_sandbox = "optional"\nbwrap = "/nonexistent/bwrap"\n'
# The daemon without the sandbox keeps a state of its own (Pyodide installed once).
BARE_STATE_DIR = CACHE_DIR / "daemon-state-no-os-sandbox"
KINDS = {
    "warm TypeScript": ({"language": "typescript", "code": "1"}, "deno", POOL),
    # A heap no warm worker has: a worker starts for the request.
    "cold TypeScript": (
        {"language": "typescript", "code": "1", "limits": {"memory_mb": 96}},
        "deno",
        POOL,
    ),
    "pyodide": ({"language": "python", "executor": "pyodide", "code": "1"}, "pyodide", POOL),
}


async def figures(workdir: Path, runs: int) -> dict[str, Any]:
    common = {"pool_size": POOL, "wasm": False, "pyodide_pool": POOL}
    async with (
        daemon(workdir, "sandboxed", **common) as sandboxed,
        daemon(workdir, "bare", extra=WITHOUT, state_dir=BARE_STATE_DIR, **common) as bare,
    ):
        paths = {"bubblewrap": sandboxed, "none": bare}
        for path in paths.values():
            reason = await wait_pyodide(path, POOL)
            if reason is not None:
                return {"skipped": reason}
        sandboxes = {
            name: (await executors(path))["deno"]["pool"]["os_sandbox"]
            for name, path in paths.items()
        }
        samples: dict[str, dict[str, list[float]]] = {kind: {} for kind in KINDS}
        clients = {name: await Client.open(path) for name, path in paths.items()}
        try:
            for kind, (params, executor, pool) in KINDS.items():
                for name in paths:
                    samples[kind][name] = []
                while len(samples[kind]["none"]) < runs:
                    for name, client in clients.items():
                        samples[kind][name] += await _block(client, params, executor, pool)
        finally:
            for client in clients.values():
                await client.aclose()
    return {
        "os_sandbox": sandboxes,
        "figures": {
            kind: {name: percentiles(values) for name, values in by_daemon.items()}
            for kind, by_daemon in samples.items()
        },
    }


async def _block(client: Client, params: dict[str, Any], executor: str, pool: int) -> list[float]:
    """BLOCK executions of `params`, each once `executor`'s pool is full."""
    taken = []
    for _ in range(BLOCK):
        await wait_pool_full(client, pool, executor)
        began = time.perf_counter()
        result = await client.call("execute", params)
        taken.append(time.perf_counter() - began)
        check_result(result, 1)
    return taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="executions of each kind")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cbench-os-sandbox-", dir="/tmp") as tmp:
        found = trio.run(figures, Path(tmp), args.runs)
    if "skipped" in found:
        print(f"skipped: {found['skipped']}")
        return
    print(f"os_sandbox: {found['os_sandbox']}")
    for kind, by_daemon in found["figures"].items():
        row = "  ".join(
            f"{name} p50 {f['p50_ms']:7.2f} ms p99 {f['p99_ms']:7.2f}"
            for name, f in by_daemon.items()
        )
        print(f"{kind:18} {row}")


if __name__ == "__main__":
    main()
