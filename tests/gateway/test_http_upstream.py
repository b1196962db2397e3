"""HTTP upstreams against the echo fixture served over streamable HTTP on loopback.

Real processes, the real protocol, no mocks. The settings say `trusted = true`
because the SSRF guard would rightly refuse 127.0.0.1. Every wait is bounded.

Tests that only read from the server (list, call) share one for the module; a test
that changes its tools, or kills it, starts its own.
"""

from __future__ import annotations

import contextlib
import gc
import json
import select
import subprocess
import time
import uuid
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from functools import partial
from typing import Any

import httpx2
import pytest
import trio
from pydantic import BaseModel, ValidationError

from conduit.core.errors import UpstreamUnreachable
from conduit.gateway import http_upstream
from conduit.gateway.http_body_cap import BodyCap
from conduit.gateway.http_upstream import HTTP_TIMEOUT, HttpUpstream
from conduit.gateway.keeper import MAX_MESSAGE_BYTES, answer_too_large
from conduit.gateway.model import UpstreamState, UpstreamStatus
from conduit.gateway.settings import HttpUpstreamSettings, UpstreamList
from conduit.gateway.ssrf import SsrfGuard
from tests.fixtures.mcp_echo_server import START_TIMEOUT_S, HttpServer, command, running_http
from tests.gateway.local_http import LocalServer, Reply, Seen
from tests.gateway.test_stdio_upstream import (
    HANDSHAKES,
    NEGOTIATED,
    Served,
    is_state,
    serving,
    text_of,
)
from tests.processes import leftovers, processes_with

# The SDK's streamable-HTTP client leaves httpx2's SSE iterators unfinished when a
# 2025-era response ends (`return` inside `async for`); Trio closes them when they are
# collected but warns each time. Harmless, and not ours to fix.
pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator 'httpx2.:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:Async generator 'httpcore2.:ResourceWarning"),
]


# On the command line of every server this module starts, to find them in /proc.
MODULE_TAG = f"conduit-test-{uuid.uuid4().hex}"
# The tools the echo fixture serves besides its own nine.
EXTRA_TOOLS = "150"


@pytest.fixture
def tag() -> str:
    return f"{MODULE_TAG}-{uuid.uuid4().hex}"


@pytest.fixture
async def echo_http(tag: str) -> AsyncIterator[HttpServer]:
    """The echo fixture over HTTP with 150 extra tools, for one test; killed after it."""
    async with running_http("--tag", tag, "--many", EXTRA_TOOLS) as server:
        yield server
    assert await leftovers(tag) == []


@pytest.fixture(scope="module")
def reading_url() -> Iterator[str]:
    """The URL of one such server for the module's tests that only list and call."""
    tag = f"{MODULE_TAG}-reading"
    argv = command("--http", "0", "--tag", tag, "--many", EXTRA_TOOLS)
    with subprocess.Popen(argv, stdout=subprocess.PIPE) as process:
        try:
            assert process.stdout is not None
            ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_S)
            assert ready, "the echo server did not announce its port"
            port = process.stdout.readline()
            assert port, "the echo server exited before announcing its port"
            yield f"http://127.0.0.1:{int(port)}/mcp"
        finally:
            process.kill()
    assert processes_with(tag) == []


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[HttpUpstream], Awaitable[Served]]]:
    async with serving() as start:
        yield start
    gc.collect()  # collect abandoned iterators while this module's filters apply


def http(url: str, **settings: Any) -> HttpUpstream:
    return HttpUpstream(HttpUpstreamSettings(name="web", url=url, trusted=True, **settings))


@pytest.mark.parametrize("handshake", HANDSHAKES)
async def test_handshake_and_every_page_over_http(
    serve: Any, reading_url: str, handshake: str
) -> None:
    served = await serve(http(reading_url, handshake=handshake))
    assert served.upstream.status() == UpstreamStatus(
        name="web",
        transport="http",
        state=UpstreamState.READY,
        tools=159,
        protocol_version=NEGOTIATED[handshake],
        server_info={"name": "conduit-echo", "version": "1.0.0"},
    )
    (tools,) = served.lists
    assert len({tool["name"] for tool in tools}) == 159
    assert tools[-1]["name"] == "extra_149"


