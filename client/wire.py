"""The client's side of the wire: NDJSON lines in and out, JSON-RPC requests and replies.

Sans-I/O: the clients feed received bytes to a `LineBuffer` and hand each decoded
message to `classify`; they send what `encode_request` returns. Nothing here knows about
sockets, Trio or methods.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from conduit.client.errors import ConnectionLost, RpcError
from conduit.core.protocol import encode

__all__ = [
    "MAX_MESSAGE_BYTES",
    "LineBuffer",
    "Notification",
    "Reply",
    "classify",
    "encode_request",
    "reply_value",
]

log = logging.getLogger("conduit.client")

# The largest line the client accepts from the daemon. The daemon's default maxima allow
# 16 MiB of output and 16 MiB of result in one reply; JSON escaping can double that.
MAX_MESSAGE_BYTES = 128 * 1024 * 1024


_CR = ord("\r")
# What makes a line more than blank (as `bytes.strip` counts whitespace).
_NOT_BLANK = re.compile(rb"[^ \t\n\r\x0b\x0c]")


class LineBuffer:
    """Splits received bytes into lines; a blank line or a trailing `\\r` is dropped.

    A line longer than `max_line_bytes` raises `ConnectionLost`: the reply it carried
    cannot be routed, so the connection can no longer be trusted to pair replies up.
    """

    def __init__(self, max_line_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self._max = max_line_bytes
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        # Split only when a line ended: a large reply arrives in many chunks, and
        # re-scanning the whole buffer for each would be quadratic.
        lines = self._take_lines() if b"\n" in data else []
        if len(self._buffer) > self._max:
            raise ConnectionLost(
                f"the daemon sent a line over {self._max} bytes; raise the client's "
                "max_message_bytes or ask for less output (limits.output_bytes)"
            )
        return lines

    def _take_lines(self) -> list[bytes]:
        """The complete lines in the buffer, each copied once (a reply may carry
        megabytes of files), without the blank ones."""
        buffer = self._buffer
        view = memoryview(buffer)
        lines = []
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            stop = end
            while stop > start and buffer[stop - 1] == _CR:
                stop -= 1
            if _NOT_BLANK.search(buffer, start, stop) is not None:
                lines.append(bytes(view[start:stop]))
            start = end + 1
        view.release()
        del buffer[:start]
        return lines


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to one request: `message` holds `result` or `error`."""

    id: Any
    message: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Notification:
    """A message from the daemon that answers nothing (`execution/output`, `event`)."""

    method: str
    params: Mapping[str, Any]


def encode_request(ident: int, method: str, params: Mapping[str, Any] | None) -> bytes:
    """One request as a line, newline included."""
    message = {"jsonrpc": "2.0", "id": ident, "method": method, "params": dict(params or {})}
    return encode(message) + b"\n"


def classify(line: bytes) -> Reply | Notification | None:
    """What one line from the daemon is; None (logged) for a line that is neither."""
    try:
        message = json.loads(line)
    except ValueError:
        log.warning("the daemon sent a line that is not JSON; ignored", extra={"line": line[:200]})
        return None
    if not isinstance(message, dict):
        # The client never sends batches, so an array is not for it.
        log.warning("the daemon sent something other than an object; ignored")
        return None
    if isinstance(message.get("method"), str) and "id" not in message:
        params = message.get("params")
        return Notification(message["method"], params if isinstance(params, dict) else {})
    if "result" in message or "error" in message:
        ident = message.get("id")
        if isinstance(ident, bool) or not isinstance(ident, str | int | float | None):
            log.warning("the daemon answered with an id the client never sends; ignored")
            return None
        return Reply(ident, message)
    log.warning("the daemon sent a message that is neither reply nor notification; ignored")
    return None


def reply_value(reply: Reply) -> Any:
    """The reply's result, or its error raised as the `RpcError` subclass for its code."""
    error = reply.message.get("error")
    if error is not None:
        raise RpcError.from_wire(error if isinstance(error, dict) else {"message": str(error)})
    return reply.message.get("result")
