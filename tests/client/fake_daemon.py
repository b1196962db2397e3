"""A scripted stand-in for the daemon's side of the wire, over in-memory streams.

It speaks the contract of streaming executions and event subscriptions
(`execution/output` and `event` notifications) so the clients' routing can be tested
before, and apart from, the daemon that implements them. Each connect gives a new
`FakeConnection`; a test receives the client's requests from it and answers as it likes.
"""

from __future__ import annotations

import json
import math
from typing import Any

import trio
import trio.testing

from tests.conftest import WAIT_S


class FakeConnection:
    """The daemon's end of one connection: requests in, replies and notifications out."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self._send, self._requests = trio.open_memory_channel[dict[str, Any]](math.inf)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read requests until the client closes its end."""
        task_status.started()
        buffer = b""
        try:
            while chunk := await self.stream.receive_some(65536):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    self._send.send_nowait(json.loads(line))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        self._send.close()

    async def recv(self) -> dict[str, Any]:
        """The client's next request (fails the test after WAIT_S)."""
        with trio.fail_after(WAIT_S):
            return await self._requests.receive()

    def recv_nowait(self) -> dict[str, Any] | None:
        """The client's next request if one has arrived, else None."""
        try:
            return self._requests.receive_nowait()
        except trio.WouldBlock:
            return None

    async def send(self, message: Any) -> None:
        await self.stream.send_all(json.dumps(message).encode() + b"\n")

    async def reply(self, ident: Any, result: Any) -> None:
        await self.send({"jsonrpc": "2.0", "id": ident, "result": result})

    async def error(self, ident: Any, code: int, message: str, data: Any = None) -> None:
        error = {"code": code, "message": message, **({"data": data} if data else {})}
        await self.send({"jsonrpc": "2.0", "id": ident, "error": error})

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self.send({"jsonrpc": "2.0", "method": method, "params": params})

    async def output(self, execution_id: str, text: str, seq: int, **extra: Any) -> None:
        params = {"execution_id": execution_id, "stream": "stdout", "text": text, "seq": seq}
        await self.notify("execution/output", {**params, **extra})

    async def close(self) -> None:
        await self.stream.aclose()


class FakeDaemon:
    """Hands a client connected in-memory streams (`connect`) and the test their other
    ends (`accept`), each read by a task in the test's nursery."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._send, self._accepted = trio.open_memory_channel[FakeConnection](math.inf)
        self.connects = 0

    async def connect(self) -> trio.abc.Stream:
        client_end, daemon_end = trio.testing.memory_stream_pair()
        connection = FakeConnection(daemon_end)
        await self._nursery.start(connection.serve)
        self.connects += 1
        self._send.send_nowait(connection)
        return client_end

    async def accept(self) -> FakeConnection:
        with trio.fail_after(WAIT_S):
            return await self._accepted.receive()


def wire_result(execution_id: str, **fields: Any) -> dict[str, Any]:
    """An `execute` result as the daemon sends it, ok unless `fields` say otherwise."""
    return {
        "execution_id": execution_id,
        "status": "ok",
        "result": None,
        "stdout": "",
        "stderr": "",
        "exit_code": 0,
        "error": None,
        "truncated": {"stdout": False, "stderr": False},
        "tool_calls": 0,
        "duration_ms": 1.0,
        "queue_ms": 0.0,
        "executor": "wasm-python",
        "memory_peak_bytes": None,
        **fields,
    }
