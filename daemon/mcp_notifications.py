"""What an MCP client hears while its request runs: progress and log messages.

**Progress.** A `tools/call` that carries `_meta.progressToken` gets the program's
output as it comes, as `notifications/progress` (`progress`: characters of output so
far, `message`: the new text). Output is coalesced: at most one notification every
`PROGRESS_INTERVAL_S`, each with at most `MAX_PROGRESS_CHARS` of text; what piles up
past `MAX_PENDING_CHARS` meanwhile is left out (and said to be), since the whole output
is in the result anyway. A program printing in a tight loop therefore costs the client
ten small messages a second, and never holds the program up.

**Logging.** `logging/setLevel` sets the least severe level a peer hears; until it
does, it hears none. `log` sends `notifications/message` at a level if the peer
listens to it.

**Upstream tools.** A `tools/call` of an upstream tool relays what the upstream says
about it (`open_upstream_relay`): its progress, under the client's own token, if the
client asked for progress; its log messages, if the client set a level and the
message's is at it or above; and its requests to the client (`sampling/createMessage`,
`elicitation/create`), if the client declared the capability, with the client's answer
taken back to the upstream (`client_asks`). Progress is coalesced as program output is: at most one
notification every `PROGRESS_INTERVAL_S`, carrying the latest values and a message of
at most `MAX_PROGRESS_CHARS`, so an upstream flooding progress costs the client no
more than a program printing in a loop.

Notifications go through `Peer.notify` with the request they belong to, which each
transport routes: the socket's one stream, or that request's SSE stream over HTTP.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from conduit.core.errors import MethodNotFound
from conduit.daemon.client_asks import undeclared
from conduit.daemon.dispatcher import Peer
from conduit.daemon.executions import OutputSink
from conduit.gateway.upstream import CallObserver

__all__ = [
    "LEVELS",
    "MAX_PENDING_CHARS",
    "MAX_PROGRESS_CHARS",
    "PROGRESS_INTERVAL_S",
    "ProgressRelay",
    "listens",
    "log",
    "open_progress",
    "open_upstream_relay",
]

logger = logging.getLogger("conduit.mcp")

# RFC 5424's severities, least severe first, as MCP names them.
LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
# Ten a second reads as live to a person and costs a client little.
PROGRESS_INTERVAL_S = 0.1
# A screenful of text per notification.
MAX_PROGRESS_CHARS = 8192
# Output waiting for the next notification; past this it is left out of the progress
# (the result has it all). Bounds what one slow client makes the daemon hold.
MAX_PENDING_CHARS = 65536
# Upstream progress sent as it comes before coalescing starts: an honest tool's few
# steps (0, 50, 100) all reach the client, however close together.
_UPSTREAM_BURST = 10
# A notification the client does not take within this is dropped, and so are the later
# ones: progress must not hold the program up.
_STALL_S = 5.0


class ProgressRelay:
    """Program output as coalesced `notifications/progress` for one request."""

    def __init__(self, peer: Peer, token: str | int, request_id: Any) -> None:
        self._peer = peer
        self._token = token
        self._request_id = request_id
        self._pending: list[str] = []
        self._pending_chars = 0
        self._left_out = 0
        self._total = 0
        self._ready = trio.Event()
        self.stalled = False

    async def __call__(self, piece: dict[str, Any]) -> None:
        """The executions' `OutputSink`: keep the piece for the next notification."""
        text = str(piece.get("text", ""))
        self._total += len(text)
        room = MAX_PENDING_CHARS - self._pending_chars
        if len(text) > room:
            self._left_out += len(text) - max(room, 0)
            text = text[: max(room, 0)]
        if text:
            self._pending.append(text)
            self._pending_chars += len(text)
        self._ready.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Send what is pending, at most every `PROGRESS_INTERVAL_S`, until cancelled."""
        task_status.started()
        while not self.stalled:
            await self._ready.wait()
            self._ready = trio.Event()
            await self.flush_once()
            await trio.sleep(PROGRESS_INTERVAL_S)

    async def flush_once(self) -> None:
        """Send one notification with what is pending (up to `MAX_PROGRESS_CHARS`)."""
        if self.stalled or not (self._pending or self._left_out):
            return
        text = "".join(self._pending)
        message, rest = text[:MAX_PROGRESS_CHARS], text[MAX_PROGRESS_CHARS:]
        self._pending, self._pending_chars = ([rest], len(rest)) if rest else ([], 0)
        if self._left_out and not rest:
            message += (
                f"\n[{self._left_out} characters of output left out here; the result has them]\n"
            )
            self._left_out = 0
        if rest:
            self._ready.set()
        # `progress` counts output the program has written, so it only ever grows.
        params = {"progressToken": self._token, "progress": self._total, "message": message}
        with trio.move_on_after(_STALL_S) as waited:
            await self._peer.notify("notifications/progress", params, request_id=self._request_id)
        if waited.cancelled_caught:
            self.stalled = True

    async def flush(self) -> None:
        """Send everything still pending, in as many notifications as it takes."""
        while not self.stalled and (self._pending or self._left_out):
            await self.flush_once()


@asynccontextmanager
async def open_progress(
    peer: Peer | None, meta: dict[str, Any] | None, request_id: Any
) -> AsyncIterator[OutputSink | None]:
    """An output sink relaying to `peer` as progress, if the request asked for it
    (`meta.progressToken`), else None. What is pending is sent before the block exits."""
    token = _progress_token(meta)
    if peer is None or token is None:
        yield None
        return
    relay = ProgressRelay(peer, token, request_id)
    async with trio.open_nursery() as nursery:
        await nursery.start(relay.run)
        try:
            yield relay
        finally:
            nursery.cancel_scope.cancel()
    with trio.move_on_after(_STALL_S):
        await relay.flush()


def listens(peer: Peer | None, level: str) -> bool:
    """Whether `peer` has asked to hear messages at `level`."""
    wanted = getattr(peer, "log_level", None)
    return wanted is not None and LEVELS.index(level) >= LEVELS.index(wanted)


async def log(
    peer: Peer | None, level: str, data: Any, *, request_id: Any = None, source: str = "conduit"
) -> None:
    """Send `notifications/message` at `level` if `peer` listens to it; never waits
    long for a client that is not reading."""
    if peer is None or not listens(peer, level):
        return
    params = {"level": level, "logger": source, "data": data}
    with trio.move_on_after(_STALL_S):
        await peer.notify("notifications/message", params, request_id=request_id)


def _progress_token(meta: dict[str, Any] | None) -> str | int | None:
    token = (meta or {}).get("progressToken")
    return token if isinstance(token, str | int) and not isinstance(token, bool) else None


class _UpstreamProgress:
    """An upstream's progress for one call, coalesced: after a burst of
    `_UPSTREAM_BURST`, at most one notification every `PROGRESS_INTERVAL_S`; one
    arriving sooner replaces what waits, and the latest is sent with the next one due
    or at the call's end (`flush`)."""

    def __init__(self, peer: Peer, token: str | int, request_id: Any) -> None:
        self._peer = peer
        self._token = token
        self._request_id = request_id
        self._latest: dict[str, Any] | None = None
        self._credit = float(_UPSTREAM_BURST)
        self._credited_at = trio.current_time()

    async def __call__(self, value: float, total: float | None, message: str | None) -> None:
        """The upstream's progress callback."""
        params: dict[str, Any] = {"progressToken": self._token, "progress": value}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message[:MAX_PROGRESS_CHARS]
        self._latest = params
        now = trio.current_time()
        earned = (now - self._credited_at) / PROGRESS_INTERVAL_S
        self._credit, self._credited_at = min(_UPSTREAM_BURST, self._credit + earned), now
        if self._credit >= 1:
            self._credit -= 1
            await self.flush()

    async def flush(self) -> None:
        """Send the progress waiting, if any."""
        params, self._latest = self._latest, None
        if params is None:
            return
        with trio.move_on_after(_STALL_S):
            await self._peer.notify("notifications/progress", params, request_id=self._request_id)


@asynccontextmanager
async def open_upstream_relay(
    peer: Peer | None, meta: dict[str, Any] | None, request_id: Any
) -> AsyncIterator[CallObserver | None]:
    """What relays an upstream tool call's progress and log messages to `peer` while
    the block runs, or None when it asked for neither. Progress still waiting is sent
    when the block exits normally."""
    token = _progress_token(meta)
    answers = getattr(peer, "answers", {})
    if peer is None or (token is None and peer.log_level is None and not answers):
        yield None
        return

    async def relay_log(level: str, source: str | None, data: Any) -> None:
        level = level if level in LEVELS else "info"
        await log(peer, level, data, request_id=request_id, source=source or "upstream")

    async def relay_ask(method: str, params: dict[str, Any]) -> dict[str, Any]:
        if refused := undeclared(answers, method, params):
            raise MethodNotFound(
                f"method not found: the MCP client that made this call does not answer {refused}"
            )
        return await peer.ask(method, params, request_id=request_id)

    progress = _UpstreamProgress(peer, token, request_id) if token is not None else None
    yield CallObserver(progress=progress, log=relay_log, ask=relay_ask)
    if progress is not None:
        await progress.flush()
