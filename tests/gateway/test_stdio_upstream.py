"""Stdio upstreams against real MCP servers: the echo fixture and mcp-server-time.

Real processes, the real protocol, no mocks. Every wait is bounded; each test checks
that no process it started (tagged on its command line) outlives it.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import trio
import trio.testing
from mcp.shared.message import SessionMessage
from pydantic import BaseModel, ValidationError

from conduit.core.errors import UpstreamUnreachable
from conduit.gateway import stdio_upstream
from conduit.gateway.direct_requests import DirectRequests
from conduit.gateway.keeper import ReconnectBackoff, SessionKeeper
from conduit.gateway.model import UpstreamState, UpstreamStatus
from conduit.gateway.settings import StdioUpstreamSettings, UpstreamList
from conduit.gateway.stdio_upstream import StdioUpstream, child_environment
from conduit.gateway.upstream import CallObserver, RawTool, Upstream
from tests.fixtures.mcp_echo_server import command
from tests.processes import leftovers, leftovers_beyond, processes_with

# Generous: a cold Python importing the SDK on a loaded two-core machine.
WAIT_S = 30
HANDSHAKES = ["auto", "initialize"]
# What each handshake negotiates with the fixture (it serves both protocol eras).
NEGOTIATED = {"auto": "2026-07-28", "initialize": "2025-11-25"}


class Served:
    """An upstream being served in the test's nursery, with every tool list it reported."""

    def __init__(self, upstream: SessionKeeper) -> None:
        self.upstream = upstream
        self.lists: list[list[RawTool]] = []

    async def call(self, tool: str, timeout_s: float = WAIT_S, **arguments: Any) -> dict[str, Any]:
        return await self.upstream.call_tool(tool, arguments, timeout_s=timeout_s)

    async def wait(self, predicate: Callable[[UpstreamStatus], bool]) -> UpstreamStatus:
        with trio.fail_after(WAIT_S):
            return await self.upstream.wait_until(predicate)


@pytest.fixture
def tag() -> str:
    """A marker for this test's processes, to find any it leaves behind."""
    return f"conduit-test-{uuid.uuid4().hex}"


@asynccontextmanager
async def serving() -> AsyncIterator[Callable[[SessionKeeper], Awaitable[Served]]]:
    """`start(upstream)` serves it in a nursery that is cancelled on exit."""
    async with trio.open_nursery() as nursery:

        async def start(upstream: SessionKeeper) -> Served:
            served = Served(upstream)
            with trio.fail_after(WAIT_S):
                await nursery.start(upstream.serve, served.lists.append)
            return served

        yield start
        nursery.cancel_scope.cancel()


@pytest.fixture
async def serve(tag: str) -> AsyncIterator[Callable[[SessionKeeper], Awaitable[Served]]]:
    """Serve upstreams until the test ends; then check none left a process behind."""
    async with serving() as start:
        yield start
    assert await leftovers(tag) == [], "a test left upstream processes running"


def echo(tag: str, *args: str, name: str = "echo", **settings: Any) -> StdioUpstream:
    argv = command("--tag", tag, *args)
    return StdioUpstream(
        StdioUpstreamSettings(name=name, command=argv[0], args=tuple(argv[1:]), **settings)
    )


def with_a_child(tag: str) -> StdioUpstream:
    """The echo server, started by `sh` next to a child (`<tag>-child`) holding its stdout.

    As `npx` leaves `node` running: closing must stop the whole process group.
    """
    child = f"{sys.executable} -c 'import time; time.sleep(600)' {tag}-child"
    script = f"{child} & exec {' '.join(command('--tag', tag))}"
    return StdioUpstream(StdioUpstreamSettings(name="tree", command="sh", args=("-c", script)))


# The echo fixture's `--garbage`: nothing but non-JSON on stdout until stdin closes.
GARBAGE = """
import sys
print("this is not JSON-RPC\\n{broken", flush=True)
for line in sys.stdin:
    print(f"garbage for {len(line)} bytes", flush=True)
"""


def text_of(result: dict[str, Any]) -> str:
    return result["content"][0]["text"]


def is_state(state: UpstreamState) -> Callable[[UpstreamStatus], bool]:
    return lambda status: status.state is state


# -- handshake, listing, calls ---------------------------------------------------------


