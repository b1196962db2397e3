"""A peer refused in a loop cannot flood the log: one line per kind, then a count.

The flood is real (loopback TCP against a real daemon); the clock runs at real speed,
and the test moves it past the logging interval instead of waiting it out.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
import trio.testing

from conduit.core.errors import Overloaded
from conduit.daemon.server import REFUSAL_LOG_EVERY_S, _ThrottledLog
from tests.conftest import WAIT_S
from tests.e2e.helpers import farewells
from tests.e2e.mcp_helpers import NO_SANDBOXES

FLOOD = 60
# The held connection must outlast the jump: its deadline would free the slot.
SERVER = {
    "tcp": "127.0.0.1:0",
    "max_unauthenticated_per_peer": 1,
    "auth_timeout_s": 100 * REFUSAL_LOG_EVERY_S,
}


@pytest.fixture
def clock() -> trio.testing.MockClock:
    """Real time, which the test may jump ahead (pytest-trio runs the test on it)."""
    return trio.testing.MockClock(rate=1.0)


def _lines(caplog: pytest.LogCaptureFixture, message: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "conduit.server" and r.getMessage() == message]


async def _refused(address: tuple[str, int]) -> None:
    """Connect and read the daemon's one line before it closes the connection."""
    stream = await trio.open_tcp_stream(*address)
    try:
        [farewell] = await farewells([stream], WAIT_S)
    finally:
        await stream.aclose()
    assert farewell is None or farewell["error"]["code"] == Overloaded.code


async def test_a_flood_of_refused_connections_logs_a_line_then_a_count(
    start_daemon: Any, clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="conduit.server")
    server, info = await start_daemon(server=SERVER, executors=NO_SANDBOXES)
    held = await trio.open_tcp_stream(*info.tcp_address)  # this peer's one waiting slot
    try:
        with trio.fail_after(WAIT_S):
            while server.budgets["tcp"].statistics().unauthenticated < 1:
                await trio.sleep(0.01)  # the accept is the daemon's; nothing announces it
        started = trio.current_time()
        for _ in range(FLOOD):
            await _refused(info.tcp_address)
        elapsed_s = trio.current_time() - started
        flooded = _lines(caplog, "connection refused")
        assert 1 <= len(flooded) <= 1 + elapsed_s // REFUSAL_LOG_EVERY_S
        assert "unauthenticated connections from this peer" in flooded[0].reason
        assert not hasattr(flooded[0], "suppressed")

        clock.jump(REFUSAL_LOG_EVERY_S)
        await _refused(info.tcp_address)
    finally:
        await held.aclose()
    lines = _lines(caplog, "connection refused")
    assert len(lines) == len(flooded) + 1
    # Every refusal is either a line or counted in the line after it.
    counted = sum(getattr(line, "suppressed", 0) for line in lines)
    assert len(lines) + counted == FLOOD + 1
    assert lines[-1].suppressed >= 1
    assert lines[-1].transport == "tcp"


async def test_each_kind_of_warning_has_its_own_allowance(
    mock_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="conduit.server")
    throttled = _ThrottledLog(every_s=10.0)
    for _ in range(100):
        throttled.warning(("refused", "tcp"), "connection refused", reason="full")
        throttled.warning(("accept", "tcp", 24), "accept failed", error="EMFILE")
    assert [r.getMessage() for r in caplog.records] == ["connection refused", "accept failed"]

    mock_clock.jump(9.0)
    throttled.warning(("refused", "tcp"), "connection refused", reason="full")
    assert len(caplog.records) == 2  # within the interval: counted, not logged

    mock_clock.jump(1.0)
    throttled.warning(("refused", "tcp"), "connection refused", reason="full")
    throttled.warning(("refused", "tcp"), "connection refused", reason="full")
    last = caplog.records[-1]
    assert len(caplog.records) == 3
    assert (last.getMessage(), last.reason, last.suppressed) == ("connection refused", "full", 100)
