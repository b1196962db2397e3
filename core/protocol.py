"""JSON-RPC 2.0 messages: turning decoded JSON into requests, and results into replies.

Knows nothing about streams or methods. Deliberately lenient in one way: a request
without `"jsonrpc"` is accepted, so a person typing into `nc` need not type it; a wrong
version is refused.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from conduit.core import jsontext
from conduit.core.errors import InvalidRequest, ParseError, RpcError

__all__ = [
    "Request",
    "decode",
    "encode",
    "error_reply",
    "is_response",
    "parse_request",
    "result_reply",
    "skipped_response_id",
    "unreadable_id",
]


@dataclass(frozen=True, slots=True)
class Request:
    """One call. `is_notification` requests are never answered."""

    method: str
    params: dict[str, Any]
    id: str | int | float | None
    is_notification: bool
    bearer_token: str | None = None


def decode(line: bytes) -> Any:
    """Parse one line of JSON, or raise `ParseError` saying where it broke.

    Lone surrogates come back replaced; NaN, Infinity and numbers past a float's range,
    or integers past Python's digit limit, are parse errors (see `jsontext`).
    """
    try:
        return jsontext.loads(line)
    except jsontext.JsonTextError as exc:
        raise ParseError(
            f"parse error: {exc}; send one JSON object per line, "
            'e.g. {"jsonrpc":"2.0","id":1,"method":"ping"}'
        ) from None


def encode(message: Any) -> bytes:
    """Serialise a reply compactly as valid UTF-8 JSON, whatever it holds."""
    return jsontext.encode(message)


def _bearer(message: dict[str, Any]) -> str | None:
    auth = message.get("auth")
    if auth is None:
        return None
    token = auth.get("bearerToken") if isinstance(auth, dict) else None
    if not isinstance(token, str):
        raise InvalidRequest('"auth" must be an object like {"bearerToken": "<token>"}')
    return token


def _is_id(value: Any) -> bool:
    """A string or a finite number: what an id can be and come back as JSON."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return False
    return not isinstance(value, float) or math.isfinite(value)


def request_id(message: Any) -> str | int | float | None:
    """The id to answer a broken request with: its own if readable, else null."""
    if isinstance(message, dict):
        value = message.get("id")
        if _is_id(value):
            return value
    return None


def unreadable_id(line: bytes) -> str | int | float | None:
    """The id of a line `decode` refused, where it can still be read: the error then
    goes to the request that made it, whose sender (a sandbox's tool call) would
    otherwise wait for an answer that names no request.

    Readable where the line is an object, whole (it ends as one), and its id comes
    within its first `_ID_SCAN_CHARS`, after nothing but members with a string or
    number value (as `"jsonrpc"` is): what comes after the id is not read, so it may
    be what kept the line from being read (a number past Python's digit limit, `NaN`,
    values nested deeper than the decoder goes). Otherwise (a line cut short, not
    UTF-8, with no such id): None.
    """
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not text.rstrip().endswith("}"):
        return None
    found = _LEADING_ID.match(text, 0, _ID_SCAN_CHARS)
    return None if found is None else _id_value(found.group(1))


def skipped_response_id(opening: bytes, ending: bytes) -> str | int | float | None:
    """The id of a response too long to read, known only by its first and last bytes:
    the request it answers can then be failed, rather than wait for an answer that was
    skipped.

    Read where the line ends as an object and is evidently a response, its id among
    its opening members followed by `"result"` or `"error"` (`{"jsonrpc":"2.0","id":7,
    "result":…`, as the Python SDK writes) or its last member after an opening
    `"result"` or `"error"` (`{"result":…,"jsonrpc":"2.0","id":7}`, as the TypeScript
    SDK writes); what comes between is not looked at. Otherwise (a request or a
    notification, an id elsewhere, an id at each end and the two differ): None.
    """
    head = opening[:_ID_SCAN_CHARS].decode("utf-8", "replace")
    tail = ending.decode("utf-8", "replace")
    if not tail.rstrip().endswith("}"):
        return None
    first = _LEADING_RESPONSE_ID.match(head)
    last = _TRAILING_ID.search(tail)
    if first is None and not _RESPONSE_START.match(head):
        return None
    ids = {_id_value(found.group(1)) for found in (first, last) if found is not None}
    return ids.pop() if len(ids) == 1 else None