@pytest.mark.parametrize("handshake", HANDSHAKES)
async def test_handshake_negotiates_a_version_and_records_the_server(
    serve: Any, tag: str, handshake: str
) -> None:
    upstream = echo(tag, handshake=handshake)
    conforms: Upstream = upstream  # the protocol, checked statically
    assert conforms is upstream
    served = await serve(upstream)
    assert upstream.status() == UpstreamStatus(
        name="echo",
        transport="stdio",
        state=UpstreamState.READY,
        tools=9,
        protocol_version=NEGOTIATED[handshake],
        server_info={"name": "conduit-echo", "version": "1.0.0"},
    )
    assert repr(upstream) == "<StdioUpstream 'echo' [ready | 9 tools, 0 restarts]>"
    assert [len(tools) for tools in served.lists] == [9]


async def test_tools_list_follows_every_page(serve: Any, tag: str) -> None:
    served = await serve(echo(tag, "--many", "150", "--page-size", "50"))
    (tools,) = served.lists
    names = [tool["name"] for tool in tools]
    assert len(names) == 159 == len(set(names))
    assert names[:2] == ["echo", "add"]
    assert names[-1] == "extra_149"
    add = tools[1]
    assert add["inputSchema"]["required"] == ["a", "b"]
    assert add["outputSchema"]["properties"] == {"sum": {"type": "integer"}}


async def test_call_results_keep_text_structured_content_and_is_error(serve: Any, tag: str) -> None:
    served = await serve(echo(tag, handshake="initialize"))
    assert await served.call("echo", text="héllo") == {
        "content": [{"type": "text", "text": "héllo"}],
        "isError": False,
        "resultType": "complete",
    }
    added = await served.call("add", a=2, b=40)
    assert added["structuredContent"] == {"sum": 42}
    assert text_of(added) == "42"
    failed = await served.call("fail", message="no such repo")
    assert failed["isError"] is True
    assert text_of(failed) == "no such repo"
    assert len(text_of(await served.call("big", n=5_000_000))) == 5_000_000


async def test_concurrent_calls_from_many_tasks_share_the_session(serve: Any, tag: str) -> None:
    served = await serve(echo(tag))
    results: dict[int, str] = {}

    async def one(index: int) -> None:
        results[index] = text_of(await served.call("echo", text=str(index)))

    async with trio.open_nursery() as nursery:
        for index in range(50):
            nursery.start_soon(one, index)
    assert results == {index: str(index) for index in range(50)}


async def test_an_unknown_tool_is_unreachable_with_the_servers_error(serve: Any, tag: str) -> None:
    served = await serve(echo(tag))
    with pytest.raises(UpstreamUnreachable, match=r"'echo' answered tools/call 'nope' with error"):
        await served.call("nope")
    assert served.upstream.status().state is UpstreamState.READY


# -- timeouts and crashes --------------------------------------------------------------


async def test_a_call_times_out_and_the_upstream_stays_ready(serve: Any, tag: str) -> None:
    served = await serve(echo(tag))
    started = time.monotonic()
    with pytest.raises(UpstreamUnreachable, match=r"'echo' did not answer .*'slow' within 0.3 s"):
        await served.call("slow", timeout_s=0.3, seconds=30)
    assert time.monotonic() - started < 2
    assert text_of(await served.call("echo", text="still here")) == "still here"
    assert served.upstream.status().restarts == 0


@pytest.mark.parametrize("handshake", HANDSHAKES)
async def test_a_crash_fails_in_flight_calls_fast_then_restarts(
    serve: Any, tag: str, handshake: str
) -> None:
    served = await serve(echo(tag, handshake=handshake))
    errors: list[str] = []
    slow_started = trio.Event()

    async def slow() -> None:
        slow_started.set()
        with pytest.raises(UpstreamUnreachable) as caught:
            await served.call("slow", seconds=60)
        errors.append(str(caught.value))

    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(slow)
        await slow_started.wait()
        with pytest.raises(UpstreamUnreachable) as caught:
            await served.call("crash")
        errors.append(str(caught.value))
    assert time.monotonic() - started < 5
    assert all("upstream 'echo'" in error and "reconnected" in error for error in errors)

    status = await served.wait(lambda s: s.state is UpstreamState.READY and s.restarts == 1)
    assert status.last_error is None
    assert text_of(await served.call("echo", text="again")) == "again"
    assert len(served.lists) == 2


async def test_calls_between_crash_and_restart_fail_at_once(serve: Any, tag: str) -> None:
    served = await serve(echo(tag))
    with pytest.raises(UpstreamUnreachable):
        await served.call("crash")
    status = await served.wait(is_state(UpstreamState.BACKING_OFF))
    assert "exited with status 17" in (status.last_error or "")
    with pytest.raises(UpstreamUnreachable, match=r"'echo' is not connected \(backing_off\)"):
        await served.call("echo", text="too early")


