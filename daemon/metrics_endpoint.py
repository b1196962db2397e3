"""The metrics endpoint: just enough HTTP/1.1 for Prometheus to scrape `GET /metrics`,
and for a load balancer or an orchestrator to ask `GET /ready` (200 when the daemon
should be sent clients, else 503 with the reason) and `GET /live` (200 while its event
loop answers).

One request per connection (`Connection: close`), no request body, no keep-alive, no
compression. A request must arrive whole within `REQUEST_TIMEOUT_S` and fit in
`MAX_REQUEST_BYTES`, and at most `MAX_SCRAPES` connections are served at once (more are
closed unanswered), so a slow or flooding client holds little, and not for long. The
body is rendered at most once per `RENDER_INTERVAL_S` (scrapes in between get the same
one), so however fast anyone on the host scrapes, the event loop spends little on it.
What to answer comes from the `render` callable it is given; this module knows nothing
of metrics.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

__all__ = [
    "MAX_REQUEST_BYTES",
    "MAX_SCRAPES",
    "RENDER_INTERVAL_S",
    "REQUEST_TIMEOUT_S",
    "MetricsEndpoint",
]

log = logging.getLogger("conduit.metrics")

# A scrape is a request line and a handful of headers (Prometheus sends ~300 bytes).
MAX_REQUEST_BYTES = 8192
# Prometheus's own scrape timeout defaults to 10 s; a client that has not sent its
# request and read the answer within this is gone or hostile.
REQUEST_TIMEOUT_S = 5.0
# One Prometheus needs one connection at a time; a few more cover a curl beside it.
MAX_SCRAPES = 8
# After answering: how long, and for how many bytes, to wait for the client to stop
# sending and close. Closing with unread input makes the kernel reset the connection,
# which can destroy the answer before the client has read it.
LINGER_S = 1.0
MAX_LINGER_BYTES = 65536

# Rendering costs the event loop a few milliseconds; Prometheus scrapes every 15 s or
# more, so a body a second old is fresh to it, and a scraping loop costs at most that.
RENDER_INTERVAL_S = 1.0

METRICS_PATH = "/metrics"
READY_PATH = "/ready"
LIVE_PATH = "/live"
_PATHS = f"{METRICS_PATH}, {READY_PATH} and {LIVE_PATH}"
_TEXT = "text/plain; charset=utf-8"
# HTTP ends its head with a blank CRLF line; a person typing into `nc` sends bare LFs.
_ENDS_OF_HEAD = (b"\r\n\r\n", b"\n\n")


class _BadRequest(Exception):
    """The request could not be read; answered with its status and message."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class MetricsEndpoint:
    """Answers `GET /metrics` (and `HEAD`) with `render()`, `GET /ready` from
    `unready_reason()`, `GET /live` with 200, anything else with an error.

    `render` and `unready_reason` run on the event loop: they must be quick and must not
    block. If one raises, the request is answered 500 and the error logged; the
    endpoint keeps serving.
    """

    def __init__(
        self,
        render: Callable[[], bytes],
        content_type: str,
        unready_reason: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._render = render
        self._unready_reason = unready_reason
        self._content_type = content_type
        self._active = 0
        self._rendered: tuple[float, bytes] | None = None  # when, and the body

    def __repr__(self) -> str:
        return f"<MetricsEndpoint [Scrapes: {self._active} active]>"

    async def serve(
        self,
        listener: trio.SocketListener,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve connections on `listener` until cancelled; closes `listener`.

        Calls `task_status.started()` once it accepts.
        """
        async with listener, trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._serve_connection, [listener])
            task_status.started()

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        if self._active >= MAX_SCRAPES:
            await trio.aclose_forcefully(stream)
            return
        self._active += 1
        try:
            with trio.move_on_after(REQUEST_TIMEOUT_S):
                await stream.send_all(await self._answer(stream))
                await _linger(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client left; nobody to answer
        finally:
            self._active -= 1
            await trio.aclose_forcefully(stream)

    async def _answer(self, stream: trio.SocketStream) -> bytes:
        try:
            method, target = _request_line(await _read_head(stream))
        except _BadRequest as exc:
            return _response(exc.status, exc.message)
        head_only = method == "HEAD"
        if method not in ("GET", "HEAD"):
            return _response(
                "405 Method Not Allowed",
                f"method not allowed: {method}; use GET {METRICS_PATH}",
                extra=("Allow: GET, HEAD",),
            )
        path = target.partition("?")[0]
        if path == READY_PATH:
            return self._readiness(head_only)
        if path == LIVE_PATH:
            return _response("200 OK", "live", head_only=head_only)
        if path != METRICS_PATH:
            return _response(
                "404 Not Found", f"not found: {target}; served: {_PATHS}", head_only=head_only
            )
        return self._scrape(head_only)

    def _readiness(self, head_only: bool) -> bytes:
        try:
            reason = self._unready_reason()
        except Exception:
            log.exception("judging readiness failed")
            return _response("500 Internal Server Error", "judging readiness failed")
        if reason is None:
            return _response("200 OK", "ready", head_only=head_only)
        return _response("503 Service Unavailable", f"not ready: {reason}", head_only=head_only)

    def _scrape(self, head_only: bool) -> bytes:
        now = trio.current_time()
        try:
            if self._rendered is None or now - self._rendered[0] >= RENDER_INTERVAL_S:
                self._rendered = (now, self._render())
            body = self._rendered[1]
        except Exception:
            log.exception("rendering the metrics failed")
            return _response(
                "500 Internal Server Error",
                "rendering the metrics failed; the daemon's log has the details",
            )
        return _response("200 OK", body, content_type=self._content_type, head_only=head_only)


async def _read_head(stream: trio.SocketStream) -> bytes:
    """What the client sent, up to the end of its head at least (the request line and
    headers); raises `_BadRequest` if the head is too long or cut short."""
    data = b""
    while not any(end in data for end in _ENDS_OF_HEAD):
        if len(data) >= MAX_REQUEST_BYTES:
            raise _BadRequest(
                "431 Request Header Fields Too Large",
                f"request too large: at most {MAX_REQUEST_BYTES} bytes of request line and headers",
            )
        chunk = await stream.receive_some(MAX_REQUEST_BYTES)
        if not chunk:
            raise _BadRequest("400 Bad Request", "bad request: it ended before its headers")
        data += chunk
    return data


async def _linger(stream: trio.SocketStream) -> None:
    """Say we are done, then read and drop what the client still sends, until it closes
    (or `LINGER_S` or `MAX_LINGER_BYTES` runs out)."""
    await stream.send_eof()
    dropped = 0
    with trio.move_on_after(LINGER_S):
        while dropped < MAX_LINGER_BYTES:
            chunk = await stream.receive_some(MAX_LINGER_BYTES)
            if not chunk:
                return
            dropped += len(chunk)


def _request_line(head: bytes) -> tuple[str, str]:
    """The method and target of an HTTP/1.x request line."""
    line = head.partition(b"\n")[0].rstrip(b"\r").decode("latin-1")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _BadRequest("400 Bad Request", f"bad request: expected `GET {METRICS_PATH} HTTP/1.1`")
    return parts[0], parts[1]


def _response(
    status: str,
    body: bytes | str,
    *,
    content_type: str = _TEXT,
    head_only: bool = False,
    extra: tuple[str, ...] = (),
) -> bytes:
    payload = body if isinstance(body, bytes) else (body + "\n").encode("utf-8", "backslashreplace")
    lines = [
        f"HTTP/1.1 {status}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(payload)}",
        "Connection: close",
        *extra,
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + payload