@pytest.mark.parametrize("handshake", HANDSHAKES)
async def test_calls_and_configured_headers_over_http(
    serve: Any, reading_url: str, handshake: str
) -> None:
    upstream = http(reading_url, handshake=handshake, headers={"X-Conduit-Team": "infra"})
    served = await serve(upstream)
    assert text_of(await served.call("header", name="x-conduit-team")) == "infra"
    assert text_of(await served.call("echo", text="héllo")) == "héllo"
    assert (await served.call("add", a=1, b=2))["structuredContent"] == {"sum": 3}
    assert (await served.call("fail", message="nope"))["isError"] is True
    # Larger than the SDK's default 1 MiB SSE event limit.
    assert len(text_of(await served.call("big", n=3_000_000))) == 3_000_000


@pytest.mark.parametrize(
    ("handshake", "version", "failure"),
    [
        # The 2025 era answers over SSE, where the SDK caps an event.
        (
            "initialize",
            "2025-11-25",
            "upstream 'web' gave no answer to tools/call 'big' (SSE stream failed: Server-sent "
            "event exceeded the 100000 byte limit.); other calls go on",
        ),
        # At 2026-07-28 the SDK's own server answers every request with one JSON body.
        (
            "auto",
            "2026-07-28",
            "upstream 'web' answered tools/call 'big' with too much: the answer was 150202 "
            "bytes, more than the 100000 bytes (0.0953674 MiB) the daemon reads from an upstream",
        ),
    ],
)
async def test_an_answer_past_the_cap_fails_its_call_alone(
    serve: Any,
    reading_url: str,
    monkeypatch: pytest.MonkeyPatch,
    handshake: str,
    version: str,
    failure: str,
) -> None:
    monkeypatch.setattr(http_upstream, "MAX_MESSAGE_BYTES", 100_000)
    served = await serve(http(reading_url, handshake=handshake))
    with pytest.raises(UpstreamUnreachable) as failed:
        await served.call("big", n=150_000)
    assert str(failed.value).startswith(failure)
    assert text_of(await served.call("echo", text="next")) == "next"
    status = served.upstream.status()
    assert (status.state, status.restarts, status.protocol_version) == (
        UpstreamState.READY,
        0,
        version,
    )


# -- answers the SDK reads whole -------------------------------------------------------

# Past the cap by more than loopback's socket buffers can take (a receive buffer may
# grow to 32 MiB): a server that got to send all of it was read to its end.
TOO_MUCH = 2 * MAX_MESSAGE_BYTES
_MIB = b"x" * 2**20
_TOO_MUCH_PREFIX = "upstream 'web' answered tools/call 'big' with too much: the answer was "
_TOO_MUCH_SUFFIX = (
    "the 67108864 bytes (64 MiB) the daemon reads from an upstream; it was dropped{}; "
    "other calls go on (ask the tool for less: a smaller page or range)"
)