async def test_a_server_that_exits_at_start_backs_off_with_its_stderr(serve: Any, tag: str) -> None:
    code = "import sys; sys.stderr.write('cannot open database\\n'); sys.exit(3)"
    upstream = StdioUpstream(
        StdioUpstreamSettings(name="dies", command=sys.executable, args=("-c", code, tag))
    )
    await serve(upstream)  # started() comes back although the server never worked
    status = await Served(upstream).wait(lambda s: s.restarts >= 2)
    assert status.state in {UpstreamState.BACKING_OFF, UpstreamState.STARTING}
    assert "exited with status 3" in (status.last_error or "")
    assert "cannot open database" in (status.last_error or "")


async def test_garbage_on_stdout_backs_off_and_other_upstreams_are_unaffected(
    serve: Any, tag: str
) -> None:
    healthy = await serve(echo(tag, name="healthy"))
    # The handshake never completes, so the attempt lasts `list_timeout_s`: a server
    # that writes its garbage at once (the echo fixture imports the SDK first) lets
    # that be short.
    settings = StdioUpstreamSettings(
        name="garbage", command=sys.executable, args=("-c", GARBAGE, tag), list_timeout_s=1
    )
    garbage = await serve(StdioUpstream(settings))
    status = garbage.upstream.status()
    assert status.state is UpstreamState.BACKING_OFF
    assert "not JSON-RPC" in (status.last_error or "")
    with pytest.raises(UpstreamUnreachable, match="'garbage' is not connected"):
        await garbage.call("echo", text="x")
    assert text_of(await healthy.call("echo", text="fine")) == "fine"


async def test_an_oversized_answer_fails_its_call_alone_and_the_connection_goes_on(
    serve: Any, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stdio_upstream, "MAX_MESSAGE_BYTES", 100_000)
    served = await serve(echo(tag))
    slow: list[dict[str, Any]] = []
    too_much = "answered tools/call 'big' with too much: the answer was 15[0-9]{4} bytes, "
    too_much += r"more than the 100000 bytes \(0.0953674 MiB\)"
    async with trio.open_nursery() as nursery:
        # Another caller's call, in flight meanwhile on the same connection.
        nursery.start_soon(lambda: _append(slow, served.call("slow", seconds=1)))
        with trio.fail_after(WAIT_S), pytest.raises(UpstreamUnreachable, match=too_much):
            await served.call("big", n=150_000)
        # The same through the SDK session (a call that wants progress goes that way).
        observer = CallObserver(progress=_no_progress)
        with trio.fail_after(WAIT_S), pytest.raises(UpstreamUnreachable, match=too_much):
            await served.upstream.call_tool(
                "big", {"n": 150_000}, timeout_s=WAIT_S, observer=observer
            )
        assert len(text_of(await served.call("big", n=50_000))) == 50_000
    assert text_of(slow[0]) == "slept"
    status = served.upstream.status()
    assert (status.state, status.restarts) == (UpstreamState.READY, 0)


async def _append(results: list[dict[str, Any]], call: Awaitable[dict[str, Any]]) -> None:
    results.append(await call)


async def _no_progress(progress: float, total: float | None, message: str | None) -> None:
    pass


async def test_an_oversized_line_that_answers_no_request_ends_the_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stdio_upstream, "MAX_MESSAGE_BYTES", 1000)
    server, stdout = trio.testing.memory_stream_one_way_pair()
    send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](10)
    direct = DirectRequests(server.send_all, broken=lambda: None)
    log = b'{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"'
    line = log + b"x" * 5000 + b'"}}'
    await server.send_all(line + b'\n{"jsonrpc":"2.0","method":"x"}\n')
    await server.aclose()
    with trio.fail_after(WAIT_S):
        await stdio_upstream._read_messages(stdout, send, trio.CancelScope(), direct)
    async with receive:
        (error,) = [item async for item in receive]
    assert isinstance(error, ValueError)
    assert str(error) == (
        f"a message of {len(line)} bytes exceeds the 1000 bytes the daemon reads, and no response "
        "id shows at its start or end; disconnecting"
    )


