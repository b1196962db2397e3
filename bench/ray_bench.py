"""A batch through Ray beside the same batch through one daemon's socket.

    python -m bench.ray_bench [--total N] [--concurrency C]

Starts a local Ray cluster (this machine: one node) and `ConduitNodes` on it, then runs
`--total` trivial Python programs twice against the node's one daemon: straight over
its Unix socket with `C` in flight (`AsyncClient`), and as one batch through Ray
(`ConduitNodes.run`, `C` in flight on the node). What Ray costs an execution is the
difference; more nodes multiply the second, not the first.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import ray

from bench.conduit_daemon import STATE_DIR
from conduit.client import AsyncClient
from conduit.integrations.ray import ConduitNodes, Program

PROGRAM = "1 + 1"
# The node's daemon as the bench's others run: wasm-python for Python, nothing else.
CONFIG = """
[metrics]
listen = "127.0.0.1:0"
[executors.deno]
enabled = false
[executors.wasm_js]
enabled = false
"""


async def _direct(socket: str, total: int, concurrency: int) -> float:
    """Executions/s of `total` programs over one connection, `concurrency` at a time."""
    limit = asyncio.Semaphore(concurrency)
    async with AsyncClient(unix_path=socket, token="", timeout_s=None) as client:

        async def one() -> None:
            async with limit:
                (await client.execute(PROGRAM)).raise_for_status()

        began = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(total)))
        return total / (time.perf_counter() - began)


def _through_ray(nodes: ConduitNodes, total: int) -> float:
    began = time.perf_counter()
    outcomes = nodes.run([Program(PROGRAM)] * total)
    elapsed = time.perf_counter() - began
    failed = [outcome for outcome in outcomes if not outcome.ok]
    assert not failed, failed[:3]
    return total / elapsed


def figures(total: int, concurrency: int) -> dict[str, Any]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory(prefix="conduit-ray-bench-") as directory:
            config = Path(directory) / "node.toml"
            config.write_text(CONFIG)
            with ConduitNodes(
                config=str(config), state_dir=str(STATE_DIR), concurrency=concurrency
            ) as nodes:
                [actor] = nodes.actors
                socket = ray.get(actor.__ray_call__.remote(lambda node: node.socket))
                _through_ray(nodes, min(total, 200))  # warm: the actor's client, the pools
                direct = asyncio.run(_direct(socket, total, concurrency))
                batch = _through_ray(nodes, total)
    finally:
        ray.shutdown()
    overhead_ms = (1 / batch - 1 / direct) * 1000
    return {"direct": direct, "ray": batch, "overhead_ms": overhead_ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--total", type=int, default=2000, help="programs per batch")
    # As `ConduitNodes` runs by default: a program per CPU.
    parser.add_argument("--concurrency", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    result = figures(args.total, args.concurrency)
    print(f"{args.total} trivial Python programs, {args.concurrency} in flight")
    print(f"{'one daemon, its socket':28} {result['direct']:8.1f} exec/s")
    print(f"{'through Ray (one node)':28} {result['ray']:8.1f} exec/s")
    print(f"{'Ray per execution':28} {result['overhead_ms']:8.2f} ms")


if __name__ == "__main__":
    main()
