"""A cap on the HTTP bodies the SDK reads whole from a streamable-HTTP upstream.

The SDK's client reads an `application/json` answer (the 2026-07-28 era always sends
one; the 2025 era may) with `response.aread()`, which has no bound: an upstream could
grow the daemon without limit. `BodyCap.watch`, a response hook on the connection's
httpx2 client, makes reading any such body fail once it passes `max_bytes`, with
`AnswerTooLarge`. What is counted is the decoded body, which is what the daemon would
hold: a compressed body is small on the wire.

`AnswerTooLarge` is an `httpx2.StreamError`, which the SDK catches where it reads a
body: it fails that request alone (with its own `PARSE_ERROR`) and the session goes
on. `BodyCap.answers` puts the keeper's `answer_too_large` in place of that error, as
the stdio transport answers a line past the same cap.

The SDK logs that error with a traceback at ERROR ("Error parsing JSON response"), as
for a body it could not parse: a filter on its logger drops that record for a body
this cap stopped, and the cap logs one warning line of its own instead.

SSE bodies (`text/event-stream`) are left alone: a stream of many messages that may
stay open for the session's life, whose events the SDK caps one by one.

This module knows HTTP and JSON-RPC ids, not MCP methods.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
from collections.abc import AsyncIterator, Callable

import httpx2
import mcp_types as types
from mcp.shared.message import SessionMessage

from conduit.gateway.keeper import ReadStream, ReadStreamWrapper, answer_too_large

__all__ = ["AnswerTooLarge", "BodyCap"]

log = logging.getLogger("conduit.gateway")
# Capped answers kept for the SDK's error of their request: one whose request was
# cancelled first never gets it, and is forgotten once this many came after it.
_MAX_TRIPPED = 256
# Where the SDK's streamable-HTTP client logs a body it failed to read.
_SDK_LOG = logging.getLogger("mcp.client.streamable_http")


class AnswerTooLarge(httpx2.StreamError):
    """A body that passed the cap; `error` is what the request it answered gets."""

    def __init__(self, error: types.ErrorData) -> None:
        super().__init__(error.message)
        self.error = error


class BodyCap:
    """The cap for one connection's client: `watch` is its response hook, and
    `answers` wraps the transport's read stream."""

    def __init__(self, max_bytes: int) -> None:
        _SDK_LOG.addFilter(_CAPPED_QUIETLY)  # once: the same filter is not added twice
        self._max = max_bytes
        # What each request whose answer passed the cap gets, by its JSON-RPC id,
        # until the SDK's own error for it comes by `answers`.
        self._tripped: dict[types.RequestId, types.ErrorData] = {}

    async def watch(self, response: httpx2.Response) -> None:
        """Cap `response`'s body, unless it is an SSE stream."""
        content_type = response.headers.get("content-type", "")
        if content_type.lower().startswith("text/event-stream"):
            return
        encodings = response.headers.get_list("content-encoding")
        if encodings:  # the capped stream decodes, so httpx2 must not decode again
            del response.headers["content-encoding"]
        declared = None if encodings else _declared_size(response.headers)
        encoded = httpx2.Response(
            response.status_code,
            headers=[("content-encoding", encoding) for encoding in encodings],
            stream=response.stream,
            request=response.request,
        )
        response.stream = _CappedBody(encoded, declared, self._max, self._trip(response.request))

    def answers(self, inner: ReadStream[SessionMessage | Exception]) -> _Answers:
        """`inner` with the SDK's error for each request whose answer passed the cap
        replaced by `answer_too_large`."""
        return _Answers(inner, self._tripped)

    def _trip(self, request: httpx2.Request) -> Callable[[types.ErrorData], None]:
        def tripped(error: types.ErrorData) -> None:
            log.warning(
                "an upstream's answer was dropped: %s",
                error.message,
                extra={"url": str(request.url.copy_with(query=None))},
            )
            request_id = _request_id(request)
            if request_id is not None:
                self._tripped[request_id] = error
                if len(self._tripped) > _MAX_TRIPPED:  # the oldest's error never came
                    del self._tripped[next(iter(self._tripped))]

        return tripped


class _CappedQuietly(logging.Filter):
    """Drops the SDK's record of a body this cap stopped (`AnswerTooLarge`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        raised = record.exc_info[1] if record.exc_info else None
        return not isinstance(raised, AnswerTooLarge)


_CAPPED_QUIETLY = _CappedQuietly()


class _CappedBody(httpx2.AsyncByteStream):
    """A response's body, decoded, that fails past `max_bytes` (or at once, when its
    Content-Length says it will) rather than hand on more."""

    def __init__(
        self,
        encoded: httpx2.Response,
        declared: int | None,
        max_bytes: int,
        tripped: Callable[[types.ErrorData], None],
    ) -> None:
        self._encoded = encoded
        self._declared = declared
        self._max = max_bytes
        self._tripped = tripped

    @property
    def elapsed(self) -> datetime.timedelta | None:
        # `Response.elapsed` reads it from the stream httpx2 gave the response.
        return getattr(self._encoded.stream, "elapsed", None)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._declared is not None and self._declared > self._max:
            raise self._too_large(self._declared)
        size = 0
        async with contextlib.aclosing(self._encoded.aiter_bytes()) as parts:
            async for part in parts:
                size += len(part)
                if size > self._max:
                    raise self._too_large(None)
                yield part

    async def aclose(self) -> None:
        # An unfinished body closes its connection rather than return it to the pool.
        await self._encoded.aclose()

    def _too_large(self, size_bytes: int | None) -> AnswerTooLarge:
        error = answer_too_large(size_bytes, self._max)
        self._tripped(error)
        return AnswerTooLarge(error)


def _declared_size(headers: httpx2.Headers) -> int | None:
    try:
        return int(headers["content-length"])
    except (KeyError, ValueError):
        return None


def _request_id(request: httpx2.Request) -> types.RequestId | None:
    """The id of the JSON-RPC request `request` carried, if it carried one (the SDK
    POSTs one message per HTTP request; its GET and DELETE carry none)."""
    try:
        message = json.loads(request.content)
    except (httpx2.RequestNotRead, ValueError):
        return None
    if not isinstance(message, dict) or "method" not in message:
        return None
    request_id = message.get("id")
    if isinstance(request_id, bool) or not isinstance(request_id, int | str):
        return None
    return request_id


class _Answers(ReadStreamWrapper):
    """The transport's read stream, with the SDK's error for a request whose answer
    passed the cap replaced by the one `BodyCap` recorded for it."""

    def __init__(
        self,
        inner: ReadStream[SessionMessage | Exception],
        tripped: dict[types.RequestId, types.ErrorData],
    ) -> None:
        self._inner = inner
        self._tripped = tripped

    async def receive(self) -> SessionMessage | Exception:
        item = await self._inner.receive()
        if not (isinstance(item, SessionMessage) and isinstance(item.message, types.JSONRPCError)):
            return item
        error = self._tripped.pop(item.message.id, None)
        if error is None:
            return item
        reply = types.JSONRPCError(jsonrpc="2.0", id=item.message.id, error=error)
        return SessionMessage(reply, metadata=item.metadata)