class JsonServer:
    """A streamable-HTTP MCP server (no session, tools `echo` and `big`) that answers
    every request with `application/json`, as a 2026-07-28 server always does.

    `big` answers a tool result `TOO_MUCH` bytes long, streamed: with a Content-Length
    (`framing="length"`), chunked, or chunked and gzipped. `finished` counts the ones
    sent to their end.
    """

    def __init__(self, framing: str) -> None:
        self.framing = framing
        self.finished = 0
        self.http = LocalServer(self._answer)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http.port}/mcp"

    async def _answer(self, seen: Seen) -> Reply:
        if seen.method != "POST":
            return Reply(405)
        message = json.loads(seen.body)
        if "id" not in message:
            return Reply(202)
        method, params = message["method"], message.get("params", {})
        if method == "tools/call" and params["name"] == "big":
            return self._big(message["id"])
        answer = {"jsonrpc": "2.0", "id": message["id"], **_outcome(method, params)}
        return Reply(200, {"content-type": "application/json"}, json.dumps(answer).encode())

    def _big(self, request_id: int | str) -> Reply:
        opening = b'{"jsonrpc":"2.0","id":%b,"result":{"content":[{"type":"text","text":"'
        parts = self._text(opening % json.dumps(request_id).encode(), b'"}]}}')
        headers = {"content-type": "application/json"}
        if self.framing == "length":
            headers["content-length"] = str(TOO_MUCH)
        elif self.framing == "gzip":
            headers["content-encoding"] = "gzip"
            parts = _gzipped(parts)
        return Reply(200, headers, stream=parts)

    async def _text(self, opening: bytes, closing: bytes) -> AsyncGenerator[bytes, None]:
        yield opening
        left = TOO_MUCH - len(opening) - len(closing)
        while left > 0:
            yield _MIB[:left]
            left -= len(_MIB)
        yield closing
        self.finished += 1


def _outcome(method: str, params: dict[str, Any]) -> dict[str, Any]:
    if method == "initialize":
        result = {"capabilities": {"tools": {}}, "serverInfo": {"name": "json", "version": "1"}}
        return {"result": {"protocolVersion": params["protocolVersion"], **result}}
    if method == "tools/list":
        tools = [{"name": name, "inputSchema": {"type": "object"}} for name in ("echo", "big")]
        return {"result": {"tools": tools}}
    if method == "tools/call":
        return {"result": {"content": [{"type": "text", "text": params["arguments"]["text"]}]}}
    return {"error": {"code": -32601, "message": f"no {method}"}}


async def _gzipped(parts: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
    packer = zlib.compressobj(wbits=31)  # 31: the gzip format
    async with contextlib.aclosing(parts):
        async for part in parts:
            if packed := packer.compress(part):
                yield packed
    yield packer.flush()


def _json_upstream(server: JsonServer, client: str) -> HttpUpstream:
    if client == "trusted":
        return http(server.url, handshake="initialize")
    # What the daemon gives an upstream it does not trust: the SSRF guard's client.
    guard = SsrfGuard(allow_networks=["127.0.0.1/32"], extra_ports=[server.http.port])
    settings = HttpUpstreamSettings(name="web", url=server.url, handshake="initialize")
    return HttpUpstream(settings, http_client_factory=guard.open_mcp_client)


@pytest.mark.parametrize(
    ("framing", "client"),
    [("length", "trusted"), ("chunked", "trusted"), ("chunked", "guarded"), ("gzip", "trusted")],
)
async def test_a_json_answer_past_the_cap_fails_its_call_alone(
    serve: Any, framing: str, client: str, caplog: pytest.LogCaptureFixture
) -> None:
    server = JsonServer(framing)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.http.run)
        served = await serve(_json_upstream(server, client))
        with pytest.raises(UpstreamUnreachable) as failed:
            await served.call("big")
        assert text_of(await served.call("echo", text="next")) == "next"
        status = served.upstream.status()
        nursery.cancel_scope.cancel()
    if framing == "length":  # told before its body, so none of it was read
        too_much = f"{TOO_MUCH} bytes, more than " + _TOO_MUCH_SUFFIX.format(" unread")
    else:
        too_much = "more than " + _TOO_MUCH_SUFFIX.format(", the rest unread")
    assert str(failed.value) == _TOO_MUCH_PREFIX + too_much
    assert (status.state, status.restarts) == (UpstreamState.READY, 0)
    # One warning line of the gateway's, no traceback of the SDK's.
    said = [(r.name, r.levelname) for r in caplog.records if r.name.startswith(("mcp", "conduit"))]
    assert said == [("conduit.gateway", "WARNING")], caplog.records
    if framing != "gzip":  # gzipped, all of it fits in the sockets' buffers
        assert server.finished == 0, "the daemon read the whole answer"