def _id_value(value: str) -> str | int | float | None:
    """An id as a line's text has it (a string or a number), or None for anything else."""
    if value.startswith('"'):
        try:
            return request_id({"id": jsontext.loads(value)})
        except jsontext.JsonTextError:  # an escape JSON does not have
            return None
    # `true`, `null` or junk is no id (and `int` would read `1_000` or other scripts' digits).
    return _short_number(value) if _NUMBER.fullmatch(value) else None


def _short_number(text: str) -> int | float | None:
    """A number of a line read only for its id: converted if short, else skipped."""
    if len(text) > _ID_DIGITS:
        return None
    number = float(text) if any(c in text for c in ".eE") else int(text)
    return number if math.isfinite(number) else None


# A number id of more digits is not converted (an id this long is not one we sent).
_ID_DIGITS = 64
_STRING = r'"(?:[^"\\]|\\.)*"'
_SCALAR = rf'(?:{_STRING}|[^\s\[\]{{}},:"]+)'
# Where a request's id is (after "jsonrpc", before "method"); a longer search would let
# one refused line hold the event loop up (a backtracking search of megabytes takes seconds).
_ID_SCAN_CHARS = 4096
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
# An object's opening members, each a string key and a scalar value, up to its "id".
_OPENING_TO_ID = rf'\s*\{{(?:\s*{_STRING}\s*:\s*{_SCALAR}\s*,)*?\s*"id"\s*:\s*({_SCALAR})'
# ...the id whole: followed by the next member or the end of the object.
_LEADING_ID = re.compile(rf"{_OPENING_TO_ID}(?=\s*[,}}])", re.DOTALL)
# ...a response's: followed by its "result" or "error".
_LEADING_RESPONSE_ID = re.compile(rf'{_OPENING_TO_ID}\s*,\s*"(?:result|error)"\s*:', re.DOTALL)
# A response that opens with its "result" or "error", and its "id" as its last member.
_RESPONSE_START = re.compile(r'\s*\{\s*"(?:result|error)"\s*:')
_TRAILING_ID = re.compile(rf',\s*"id"\s*:\s*({_SCALAR})\s*\}}\s*\Z')


def is_response(message: Any) -> bool:
    """Whether `message` answers a request (a result or an error, with an id) rather
    than being one: what a client sends back for a server-to-client request."""
    return (
        isinstance(message, dict)
        and "method" not in message
        and "id" in message
        and ("result" in message or "error" in message)
    )


def parse_request(message: Any) -> Request:
    """Validate one decoded message as a JSON-RPC request; raise `InvalidRequest`."""
    if not isinstance(message, dict):
        raise InvalidRequest("invalid request: each message must be a JSON object")
    version = message.get("jsonrpc", "2.0")
    if version != "2.0":
        raise InvalidRequest(f'invalid request: "jsonrpc" must be "2.0", not {version!r}')
    method = message.get("method")
    if not isinstance(method, str) or not method:
        raise InvalidRequest('invalid request: "method" must be a non-empty string')
    is_notification = "id" not in message
    ident = message.get("id")
    if not is_notification and ident is not None and not _is_id(ident):
        raise InvalidRequest('invalid request: "id" must be a string, a number or null')
    params = message.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise InvalidRequest(
            'invalid request: "params" must be an object (named parameters); '
            "rpc/discover lists each method's parameters"
        )
    return Request(method, params, ident, is_notification, _bearer(message))


def result_reply(ident: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "result": result}


def error_reply(ident: Any, error: RpcError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "error": error.to_wire()}