async def test_a_missing_command_fails_without_retrying(serve: Any) -> None:
    upstream = StdioUpstream(
        StdioUpstreamSettings(name="missing", command="/nonexistent/conduit-mcp-server")
    )
    await serve(upstream)
    status = upstream.status()
    assert status.state is UpstreamState.FAILED
    assert "cannot start '/nonexistent/conduit-mcp-server'" in (status.last_error or "")
    assert status.restarts == 0


async def test_a_disabled_upstream_is_closed_and_starts_nothing(serve: Any, tag: str) -> None:
    served = await serve(echo(tag, enabled=False))
    assert served.upstream.status().state is UpstreamState.CLOSED
    assert processes_with(tag) == []
    with pytest.raises(UpstreamUnreachable, match=r"not connected \(closed\)"):
        await served.call("echo", text="x")


async def test_serving_twice_at_once_is_refused(serve: Any, tag: str) -> None:
    served = await serve(echo(tag))
    with pytest.raises(RuntimeError, match="already being served"):
        await served.upstream.serve(lambda tools: None)


# -- processes -------------------------------------------------------------------------


async def test_closing_stops_the_process_group_children_included(tag: str) -> None:
    upstream = with_a_child(tag)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(WAIT_S):
            await nursery.start(upstream.serve, lambda tools: None)
        assert len(processes_with(tag)) == 2
        nursery.cancel_scope.cancel()
    assert await leftovers(tag) == []


async def test_cancelling_during_the_handshake_closes_promptly(tag: str) -> None:
    upstream = echo(tag, "--garbage", list_timeout_s=600)  # the handshake never completes
    async with trio.open_nursery() as nursery:
        nursery.start_soon(upstream.serve, lambda tools: None)
        with trio.fail_after(WAIT_S):
            while not processes_with(tag):
                await trio.sleep(0.01)  # nothing to wait on: the process is the server's own
        started = time.monotonic()
        nursery.cancel_scope.cancel()
    assert time.monotonic() - started < 3
    assert upstream.status().state is UpstreamState.CLOSED
    assert await leftovers(tag) == []


async def test_a_crashed_servers_children_are_killed_too(serve: Any, tag: str) -> None:
    served = await serve(with_a_child(tag))
    with pytest.raises(UpstreamUnreachable):
        await served.call("crash")  # the child still holds stdout: no EOF to notice
    await served.wait(lambda s: s.restarts == 1 and s.state is UpstreamState.READY)
    assert len(await leftovers_beyond(f"{tag}-child", 1)) == 1  # the new server's child only


async def test_a_server_reaped_long_before_its_stop_has_its_group_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its group was swept when it exited; by the stop its id may be a new group's
    (pids wrap), and a sweep then would kill whatever leads that one."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-c", "pass"], start_new_session=True
    )
    await process.wait()
    signalled: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "killpg", lambda group, sig: signalled.append((group, sig)))
    await stdio_upstream._stop(process)
    assert signalled == []


async def test_the_servers_stderr_goes_to_the_log(
    serve: Any, tag: str, caplog: pytest.LogCaptureFixture
) -> None:
    script = f"echo 'warming up the cache' >&2; exec {' '.join(command('--tag', tag))}"
    caplog.set_level(logging.INFO, logger="conduit.gateway.upstream")
    await serve(
        StdioUpstream(StdioUpstreamSettings(name="chatty", command="sh", args=("-c", script)))
    )
    lines = [r for r in caplog.records if getattr(r, "stream", None) == "stderr"]
    assert [r.getMessage() for r in lines] == ["upstream chatty stderr: warming up the cache"]
    assert lines[0].upstream == "chatty"  # type: ignore[attr-defined]


