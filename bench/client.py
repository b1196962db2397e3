"""The benchmarks' raw connection: pipelined NDJSON lines on one Unix socket.

Programs use `conduit.client`. The benchmarks that measure the daemon's own throughput
need what a client deliberately does not offer: many requests written at once without
waiting for their answers (`send_many`), and the answers read back in bulk
(`recv_available`). The framing and the reading of replies are the client's own
(`conduit.client.wire`), so an error reply raises the same `RpcError` class, by code.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any

import trio

from conduit.client import RpcError
from conduit.client.wire import LineBuffer, Reply, classify, encode_request, reply_value

__all__ = ["Client", "RpcError"]


class Client:
    """One connection; `call` sends a request and waits for its reply."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._buffer = LineBuffer()
        self._lines: deque[bytes] = deque()
        self._ids = itertools.count()

    @classmethod
    async def open(cls, path: str) -> Client:
        return cls(await trio.open_unix_socket(path))

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def send(self, method: str, params: dict[str, Any] | None = None) -> int:
        """Send one request without waiting; returns its id."""
        ident = next(self._ids)
        await self.stream.send_all(encode_request(ident, method, params))
        return ident

    async def send_many(self, payload: bytes) -> None:
        await self.stream.send_all(payload)

    async def recv_available(self) -> list[bytes]:
        """Every complete line received by now, at least one."""
        while not self._lines:
            await self._receive()
        lines = list(self._lines)
        self._lines.clear()
        return lines

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """The result of one request; raises its `RpcError` subclass for an error reply.
        Notifications and other replies read meanwhile are dropped."""
        ident = await self.send(method, params)
        while True:
            while not self._lines:
                await self._receive()
            message = classify(self._lines.popleft())
            if isinstance(message, Reply) and message.id in (ident, None):
                return reply_value(message)

    async def _receive(self) -> None:
        chunk = await self.stream.receive_some(1 << 20)
        if not chunk:
            raise EOFError
        self._lines.extend(self._buffer.feed(chunk))
