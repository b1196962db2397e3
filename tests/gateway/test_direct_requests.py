"""Tool calls that bypass the SDK session: `DirectRequests` on its own, then on a real
stdio upstream, where the request must be the one the session would have sent.

The upstream tests record what the daemon writes to the server (a `tee` in front of
the echo fixture) and compare it line for line with the SDK session's own requests.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
import trio
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from conduit.core.errors import UpstreamUnreachable
from conduit.gateway.direct_requests import ID_PREFIX, ConnectionClosed, DirectRequests
from conduit.gateway.settings import StdioUpstreamSettings
from conduit.gateway.stdio_upstream import StdioUpstream
from tests.fixtures.mcp_echo_server import command
from tests.gateway.test_stdio_upstream import HANDSHAKES, WAIT_S, Served, serving, text_of
from tests.processes import leftovers


@pytest.fixture
def tag() -> str:
    return f"conduit-test-{uuid.uuid4().hex}"


@pytest.fixture
async def serve(tag: str) -> AsyncIterator[Callable[[StdioUpstream], Awaitable[Served]]]:
    async with serving() as start:
        yield start
    assert await leftovers(tag) == [], "a test left upstream processes running"


class Wire:
    """`DirectRequests` over a list of written lines instead of a pipe."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.written = trio.Event()
        self.broken = 0
        self.seen = 0  # lines already looked at by next_request
        self.fail_with: type[Exception] | None = None
        self.direct = DirectRequests(self.write, broken=self.mark_broken)

    async def write(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        if self.fail_with is not None:
            raise self.fail_with
        assert data.endswith(b"\n") and data.count(b"\n") == 1
        self.lines.append(json.loads(data))
        self.written.set()
        self.written = trio.Event()

    def mark_broken(self) -> None:
        self.broken += 1

    async def next_request(self) -> dict[str, Any]:
        """The next request written after the last one this returned."""
        with trio.fail_after(WAIT_S):
            while not (fresh := [line for line in self.lines[self.seen :] if "id" in line]):
                await self.written.wait()
        self.seen = self.lines.index(fresh[0]) + 1
        return fresh[0]


async def _answered(wire: Wire, answer: Callable[[str], bytes]) -> tuple[Any, BaseException | None]:
    """Send one request and answer it with `answer(id)`; (result, exception)."""
    outcome: list[Any] = [None, None]

    async def call() -> None:
        try:
            outcome[0] = await wire.direct.request("tools/call", {"name": "echo"})
        except (MCPError, ValidationError) as exc:
            outcome[1] = exc

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call)
        request = await wire.next_request()
        assert wire.direct.take(answer(request["id"]))
    return outcome[0], outcome[1]


# -- DirectRequests on its own -------------------------------------------------------


async def test_a_request_is_one_json_rpc_line_and_its_answer_comes_back_by_id() -> None:
    wire = Wire()
    result, error = await _answered(
        wire, lambda rid: b'{"jsonrpc":"2.0","id":"%s","result":{"ok":"\xc3\xa9"}}' % rid.encode()
    )
    assert (result, error) == ({"ok": "é"}, None)
    (request,) = wire.lines
    assert request == {
        "jsonrpc": "2.0",
        "id": f"{ID_PREFIX}1",
        "method": "tools/call",
        "params": {"name": "echo"},
    }


async def test_an_error_answer_raises_the_servers_error_and_garbage_raises_validation() -> None:
    wire = Wire()
    _, error = await _answered(
        wire,
        lambda rid: json.dumps(
            {"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": "no tool"}}
        ).encode(),
    )
    assert isinstance(error, MCPError) and (error.code, error.message) == (-32602, "no tool")
    _, error = await _answered(wire, lambda rid: json.dumps({"id": rid, "result": 5}).encode())
    assert isinstance(error, ValidationError)


async def test_lines_that_answer_nothing_of_ours_are_left_for_the_session() -> None:
    wire = Wire()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(wire.direct.request, "tools/call", {})
        rid = (await wire.next_request())["id"]
        others = [
            b'not json "' + rid.encode(),
            json.dumps({"jsonrpc": "2.0", "id": 1, "result": {}}).encode(),
            json.dumps({"jsonrpc": "2.0", "id": f"{ID_PREFIX}999", "result": {}}).encode(),
            json.dumps({"jsonrpc": "2.0", "id": rid, "method": "ping"}).encode(),
            json.dumps({"jsonrpc": "2.0", "method": "notifications/progress", "x": rid}).encode(),
        ]
        assert [wire.direct.take(line) for line in others] == [False] * len(others)
        nursery.cancel_scope.cancel()


async def test_closing_fails_pending_and_later_requests_as_connection_closed() -> None:
    wire = Wire()
    errors: list[ConnectionClosed] = []

    async def call() -> None:
        with pytest.raises(ConnectionClosed) as caught:
            await wire.direct.request("tools/call", {})
        errors.append(caught.value)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call)
        await wire.next_request()
        wire.direct.close()
    await call()
    assert [error.code for error in errors] == [types.CONNECTION_CLOSED] * 2
    assert repr(wire.direct) == "<DirectRequests [closed | 0 pending]>"


