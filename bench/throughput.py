"""Requests/s and executions/s under concurrency, each bounded in time."""

from __future__ import annotations

import time
from collections.abc import Callable
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
        try:
            while True:
                result = await client.call("execute", params)
                if result.get("status") != "ok":
                    raise AssertionError(f"an execution under load failed: {result}")
                done += 1
        finally:
            with trio.CancelScope(shield=True):
                await client.aclose()

    started = time.perf_counter()
    with trio.move_on_after(duration_s):
        async with trio.open_nursery() as nursery:
            for _ in range(clients):
                nursery.start_soon(worker)
    return done / (time.perf_counter() - started)


async def execute_count(
    path: str,
    params: dict[str, Any],
    clients: int,
    total: int,
    budget_s: float,
    on_done: Callable[[int], None] | None = None,
) -> tuple[int, float]:
    """`total` executions of `params` shared by `clients` connections (at most
    `budget_s`); every one has to succeed. `on_done(count)` follows each completion.
    Returns how many completed and the seconds they took."""
    started_count = done = 0

    async def worker() -> None:
        nonlocal started_count, done
        client = await Client.open(path)
        try:
            while started_count < total:
                started_count += 1
                result = await client.call("execute", params)
                if result.get("status") != "ok":
                    raise AssertionError(f"an execution under load failed: {result}")
                done += 1
                if on_done is not None:
                    on_done(done)
        finally:
            with trio.CancelScope(shield=True):
                await client.aclose()

    started = time.perf_counter()
    with trio.move_on_after(budget_s):
        async with trio.open_nursery() as nursery:
            for _ in range(clients):
                nursery.start_soon(worker)
    return done, time.perf_counter() - started
