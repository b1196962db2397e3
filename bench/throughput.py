"""Requests/s and executions/s under concurrency, each bounded in time."""

from __future__ import annotations

import time
from typing import Any

import trio

from bench.client import Client


async def ping_pipelined(path: str, total: int, window: int = 256) -> float:
    """Requests/s with up to `window` pings in flight on one connection."""
    client = await Client.open(path)
    line = b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n'
    started = time.perf_counter()
    sent = received = 0
    with trio.fail_after(120):
        while received < total:
            room = min(window - (sent - received), total - sent)
            if room > 0:
                await client.send_many(line * room)
                sent += room
            received += len(await client.recv_available())
    elapsed = time.perf_counter() - started
    await client.aclose()
    return total / elapsed


async def ping_connections(path: str, per_connection: int, connections: int = 8) -> float:
    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(connections):
            nursery.start_soon(ping_pipelined, path, per_connection)
    return per_connection * connections / (time.perf_counter() - started)


async def execute_throughput(
    path: str, params: dict[str, Any], clients: int, duration_s: float
) -> float:
    """Executions/s of `params` with `clients` connections each running one after another
    for `duration_s`; every execution has to succeed."""
    done = 0

    async def worker() -> None:
        nonlocal done
        client = await Client.open(path)
        while True:
            result = await client.call("execute", params)
            if result.get("status") != "ok":
                raise AssertionError(f"an execution under load failed: {result}")
            done += 1

    started = time.perf_counter()
    with trio.move_on_after(duration_s):
        async with trio.open_nursery() as nursery:
            for _ in range(clients):
                nursery.start_soon(worker)
    return done / (time.perf_counter() - started)