async def test_the_upstream_sees_only_its_own_environment(
    serve: Any, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONDUIT_TEST_SECRET", "s3cret-daemon-value")
    served = await serve(echo(tag, env={"GITHUB_TOKEN": "for-this-upstream"}))

    async def variable(name: str) -> Any:
        return (await served.call("env", name=name))["structuredContent"]["value"]

    assert await variable("CONDUIT_TEST_SECRET") is None
    assert await variable("GITHUB_TOKEN") == "for-this-upstream"
    assert await variable("PATH") == os.environ["PATH"]
    assert set(child_environment({})) <= {"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER"}


# -- list changes ----------------------------------------------------------------------


@pytest.mark.parametrize("handshake", HANDSHAKES)
async def test_list_changed_refreshes_the_tools(serve: Any, tag: str, handshake: str) -> None:
    served = await serve(echo(tag, handshake=handshake))
    await served.call("add_tool", name="late_tool")
    status = await served.wait(lambda s: s.tools == 10)
    assert status.state is UpstreamState.READY
    assert served.lists[-1][-1]["name"] == "late_tool"
    assert text_of(await served.call("late_tool", text="new")) == "new"


async def test_tools_are_re_listed_when_their_schemas_age_past_the_ttl(
    serve: Any, tag: str
) -> None:
    # The fixture announces no change here: only the TTL can make it list again.
    served = await serve(echo(tag, schema_ttl_s=0.2))
    with trio.fail_after(WAIT_S):
        while len(served.lists) < 3:
            await trio.sleep(0.05)
    assert served.lists[-1] == served.lists[0]


# -- a published server ----------------------------------------------------------------


async def test_the_published_time_server(serve: Any) -> None:
    settings = StdioUpstreamSettings(
        name="time", command=sys.executable, args=("-m", "mcp_server_time")
    )
    served = await serve(StdioUpstream(settings))
    status = served.upstream.status()
    assert status.state is UpstreamState.READY
    assert status.server_info and status.server_info["name"] == "mcp-time"
    assert {tool["name"] for tool in served.lists[0]} == {"get_current_time", "convert_time"}

    result = await served.call("get_current_time", timezone="UTC")
    assert result["isError"] is False
    answer = result["structuredContent"]
    assert set(answer) == {"timezone", "datetime", "day_of_week", "is_dst"}
    assert answer["timezone"] == "UTC"
    assert answer["datetime"].endswith("+00:00")
    assert answer["is_dst"] is False


# -- pieces ----------------------------------------------------------------------------


def test_backoff_doubles_to_the_cap_and_resets_after_a_healthy_session() -> None:
    backoff = ReconnectBackoff()
    delays = [backoff.next_delay(up_for_s=0) for _ in range(11)]
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]
    assert backoff.next_delay(up_for_s=59) == 30.0
    assert backoff.next_delay(up_for_s=60) == 0.1
    assert backoff.next_delay(up_for_s=0) == 0.2


class _Config(BaseModel):
    upstreams: UpstreamList = ()


def _error(tree: dict[str, Any]) -> tuple[str, str]:
    with pytest.raises(ValidationError) as caught:
        _Config.model_validate({"upstreams": [tree]})
    first = caught.value.errors()[0]
    return ".".join(str(part) for part in first["loc"]), first["msg"]


def test_stdio_settings_defaults() -> None:
    (settings,) = _Config.model_validate(
        {"upstreams": [{"name": "time", "transport": "stdio", "command": "mcp-server-time"}]}
    ).upstreams
    assert settings == StdioUpstreamSettings(name="time", command="mcp-server-time")
    assert (settings.call_timeout_s, settings.list_timeout_s, settings.schema_ttl_s) == (
        30,
        30,
        300,
    )
    assert (settings.strict, settings.enabled, settings.handshake) == (None, True, "auto")
    with pytest.raises(ValidationError):
        settings.command = "other"  # type: ignore[misc]  # frozen


@pytest.mark.parametrize(
    ("tree", "location", "message"),
    [
        ({"name": "a b", "command": "x"}, "upstreams.0.name", "not usable as a tool namespace"),
        ({"name": "gh__x", "command": "x"}, "upstreams.0.name", "no '__'"),
        ({"name": "ok", "command": " "}, "upstreams.0.command", "command is empty"),
        ({"name": "ok", "command": "x", "env": {"A-B": "1"}}, "upstreams.0.env", "'A-B'"),
        ({"name": "ok", "command": "x", "cwd": "rel/dir"}, "upstreams.0.cwd", "absolute"),
        ({"name": "ok", "command": "x", "url": "http://x"}, "upstreams.0.url", "not permitted"),
        ({"name": "ok", "command": "x", "list_timeout_s": 0}, "upstreams.0.list_timeout_s", "> 0"),
    ],
)
def test_stdio_settings_errors_name_the_field(
    tree: dict[str, Any], location: str, message: str
) -> None:
    where, text = _error({"transport": "stdio", **tree})
    assert where == location
    assert message.replace("> 0", "greater than 0") in text


def test_settings_need_a_transport_and_unique_names() -> None:
    assert _error({"name": "x", "command": "y"}) == (
        "upstreams.0",
        'Value error, transport must be "stdio" (with command) or "http" (with url)',
    )
    twice = {"name": "x", "transport": "stdio", "command": "y"}
    with pytest.raises(ValidationError, match="'x' is used twice"):
        _Config.model_validate({"upstreams": [twice, twice]})
