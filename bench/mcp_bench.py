"""MCP clients on one daemon (issue 26): a trivial `execute_python` as an MCP
`tools/call`, over streamable HTTP and over stdio (`conduit mcp --connect`, a relay to
the daemon's socket), beside the same execution sent straight to the socket.

For each way in: p50 and p99 with one client (the ways taking turns in blocks), and
executions/s with 8 clients, each a session of its own, calling one after another.
Over HTTP, two clients: the official MCP SDK client (what agents use; its own work is
in the figure) and a bare one, which writes a prepared request on one kept-alive
connection and reads the answer, so that its figure less the socket's is what the
daemon's HTTP adds. And the resident memory of the daemon's process tree with 8 MCP
clients connected (stdio: the 8 relay processes beside it).

Every loop is bounded in count and time.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

import trio

from bench.client import Client
from bench.conduit_daemon import BIN, STATE_DIR, daemon, wait_executors
from bench.programs import PYTHON_REQUEST
from bench.sessions import _tree_rss_bytes
from bench.stats import percentiles

CLIENTS = 8
CODE = PYTHON_REQUEST["code"]
ARGUMENTS = {"code": CODE}
# Untimed calls first: a client's first call sets up what later ones reuse.
WARMUP = 20
# Timed calls a way in makes before the next takes its turn.
BLOCK = 10
# The target: what MCP over HTTP adds to a socket execution at p50, ms.
HTTP_TARGET_MS = 1.0

Call = Callable[[], Awaitable[None]]
Opener = Callable[[], Any]  # an async context manager yielding a `Call`


async def run(workdir: Path, calls: int, duration_s: float) -> dict[str, Any]:
    """The figures from a daemon of their own: wasm-python alone (`execute_python`'s
    executor), and MCP over HTTP on a free loopback port."""
    port = _free_port()
    extra = f'[mcp_http]\nlisten = "127.0.0.1:{port}"\n'
    async with daemon(workdir, "mcp", pool_size=0, extra=extra) as path:
        await wait_executors(path)
        token = (STATE_DIR / "master.token").read_text().strip()
        return await figures(path, f"http://127.0.0.1:{port}/mcp", token, calls, duration_s)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def figures(
    socket_path: str, http_url: str | None, token: str, calls: int, duration_s: float
) -> dict[str, Any]:
    """The figures, each way in; `http_url` None when the daemon serves no HTTP."""
    ways: dict[str, Opener] = {
        "socket": lambda: _socket_client(socket_path),
        "stdio_sdk": lambda: _sdk_stdio_client(socket_path),
    }
    if http_url is not None:
        ways["http_sdk"] = lambda: _sdk_http_client(http_url, token)
        ways["http_bare"] = lambda: _bare_http_client(http_url, token)
    results: dict[str, Any] = {"target_ms": HTTP_TARGET_MS}
    latencies = await _latencies(ways, calls)
    for name, opener in ways.items():
        results[name] = {
            "latency": latencies[name],
            "per_s_8_clients": await _throughput(opener, duration_s),
        }
    pid = await _daemon_pid(socket_path)
    results["rss_mb"] = {"idle": _tree_rss_bytes(pid) / (1 << 20)}
    for name in ("stdio_sdk", "http_sdk"):
        if name in ways:
            results["rss_mb"][name] = await _rss_with_clients(pid, ways[name])
    return results


async def _latencies(ways: dict[str, Opener], calls: int) -> dict[str, dict[str, float]]:
    """`calls` timed calls through each way in, one client each, the ways taking turns
    in blocks of BLOCK: a busy moment of the machine falls on all of them, so that
    their differences are the ways' own."""
    samples: dict[str, list[float]] = {name: [] for name in ways}
    async with AsyncExitStack() as stack:
        clients = {name: await stack.enter_async_context(open_()) for name, open_ in ways.items()}
        for call in clients.values():
            for _ in range(WARMUP):
                await call()
        while len(samples[next(iter(ways))]) < calls:
            for name, call in clients.items():
                for _ in range(BLOCK):
                    began = time.perf_counter()
                    await call()
                    samples[name].append(time.perf_counter() - began)
    return {name: percentiles(taken) for name, taken in samples.items()}


async def _throughput(opener: Opener, duration_s: float) -> float:
    """Executions/s with CLIENTS clients, each calling one after another."""
    done = 0
    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(opener()) for _ in range(CLIENTS)]

        # Each client stops after the call it is in, never mid-call: an MCP client
        # whose call is cancelled may fail to close.
        started = time.perf_counter()
        stop_at = started + duration_s

        async def worker(call: Call) -> None:
            nonlocal done
            while time.perf_counter() < stop_at:
                await call()
                done += 1

        with trio.fail_after(duration_s + 60):
            async with trio.open_nursery() as nursery:
                for call in clients:
                    nursery.start_soon(worker, call)
        elapsed = time.perf_counter() - started
    return done / elapsed


async def _rss_with_clients(pid: int, opener: Opener) -> float:
    """Resident MB of the daemon's tree (and of this process's relay children) with
    CLIENTS clients connected, each having made one call."""
    async with AsyncExitStack() as stack:
        for _ in range(CLIENTS):
            call = await stack.enter_async_context(opener())
            await call()
        await trio.sleep(1.0)
        return (_tree_rss_bytes(pid) + _relays_rss_bytes()) / (1 << 20)


