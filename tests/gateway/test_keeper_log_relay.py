"""Which call hears an upstream's log messages (`SessionKeeper._relay_log`): stdio links
a message to no request, so only a call that cannot be confused with another's does."""

from __future__ import annotations

from typing import Any

import mcp_types as types
import pytest
import trio
import trio.lowlevel

from conduit.core.errors import UpstreamUnreachable
from conduit.gateway import keeper
from conduit.gateway.settings import StdioUpstreamSettings
from conduit.gateway.stdio_upstream import StdioUpstream
from conduit.gateway.upstream import CallObserver
from tests.conftest import WAIT_S


class _Held:
    """A `DirectRequests` whose calls wait until released, one event per call."""

    def __init__(self) -> None:
        self.waiting: list[trio.Event] = []

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        release = trio.Event()
        self.waiting.append(release)
        await release.wait()
        return {"content": []}

    def close(self) -> None:
        pass


class _Caller:
    """One principal's call: the log messages it hears."""

    def __init__(self) -> None:
        self.heard: list[Any] = []

    async def log(self, level: str, logger: str | None, data: Any) -> None:
        self.heard.append(data)

    def observer(self) -> CallObserver:
        return CallObserver(log=self.log)


def _upstream() -> tuple[StdioUpstream, keeper._Connection, _Held]:
    upstream = StdioUpstream(StdioUpstreamSettings(name="echo", command="true"))
    connection = keeper._Connection(version="2025-11-25")
    held = _Held()
    connection.direct = held  # type: ignore[assignment]
    upstream._connection = connection
    return upstream, connection, held


async def _say(upstream: StdioUpstream, connection: keeper._Connection, data: str) -> None:
    params = types.LoggingMessageNotificationParams(level="info", data=data)
    await upstream._relay_log(connection, params)


async def _started(held: _Held, count: int) -> None:
    with trio.fail_after(WAIT_S):
        while len(held.waiting) < count:
            await trio.lowlevel.checkpoint()


async def test_the_only_call_hears_its_upstream() -> None:
    upstream, connection, held = _upstream()
    alice = _Caller()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            lambda: upstream.call_tool("t", {}, timeout_s=WAIT_S, observer=alice.observer())
        )
        await _started(held, 1)
        await _say(upstream, connection, "alice's")
        held.waiting[0].set()
    assert alice.heard == ["alice's"]


async def test_after_a_call_is_given_up_no_later_call_hears_its_messages() -> None:
    """Alice's call timed out, but the server may still be working on it: what it says
    about it must not reach Bob's call, which started after."""
    upstream, connection, held = _upstream()
    alice, bob = _Caller(), _Caller()
    with pytest.raises(UpstreamUnreachable, match="did not answer"):
        await upstream.call_tool("t", {}, timeout_s=0.01, observer=alice.observer())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            lambda: upstream.call_tool("t", {}, timeout_s=WAIT_S, observer=bob.observer())
        )
        await _started(held, 2)
        await _say(upstream, connection, "about alice's call")
        held.waiting[1].set()
    assert bob.heard == []


async def test_a_call_that_overlapped_another_hears_nothing_after_it_ends() -> None:
    upstream, connection, held = _upstream()
    alice, bob = _Caller(), _Caller()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            lambda: upstream.call_tool("t", {}, timeout_s=WAIT_S, observer=alice.observer())
        )
        await _started(held, 1)
        nursery.start_soon(
            lambda: upstream.call_tool("t", {}, timeout_s=WAIT_S, observer=bob.observer())
        )
        await _started(held, 2)
        held.waiting[1].set()  # Bob's ends; Alice's runs on alone
        while len(upstream._observers) > 1:
            await trio.lowlevel.checkpoint()
        await _say(upstream, connection, "maybe about bob's call")
        held.waiting[0].set()
    assert alice.heard == [] and bob.heard == []
