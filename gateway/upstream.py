"""The interface every upstream client implements, whatever its transport.

An upstream is opened and closed by its own task (`serve`): it connects, lists its
tools (following pagination), keeps the session open, refreshes the list on
`notifications/tools/list_changed`, and for stdio servers restarts the process with
back-off when it dies. `call_tool` may be called from any task while it is ready.

An upstream that sets `relays_notifications = True` also takes a `CallObserver` in
`call_tool` and tells it the call's progress and the log messages the server sends
while the call runs, so they can reach the client that made the call, and passes on
the requests the server makes of that client (sampling, elicitation).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import trio

from conduit.gateway.model import UpstreamStatus

__all__ = ["CallObserver", "RawTool", "ReportsState", "StateListener", "Upstream"]

# A tool as the upstream described it: the MCP `Tool` object as JSON
# ({"name", "description", "inputSchema", "outputSchema"?, "annotations"?}).
RawTool = dict[str, Any]

# Told an upstream's status each time its state changes; must not block or raise.
StateListener = Callable[[UpstreamStatus], None]


@dataclass(frozen=True, slots=True)
class CallObserver:
    """Who hears what an upstream says about one tool call while it runs.

    `progress(progress, total, message)` is the server's `notifications/progress` for the
    call. `log(level, logger, data)` is a `notifications/message` the server sent while
    the call was its connection's solo call (see `SessionKeeper._observing`: stdio
    carries no hint of which request a message belongs to, so one that might belong to
    another call goes to none).
    `ask(method, params)` passes on a request the server sent the client while the call
    was its solo call (`sampling/createMessage`, `elicitation/create`) and returns the
    client's result, or raises `RpcError` with the client's refusal; it may wait as long
    as a person takes, and is cancelled when the call ends.
    Any may be None: not wanted. `progress` and `log` must return quickly.
    """

    progress: Callable[[float, float | None, str | None], Awaitable[None]] | None = None
    log: Callable[[str, str | None, Any], Awaitable[None]] | None = None
    ask: Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]] | None = None


@runtime_checkable
class ReportsState(Protocol):
    """An upstream that tells when its state changes (optional beside `Upstream`)."""

    def watch_state(self, listener: StateListener) -> None:
        """Call `listener(status)` after every change of state, from the upstream's task."""
        ...


class Upstream(Protocol):
    """One MCP server Conduit is a client of.

    An upstream may also set `enforces_timeout = True` to promise that `call_tool`
    never outlives its `timeout_s`; the catalogue then adds no backstop of its own.
    """

    name: str

    async def serve(
        self,
        on_tools: Callable[[list[RawTool]], None],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Hold the connection open until cancelled, reconnecting as needed.

        Calls `task_status.started()` after the first attempt, successful or not (an
        unreachable upstream must not hold up the daemon's start). Calls `on_tools`
        with the full tool list each time it is (re)fetched.
        """
        ...

    async def call_tool(
        self, name: str, arguments: dict[str, Any], *, timeout_s: float
    ) -> dict[str, Any]:
        """Call tool `name`; return the MCP `CallToolResult` as JSON.

        Raises `UpstreamUnreachable` when not connected, when the call times out
        (`timeout_s`), when the upstream dies mid-call, or when it answers a JSON-RPC
        error or garbage. A tool that *fails* is a result with `isError: true`.
        """
        ...

    def status(self) -> UpstreamStatus:
        """A frozen snapshot for `upstreams/list`: state, tool count, last error."""
        ...
