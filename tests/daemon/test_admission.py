"""Who gets a connection: budgets per listener kind and per-peer caps on unauthenticated ones.

The budgets are driven on their own, then against a real daemon, flooded over loopback
TCP while its owner and its sandboxes go on being served. The deadlines are the
connection's own (tests/daemon/test_connection.py).
"""

from __future__ import annotations

import resource
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import trio

from conduit.core.errors import Overloaded, Unauthenticated
from conduit.daemon.limits import ConnectionBudget, ConnectionSlot
from tests.conftest import MASTER_TOKEN, WAIT_S
from tests.e2e.helpers import execute, farewells, wait_upstreams
from tests.fixtures.mcp_echo_server import command as echo_command

NO_DENO = {"executors": {"deno": {"enabled": False}}}
ECHO = {
    "name": "echo",
    "transport": "stdio",
    "command": echo_command()[0],
    "args": echo_command()[1:],
}
# The flood's connections are closed this long after they connect.
AUTH_TIMEOUT_S = 6.0


def raise_fd_limit() -> None:
    """Both ends of every flooding connection live in this process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# ---- budgets ---------------------------------------------------------------------


def test_unauthenticated_connections_are_capped_per_peer() -> None:
    budget = ConnectionBudget(100, 2)
    first = budget.admit("10.0.0.1", authenticated=False)
    second = budget.admit("10.0.0.1", authenticated=False)
    assert isinstance(first, ConnectionSlot) and isinstance(second, ConnectionSlot)
    assert "unauthenticated connections from this peer" in str(
        budget.admit("10.0.0.1", authenticated=False)
    )
    assert isinstance(budget.admit("10.0.0.2", authenticated=False), ConnectionSlot)
    assert isinstance(budget.admit("10.0.0.1", authenticated=True), ConnectionSlot)
    first.authenticated()  # it logged in: its peer may open another
    assert isinstance(budget.admit("10.0.0.1", authenticated=False), ConnectionSlot)
    assert budget.statistics().unauthenticated == 3


def test_a_full_budget_keeps_a_reserve_for_the_owner_and_releases_once() -> None:
    budget = ConnectionBudget(2, None)
    slots = [budget.admit(None, authenticated=False) for _ in range(2)]
    assert "too many connections" in str(budget.admit(None, authenticated=True))
    owner = budget.admit(0, authenticated=True, reserved=True)
    assert isinstance(owner, ConnectionSlot)
    for slot in slots:
        assert isinstance(slot, ConnectionSlot)
        slot.release()
        slot.release()
    assert budget.statistics().open == 1
    assert budget.statistics().unauthenticated == 0


# ---- a real daemon under a flood ---------------------------------------------------


async def _flood(address: tuple[str, int], count: int) -> list[trio.SocketStream]:
    streams = []
    for _ in range(count):
        streams.append(await trio.open_tcp_stream(*address))
    return streams


async def _farewells(streams: list[trio.SocketStream]) -> list[Any]:
    """Each stream's one line before the daemon closed it (fails after WAIT_S)."""
    return await farewells(streams, WAIT_S + 30)


@pytest.fixture
async def flood_closer() -> AsyncIterator[list[trio.SocketStream]]:
    opened: list[trio.SocketStream] = []
    yield opened
    with trio.CancelScope(shield=True):
        for stream in opened:
            await stream.aclose()


@pytest.mark.slow
async def test_a_tcp_flood_leaves_the_owner_and_the_sandboxes_served(
    start_daemon: Any, connect: Any, flood_closer: list[trio.SocketStream]
) -> None:
    raise_fd_limit()
    held = 100
    server, info = await start_daemon(
        server={
            "tcp": "127.0.0.1:0",
            "max_connections": held,
            "max_unauthenticated_per_peer": 10_000,
            "auth_timeout_s": AUTH_TIMEOUT_S,
        },
        upstreams=[ECHO],
    )
    await wait_upstreams(server, "echo")
    flooded_at = trio.current_time()
    flood_closer += await _flood(info.tcp_address, 2 * held)
    with trio.fail_after(WAIT_S):
        while server.budgets["tcp"].statistics().open < held:
            await trio.sleep(0.01)  # the accepts are the daemon's; nothing announces them

    owner = await connect(info)
    assert (await owner.request("ping"))["result"] == {}
    result = await execute(owner, "return (await tools.echo.add({ a: 2, b: 3 })).sum")
    assert (result["status"], result["result"], result["tool_calls"]) == ("ok", 5, 1)
    if trio.current_time() - flooded_at < AUTH_TIMEOUT_S:  # else the flood may have gone
        assert server.budgets["tcp"].statistics().open == held

    told = await _farewells(flood_closer)
    codes = sorted(line["error"]["code"] for line in told if line)
    assert codes.count(Unauthenticated.code) == held
    assert codes.count(Overloaded.code) + told.count(None) == held
    assert server.budgets["tcp"].statistics().open == 0
    assert (await owner.request("ping"))["result"] == {}


async def test_unauthenticated_connections_from_one_address_are_capped(
    start_daemon: Any, connect: Any
) -> None:
    _, info = await start_daemon(
        server={"tcp": "127.0.0.1:0", "max_unauthenticated_per_peer": 3}, **NO_DENO
    )
    waiting = [await connect(info, "tcp") for _ in range(3)]
    for waiter in waiting:  # each admitted, and served without a token
        assert (await waiter.request("ping"))["result"] == {}
    refused = await connect(info, "tcp")
    [farewell] = await _farewells([refused.stream])
    assert farewell["error"]["code"] == Overloaded.code
    assert "unauthenticated connections from this peer" in farewell["error"]["message"]

    await waiting[0].call("auth/login", {"token": MASTER_TOKEN})
    admitted = await connect(info, "tcp")
    assert (await admitted.request("ping"))["result"] == {}


async def test_the_sandbox_socket_has_its_own_budget(start_daemon: Any) -> None:
    server, _ = await start_daemon(
        server={"max_connections": 5, "max_sandbox_connections": 7}, **NO_DENO
    )
    assert server.budgets["tcp"].statistics().capacity == 5
    assert server.budgets["unix"].statistics().capacity == 5
    assert server.budgets["sandbox"].statistics().capacity == 7
    path = server.callback_address.unix_path
    held = [await trio.open_unix_socket(path) for _ in range(7)]
    try:
        with trio.fail_after(WAIT_S):
            while server.budgets["sandbox"].statistics().open < 7:
                await trio.sleep(0.01)
        extra = await trio.open_unix_socket(path)
        held.append(extra)
        [farewell] = await _farewells([extra])
        assert "too many connections" in farewell["error"]["message"]
        assert server.budgets["unix"].statistics().open == 0
    finally:
        for stream in held:
            await stream.aclose()


async def test_a_reload_resizes_the_budgets(
    start_daemon: Any, make_config: Callable[..., Any]
) -> None:
    server, _ = await start_daemon(**NO_DENO)
    caps = {"max_connections": 7, "max_sandbox_connections": 9, "max_unauthenticated_per_peer": 2}
    make_config(server=caps, **NO_DENO)  # rewrites the file the daemon was started from
    await server.reload()
    assert server.budgets["tcp"].statistics().capacity == 7
    assert server.budgets["unix"].statistics().per_peer_unauthenticated == 2
    assert server.budgets["sandbox"].statistics().capacity == 9