async def test_a_write_to_a_gone_server_fails_the_request_and_reports_it() -> None:
    wire = Wire()
    wire.fail_with = trio.BrokenResourceError
    with pytest.raises(ConnectionClosed) as caught:
        await wire.direct.request("tools/call", {})
    assert caught.value.code == types.CONNECTION_CLOSED
    assert wire.broken == 1


async def test_an_abandoned_request_is_followed_by_notifications_cancelled() -> None:
    wire = Wire()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(wire.direct.request, "tools/call", {"name": "slow"})
        await wire.next_request()
        nursery.cancel_scope.cancel()
    request, cancelled = wire.lines
    assert cancelled == {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": request["id"], "reason": "caller cancelled"},
    }
    assert repr(wire.direct) == "<DirectRequests [open | 0 pending]>"


async def test_lines_from_many_writers_never_interleave() -> None:
    """Each write checkpoints; the lock keeps a second writer out until it is done."""
    inside = 0
    most = 0

    async def write(data: bytes) -> None:
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        await trio.lowlevel.checkpoint()
        await trio.lowlevel.checkpoint()
        inside -= 1

    direct = DirectRequests(write, broken=lambda: None)
    async with trio.open_nursery() as nursery:
        for index in range(20):
            nursery.start_soon(direct.send_line, b"%d\n" % index)
    assert most == 1


# -- on a real upstream ------------------------------------------------------------------


class _SessionOnly(StdioUpstream):
    """The same upstream with every tool call through the SDK session."""

    def _direct_requests(self) -> None:
        return None


def _recorded(kind: type[StdioUpstream], tag: str, record: Path, handshake: str) -> StdioUpstream:
    """The echo fixture behind a `tee` that records everything written to it."""
    script = f"tee {record} | exec {' '.join(command('--tag', tag))}"
    settings = StdioUpstreamSettings(
        name="echo", command="sh", args=("-c", script), handshake=handshake
    )
    return kind(settings)


def _written(record: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in record.read_text().splitlines()]


async def _wait_written(record: Path, predicate: Callable[[dict[str, Any]], bool]) -> None:
    with trio.fail_after(WAIT_S):
        while not any(predicate(line) for line in _written(record)):
            await trio.sleep(0.02)  # the tee process writes when it gets to it


@pytest.mark.parametrize("handshake", HANDSHAKES)
async def test_a_direct_call_sends_what_the_session_would(
    serve: Any, tag: str, tmp_path: Path, handshake: str
) -> None:
    calls = {}
    for kind in (StdioUpstream, _SessionOnly):
        record = tmp_path / f"{kind.__name__}.jsonl"
        served = await serve(_recorded(kind, tag, record, handshake))
        assert text_of(await served.call("echo", text="héllo")) == "héllo"
        await _wait_written(record, lambda line: line.get("method") == "tools/call")
        (calls[kind],) = [line for line in _written(record) if line.get("method") == "tools/call"]
    direct, session = calls[StdioUpstream], calls[_SessionOnly]
    assert str(direct.pop("id")).startswith(ID_PREFIX)
    assert isinstance(session.pop("id"), int)
    assert direct == session
    assert ("_meta" in direct["params"]) is (handshake == "auto")


async def test_both_paths_give_the_same_result(serve: Any, tag: str, tmp_path: Path) -> None:
    results = []
    for kind in (StdioUpstream, _SessionOnly):
        served = await serve(_recorded(kind, tag, tmp_path / f"{kind.__name__}.jsonl", "auto"))
        results.append(
            [await served.call("add", a=2, b=40), await served.call("fail", message="x")]
        )
    assert results[0] == results[1]
    assert results[0][0]["structuredContent"] == {"sum": 42}


async def test_a_timed_out_direct_call_tells_the_server_to_stop(
    serve: Any, tag: str, tmp_path: Path
) -> None:
    record = tmp_path / "written.jsonl"
    served = await serve(_recorded(StdioUpstream, tag, record, "auto"))
    timed_out = r"did not answer tools/call 'slow' within 0\.3 s"
    with pytest.raises(UpstreamUnreachable, match=timed_out):
        await served.call("slow", timeout_s=0.3, seconds=30)
    await _wait_written(record, lambda line: line.get("method") == "notifications/cancelled")
    (call,) = [line for line in _written(record) if line.get("method") == "tools/call"]
    (cancel,) = [
        line for line in _written(record) if line.get("method") == "notifications/cancelled"
    ]
    assert cancel["params"]["requestId"] == call["id"]
    assert text_of(await served.call("echo", text="after")) == "after"


async def test_a_call_cut_off_by_a_crash_fails_once_the_connection_is_marked_lost(
    serve: Any, tag: str
) -> None:
    """By the time a caller hears of the end, the upstream knows it too: the next call
    fails at once instead of going down a connection that is gone."""
    argv = command("--tag", tag)
    settings = StdioUpstreamSettings(name="echo", command=argv[0], args=tuple(argv[1:]))
    served = await serve(StdioUpstream(settings))
    with pytest.raises(UpstreamUnreachable, match="closed the connection during tools/call"):
        await served.call("crash")
    with pytest.raises(UpstreamUnreachable, match=r"lost its connection|is not connected"):
        await served.upstream.call_tool("echo", {"text": "x"}, timeout_s=WAIT_S)
