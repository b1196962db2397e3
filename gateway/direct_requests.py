"""JSON-RPC requests written straight onto a line transport an SDK session also uses.

A tool call is the one request the daemon makes at a rate, and the SDK's session
spends more on it than the server does: a pydantic model for the request and another
for the message, an OpenTelemetry span, a memory stream per request, and two task
hand-offs each way (session, writer task, pipe; pipe, reader task, session
dispatcher, caller). `DirectRequests` sends such a request from the caller's own task,
and the transport's reader hands the answer straight back to it; everything else on
the connection (the handshake, listings, notifications, requests from the server,
any response that is not one of these) stays with the SDK session.

The two share the pipe: every line, the session's and these, is written through
`send_line`, one at a time, so lines never interleave. Ids are strings with a prefix
the SDK never mints (its own are integers and `listen-<n>`), so the two never claim
each other's answers.

What the caller gets is what the SDK's `send_raw_request` gives: the response's
`result` object, or `MCPError` carrying the response's error, or `MCPError` with
`CONNECTION_CLOSED` once the connection ends. A request abandoned after it was
written (cancelled, timed out) is followed by `notifications/cancelled`, as the SDK
does, so the server can stop its work.

This module knows JSON-RPC and line framing, not MCP methods or tools; the caller
builds `params` (including any `_meta` the negotiated protocol needs).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
import pydantic_core
import trio
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

__all__ = ["ID_PREFIX", "ConnectionClosed", "DirectRequests"]

log = logging.getLogger("conduit.gateway.upstream")

# Prefix of the ids of direct requests: not a number (the SDK reads "7" as 7), and
# not the SDK's own string ids (`listen-<n>`).
ID_PREFIX = "conduit-call-"
# How long the courtesy `notifications/cancelled` may take to write, as the SDK's own
# bound for the same write: a server that stopped reading must not hold the caller.
CANCEL_WRITE_TIMEOUT_S = 5.0

# What every line answering one of these contains (a cheap test before parsing).
_QUOTED_PREFIX = f'"{ID_PREFIX}'.encode()

_CLOSED = types.ErrorData(code=types.CONNECTION_CLOSED, message="Connection closed")


class ConnectionClosed(MCPError):
    """The connection ended before the answer came (the SDK's `CONNECTION_CLOSED`).

    Its own class because a server may answer an error with the same code.
    """

    def __init__(self) -> None:
        super().__init__(_CLOSED.code, _CLOSED.message)


@dataclass(slots=True)
class _Pending:
    """One request awaiting its answer: the response's `result`, or its error."""

    done: trio.Event = field(default_factory=trio.Event)
    result: dict[str, Any] | None = None
    error: types.ErrorData | ValidationError | ConnectionClosed | None = None


class DirectRequests:
    """Requests answered by id on a line transport; see the module docstring.

    `write` sends bytes to the peer (one caller at a time: `send_line` sees to that),
    and `broken` is called when a request's write finds the peer gone, so the transport
    can end the connection. The transport's reader offers every line to `take`;
    `close` is called when the connection ends (see `open_stdio_transport` for by whom).
    """

    def __init__(
        self, write: Callable[[bytes], Awaitable[None]], broken: Callable[[], None]
    ) -> None:
        self._write = write
        self._broken = broken
        self._lock = trio.StrictFIFOLock()
        self._ids = itertools.count(1)
        self._pending: dict[str, _Pending] = {}
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<DirectRequests [{state} | {len(self._pending)} pending]>"

    async def send_line(self, line: bytes) -> None:
        """Write one complete line (ending in a newline) without interleaving others.

        Raises `trio.BrokenResourceError` or `trio.ClosedResourceError` as the
        transport's write does.
        """
        # Uncontended, taking the lock costs no scheduling pass of its own; the write
        # already checkpoints.
        try:
            self._lock.acquire_nowait()
        except trio.WouldBlock:
            await self._lock.acquire()
        try:
            await self._write(line)
        finally:
            self._lock.release()

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send a request and return the `result` of its response.

        Raises `MCPError` with the response's error; `ConnectionClosed` (an `MCPError`
        with `CONNECTION_CLOSED`) when the connection is, or becomes, closed before an
        answer comes; `pydantic.ValidationError` when the response is malformed.
        Cancelling it after the request went out sends `notifications/cancelled`.
        """
        if self._closed:
            raise ConnectionClosed
        request_id = f"{ID_PREFIX}{next(self._ids)}"
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        # As the SDK writes a message: compact, UTF-8, NaN and infinities as null.
        line = pydantic_core.to_json(message, inf_nan_mode="null") + b"\n"
        pending = self._pending[request_id] = _Pending()
        written = False
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            # From here a cancelled write may still have reached the server.
            written = True
            try:
                await self.send_line(line)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._broken()
                raise ConnectionClosed from None
            await pending.done.wait()
        except trio.Cancelled:
            if written and not pending.done.is_set():
                await self._cancel(request_id)
            raise
        finally:
            del self._pending[request_id]
        if pending.error is None:
            assert pending.result is not None
            return pending.result
        if isinstance(pending.error, types.ErrorData):
            raise MCPError.from_error_data(pending.error)
        raise pending.error

    def take(self, line: bytes) -> bool:
        """Whether `line` answers a pending request; if so it is handed to its caller.

        Anything else (not JSON, not a response, someone else's id) is left to the
        session: this returns False without side effects.
        """
        if not self._pending or _QUOTED_PREFIX not in line:
            return False
        try:
            message = pydantic_core.from_json(line)
        except ValueError:
            return False
        if not isinstance(message, dict) or "method" in message:
            return False
        pending = self._waiting(message.get("id"))
        if pending is None:
            return False
        result, error = message.get("result"), message.get("error")
        if isinstance(result, dict) and error is None:
            pending.result = result
        else:
            try:
                pending.error = types.ErrorData.model_validate(error, by_name=False)
            except ValidationError as exc:
                pending.error = exc
        pending.done.set()
        return True

    def answer_error(self, request_id: object, error: types.ErrorData) -> bool:
        """Whether `request_id` names a pending request; if so it fails with `error`, as
        if that had been its response (the transport could not read the real one)."""
        pending = self._waiting(request_id)
        if pending is None:
            return False
        pending.error = error
        pending.done.set()
        return True

    def _waiting(self, request_id: object) -> _Pending | None:
        """The request `request_id` names, if it still waits for its answer."""
        pending = self._pending.get(request_id) if isinstance(request_id, str) else None
        return None if pending is None or pending.done.is_set() else pending

    def close(self) -> None:
        """The connection ended: fail every pending request (`ConnectionClosed`), and
        any later one. Idempotent."""
        self._closed = True
        for pending in self._pending.values():
            if not pending.done.is_set():
                pending.error = ConnectionClosed()
                pending.done.set()

    async def _cancel(self, request_id: str) -> None:
        """Tell the server an abandoned request's answer is no longer wanted (shielded,
        bounded, best effort: a server that is gone needs no telling)."""
        notification = {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": request_id, "reason": "caller cancelled"},
        }
        line = pydantic_core.to_json(notification) + b"\n"
        with trio.move_on_after(CANCEL_WRITE_TIMEOUT_S, shield=True) as scope:
            try:
                await self.send_line(line)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
        if scope.cancelled_caught:
            log.warning("gave up telling the server that request %s was cancelled", request_id)
