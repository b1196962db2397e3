"""A scripted stand-in for the daemon's side of the wire, over a socket pair.

It speaks the contract of streaming executions and event subscriptions
(`execution/output` and `event` notifications) so the clients' routing can be tested
before, and apart from, the daemon that implements them. Each connect gives a new
`FakeConnection`; a test receives the client's requests from it and answers as it likes.
"""

from __future__ import annotations

import json
import socket
from collections import deque
from typing import Any

import anyio
import anyio.abc

from tests.conftest import WAIT_S


class _Inbox:
    """Requests as they arrive; a deque and an event, so nothing needs closing."""

    def __init__(self) -> None:
        self.items: deque[Any] = deque()
        self.closed = False
        self.ready = anyio.Event()

    def put(self, item: Any) -> None:
        self.items.append(item)
        self.ready.set()

    def close(self) -> None:
        self.closed = True
        self.ready.set()

    async def get(self) -> Any:
        while not self.items:
            if self.closed:
                raise anyio.EndOfStream
            self.ready = anyio.Event()
            await self.ready.wait()
        return self.items.popleft()


class FakeConnection:
    """The daemon's end of one connection: requests in, replies and notifications out."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream = stream
        self._requests = _Inbox()

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Read requests until the client closes its end (or the test ends); then close
        this end too."""
        task_status.started()
        buffer = b""
        try:
            while True:
                buffer += await self.stream.receive(65536)
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    self._requests.put(json.loads(line))
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        finally:
            self._requests.close()
            await anyio.aclose_forcefully(self.stream)

    async def recv(self) -> dict[str, Any]:
        """The client's next request (fails the test after WAIT_S)."""
        with anyio.fail_after(WAIT_S):
            request: dict[str, Any] = await self._requests.get()
            return request

    def recv_nowait(self) -> dict[str, Any] | None:
        """The client's next request if one has arrived, else None."""
        items = self._requests.items
        return items.popleft() if items else None

    async def send(self, message: Any) -> None:
        await self.stream.send(json.dumps(message).encode() + b"\n")

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
    """Hands a client connected sockets (`connect`) and the test their other ends
    (`accept`), each read by a task in the test's task group (or Trio nursery).

    A real socket pair, under asyncio and Trio alike: the client sees the same kind of
    stream it opens to a daemon.
    """

    def __init__(self, tasks: Any) -> None:
        self._tasks = tasks
        self._accepted = _Inbox()
        self.connects = 0

    async def connect(self) -> anyio.abc.ByteStream:
        client_socket, daemon_socket = socket.socketpair()
        client_end = await anyio.abc.UNIXSocketStream.from_socket(client_socket)
        daemon_end = await anyio.abc.UNIXSocketStream.from_socket(daemon_socket)
        connection = FakeConnection(daemon_end)
        await self._tasks.start(connection.serve)
        self.connects += 1
        self._accepted.put(connection)
        return client_end

    async def accept(self) -> FakeConnection:
        with anyio.fail_after(WAIT_S):
            connection: FakeConnection = await self._accepted.get()
            return connection


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