async def test_a_call_times_out_over_http(serve: Any, reading_url: str) -> None:
    served = await serve(http(reading_url))
    started = time.monotonic()
    with pytest.raises(UpstreamUnreachable, match=r"'web' did not answer .*'slow' within 0.3 s"):
        await served.call("slow", timeout_s=0.3, seconds=30)
    assert time.monotonic() - started < 2
    assert text_of(await served.call("echo", text="ok")) == "ok"


@pytest.mark.parametrize("handshake", HANDSHAKES)
async def test_list_changed_over_http(serve: Any, echo_http: HttpServer, handshake: str) -> None:
    served = await serve(http(echo_http.url, handshake=handshake))
    await served.call("add_tool", name="late_tool")
    await served.wait(lambda s: s.tools == 160)
    assert served.lists[-1][-1]["name"] == "late_tool"


@pytest.mark.parametrize("handshake", HANDSHAKES)
async def test_a_killed_server_backs_off_then_comes_back(
    serve: Any, tag: str, handshake: str
) -> None:
    async with running_http("--tag", tag) as first:
        served = await serve(http(first.url, handshake=handshake))
        await first.kill()
        with pytest.raises(UpstreamUnreachable, match="upstream 'web'"):
            await served.call("echo", text="anyone?")
        # A 2026-07-28 session may notice first that its listen stream dropped; the
        # attempts that follow cannot connect.
        await served.wait(
            lambda s: s.state is UpstreamState.BACKING_OFF and "ConnectError" in str(s.last_error)
        )
        with pytest.raises(UpstreamUnreachable, match="'web' is not connected"):
            await served.call("echo", text="anyone?")
    async with running_http("--tag", tag, port=first.port):
        status = await served.wait(is_state(UpstreamState.READY))
        assert status.restarts >= 1
        assert text_of(await served.call("echo", text="back")) == "back"
    assert await leftovers(tag) == []


async def test_a_server_restarted_between_calls_is_reconnected(serve: Any, tag: str) -> None:
    # A 2025-era session lives in the server: the new server answers the old
    # Mcp-Session-Id with 404 (to a call, or to the SDK's GET stream reconnecting),
    # and the keeper starts a new session instead of failing every call from then on.
    async with running_http("--tag", tag) as first:
        served = await serve(http(first.url, handshake="initialize"))
    async with running_http("--tag", tag, port=first.port):
        with contextlib.suppress(UpstreamUnreachable):  # unless the GET stream saw it first
            await served.call("echo", text="who are you?")
        await served.wait(lambda s: s.state is UpstreamState.READY and s.restarts >= 1)
        assert text_of(await served.call("echo", text="hello again")) == "hello again"


async def test_an_unreachable_server_does_not_hold_up_the_start(serve: Any) -> None:
    with trio.socket.socket() as sock:  # a port nothing listens on
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    served = await serve(http(f"http://127.0.0.1:{port}/mcp"))
    status = served.upstream.status()
    assert status.state is UpstreamState.BACKING_OFF
    assert "ConnectError" in (status.last_error or "")


