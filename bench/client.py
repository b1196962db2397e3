"""A minimal pipelining NDJSON JSON-RPC client for the daemon's Unix socket."""

from __future__ import annotations

import itertools
import json
from typing import Any

import trio


class RpcError(RuntimeError):
    """The daemon answered with a JSON-RPC error; `code` and `data` are kept for callers."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message", "error"))
        self.code: int | None = error.get("code")
        self.data: Any = error.get("data")


class Client:
    """One connection; `call` sends a request and reads the next reply line."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""
        self.ids = itertools.count()

    @classmethod
    async def open(cls, path: str) -> Client:
        return cls(await trio.open_unix_socket(path))

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def send(self, method: str, params: dict[str, Any] | None = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": next(self.ids), "method": method}
        if params is not None:
            message["params"] = params
        await self.stream.send_all(json.dumps(message).encode() + b"\n")

    async def send_many(self, payload: bytes) -> None:
        await self.stream.send_all(payload)

    async def recv_available(self) -> list[bytes]:
        """Every complete line available now, at least one."""
        while b"\n" not in self.buffer:
            chunk = await self.stream.receive_some(1 << 20)
            if not chunk:
                raise EOFError
            self.buffer += chunk
        *complete, self.buffer = self.buffer.split(b"\n")
        return complete

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        await self.send(method, params)
        reply = json.loads((await self.recv_available())[0])
        if "error" in reply:
            raise RpcError(reply["error"])
        return reply["result"]