def _relays_rss_bytes() -> int:
    """The `conduit mcp` relays this process started (the stdio clients' servers)."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            pages = int((entry / "statm").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == os.getpid() and b"mcp" in command and b"--connect" in command:
            total += pages * os.sysconf("SC_PAGE_SIZE")
    return total


async def _daemon_pid(socket_path: str) -> int:
    client = await Client.open(socket_path)
    try:
        return int((await client.call("daemon/status"))["pid"])
    finally:
        await client.aclose()


def _check(result: Any) -> None:
    """An MCP tool result: it must have run, and run well."""
    if getattr(result, "is_error", False) or getattr(result, "isError", False):
        raise AssertionError(f"execute_python failed: {result}")


@asynccontextmanager
async def _socket_client(socket_path: str) -> AsyncIterator[Call]:
    client = await Client.open(socket_path)

    async def call() -> None:
        result = await client.call("execute", PYTHON_REQUEST)
        if result.get("status") != "ok":
            raise AssertionError(f"an execution failed: {result}")

    try:
        yield call
    finally:
        with trio.CancelScope(shield=True):
            await client.aclose()


def _devnull() -> TextIO:
    return Path(os.devnull).open("w")


@asynccontextmanager
async def _sdk_stdio_client(socket_path: str) -> AsyncIterator[Call]:
    from mcp import Client as McpClient
    from mcp.client.stdio import StdioServerParameters, stdio_client

    env = {k: v for k, v in os.environ.items() if not k.startswith("CONDUIT_")}
    env["CONDUIT_STATE_DIR"] = str(STATE_DIR)
    server = StdioServerParameters(
        command=str(BIN / "conduit"), args=["mcp", "--connect", socket_path], env=env
    )
    with _devnull() as quiet:  # the relays' log lines
        transport = stdio_client(server, errlog=quiet)
        async with McpClient(transport, cache=None) as client:  # type: ignore[arg-type]

            async def call() -> None:
                _check(await client.call_tool("execute_python", ARGUMENTS))

            yield call


@asynccontextmanager
async def _sdk_http_client(url: str, token: str) -> AsyncIterator[Call]:
    import httpx
    from mcp import Client as McpClient
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx.AsyncClient(headers=headers, timeout=60) as http,
        McpClient(streamable_http_client(url, http_client=http), cache=None) as client,  # type: ignore[arg-type]
    ):

        async def call() -> None:
            _check(await client.call_tool("execute_python", ARGUMENTS))

        yield call


@asynccontextmanager
async def _bare_http_client(url: str, token: str) -> AsyncIterator[Call]:
    """One kept-alive connection; `initialize`, then the same `tools/call` each time."""
    host, port, path = _split_url(url)
    stream = await trio.open_tcp_stream(host, port)
    reader = _HttpReader(stream)

    async def post(message: dict[str, Any], session: str | None) -> tuple[dict[str, str], bytes]:
        body = json.dumps(message).encode()
        head = [
            f"POST {path} HTTP/1.1",
            f"Host: {host}:{port}",
            f"Authorization: Bearer {token}",
            "Content-Type: application/json",
            "Accept: application/json, text/event-stream",
            f"Content-Length: {len(body)}",
        ]
        if session is not None:
            head.append(f"Mcp-Session-Id: {session}")
        await stream.send_all(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        return await reader.response()

    try:
        headers, _ = await post(_INITIALIZE, None)
        session = headers.get("mcp-session-id")
        await post({"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
        request = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "execute_python", "arguments": ARGUMENTS},
        }

        async def call() -> None:
            _, body = await post(request, session)
            if b'"isError":true' in body.replace(b" ", b"") or b'"result"' not in body:
                raise AssertionError(f"execute_python failed: {body[:300]!r}")

        yield call
    finally:
        with trio.CancelScope(shield=True):
            await stream.aclose()


_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "conduit-bench", "version": "1"},
    },
}


def _split_url(url: str) -> tuple[str, int, str]:
    rest = url.removeprefix("http://")
    authority, _, path = rest.partition("/")
    host, _, port = authority.rpartition(":")
    return host, int(port), "/" + path


class _HttpReader:
    """Reads one HTTP/1.1 response at a time: its headers (lower-cased) and its body,
    by Content-Length, or an SSE body up to the event that holds a JSON-RPC answer."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._buffer = b""

    async def _more(self) -> None:
        chunk = await self._stream.receive_some(1 << 16)
        if not chunk:
            raise EOFError("the daemon closed the connection")
        self._buffer += chunk

    async def response(self) -> tuple[dict[str, str], bytes]:
        while b"\r\n\r\n" not in self._buffer:
            await self._more()
        head, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            size = int(headers["content-length"])
            while len(self._buffer) < size:
                await self._more()
            body, self._buffer = self._buffer[:size], self._buffer[size:]
            return headers, body
        if headers.get("transfer-encoding", "").lower() == "chunked":
            return headers, await self._chunked()
        return headers, b""

    async def _chunked(self) -> bytes:
        """A chunked body, whole (an SSE stream that the daemon ends after the answer)."""
        body = b""
        while True:
            while b"\r\n" not in self._buffer:
                await self._more()
            size_line, self._buffer = self._buffer.split(b"\r\n", 1)
            size = int(size_line.split(b";")[0], 16)
            while len(self._buffer) < size + 2:
                await self._more()
            body += self._buffer[:size]
            self._buffer = self._buffer[size + 2 :]
            if size == 0:
                return body