async def test_redirects_are_not_followed(serve: Any) -> None:
    seen: list[bytes] = []

    async def redirect(stream: trio.SocketStream) -> None:
        head = b""
        while b"\r\n\r\n" not in head and (chunk := await stream.receive_some(65536)):
            head += chunk
        seen.append(head.split(b"\r\n", 1)[0])
        await stream.send_all(
            b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /elsewhere\r\n"
            b"Content-Length: 0\r\nConnection: close\r\n\r\n"
        )
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(partial(trio.serve_tcp, redirect, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        served = await serve(http(f"http://127.0.0.1:{port}/mcp"))
        status = served.upstream.status()
        nursery.cancel_scope.cancel()
    assert status.state is UpstreamState.BACKING_OFF
    assert "Redirect to http://127.0.0.1" in (status.last_error or "")
    assert seen and all(line.startswith(b"POST /mcp ") for line in seen)


async def test_the_client_factory_builds_each_connections_client(
    serve: Any, reading_url: str
) -> None:
    calls: list[dict[str, Any]] = []
    clients: list[httpx2.AsyncClient] = []

    def factory(
        headers: dict[str, str] | None = None,
        timeout: httpx2.Timeout | None = None,
        auth: httpx2.Auth | None = None,
    ) -> httpx2.AsyncClient:
        calls.append({"headers": headers, "timeout": timeout, "auth": auth})
        clients.append(httpx2.AsyncClient(headers=headers, timeout=timeout, max_redirects=20))
        return clients[-1]

    # Not trusted: a factory (in the daemon, the SSRF guard's) is what makes that allowed.
    settings = HttpUpstreamSettings(name="web", url=reading_url, headers={"X-A": "1"})
    served = await serve(HttpUpstream(settings, http_client_factory=factory))
    assert served.upstream.status().state is UpstreamState.READY
    assert calls == [{"headers": {"X-A": "1"}, "timeout": HTTP_TIMEOUT, "auth": None}]
    assert clients[0].max_redirects == 0  # whatever the factory chose


def test_an_untrusted_upstream_needs_the_guarded_client() -> None:
    settings = HttpUpstreamSettings(name="web", url="https://example.com/mcp")
    with pytest.raises(ValueError, match="SSRF-guarded"):
        HttpUpstream(settings)


async def test_no_fixture_processes_outlive_the_module() -> None:
    # Every server this module starts carries its tag. The reading tests' one serves
    # until the module ends, and is checked as it stops.
    reading = processes_with(f"{MODULE_TAG}-reading")
    assert [pid for pid in processes_with(MODULE_TAG) if pid not in reading] == []


class _Config(BaseModel):
    upstreams: UpstreamList = ()


@pytest.mark.parametrize(
    ("changes", "location", "message"),
    [
        ({"url": "ftp://example.com"}, "upstreams.0.url", "must be http:// or https://"),
        ({"url": "https://u:p@example.com"}, "upstreams.0.url", "must not carry credentials"),
        ({"url": "https://example.com:99999"}, "upstreams.0.url", "not a valid URL"),
        ({"headers": {"Bad Name": "x"}}, "upstreams.0.headers", "not a valid HTTP header"),
        ({"headers": {"X-A": "a\r\nb"}}, "upstreams.0.headers", "line break"),
        ({"command": "x"}, "upstreams.0.command", "not permitted"),
    ],
)
def test_http_settings_errors_name_the_field(
    changes: dict[str, Any], location: str, message: str
) -> None:
    tree = {"name": "web", "transport": "http", "url": "https://example.com/mcp", **changes}
    with pytest.raises(ValidationError) as caught:
        _Config.model_validate({"upstreams": [tree]})
    first = caught.value.errors()[0]
    assert ".".join(str(part) for part in first["loc"]) == location
    assert message in first["msg"]


def test_http_settings_defaults() -> None:
    settings = HttpUpstreamSettings(name="web", url="https://example.com/mcp")
    assert (settings.trusted, settings.headers, settings.auth) == (False, {}, None)


def test_capped_answers_whose_error_never_comes_are_forgotten() -> None:
    """A request cancelled after its answer passed the cap never gets the SDK's error:
    the cap keeps a bounded number of such answers, not one per occurrence forever."""
    cap = BodyCap(10)
    for number in range(1000):
        body = json.dumps({"jsonrpc": "2.0", "id": number, "method": "tools/call"})
        request = httpx2.Request("POST", "http://upstream.test/mcp", content=body)
        cap._trip(request)(answer_too_large(None, 10))
    assert 0 < len(cap._tripped) <= 256
    assert 999 in cap._tripped  # the latest are kept
