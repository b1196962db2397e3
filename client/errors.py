"""What the client raises: the daemon's own error classes, and a few of the client's.

```
ConduitError
├── RpcError(code, message, data)   the daemon's answer to a request, by code
│   ├── ParseError -32700 · InvalidRequest -32600 · MethodNotFound -32601
│   ├── InvalidParams -32602 · InternalError -32603 · Overloaded -32000 · NotFound -32001
│   └── Unauthenticated -32002 · Forbidden -32003 · RateLimited -32005
│       · ExecutorUnavailable -32006 · UpstreamError -32007
└── ClientError                      raised by the client itself, never sent
    ├── TransportError
    │   ├── ConnectionFailed         the daemon could not be reached (after retries)
    │   └── ConnectionLost           the connection dropped while a call was in flight
    ├── Timeout                      no answer within timeout_s; the connection stays usable
    ├── ProgramFailed                raise_for_status() on a result whose status is not ok
    └── SubscriptionDropped          the daemon (or this client) dropped a slow subscriber
```

The `RpcError` classes are the daemon's (`conduit.core.errors`), re-exported here, so
`except Unauthenticated` catches the same class whichever side raised it. A failing
*program* is not an exception: it is an `ExecutionResult` with a non-ok status, which
`raise_for_status()` turns into `ProgramFailed` for those who want one.

A program's error and a subscription's drop reason are written by someone else, and an
exception's message ends up in terminals and logs: `str()` of `ProgramFailed` and
`SubscriptionDropped` shows that text bounded, with control characters, bidi controls
and lone surrogates escaped (`\\x1b`, `\\n`). The exact text stays on the exception
(`result.error.message`, `reason`).
"""

from __future__ import annotations

from conduit.core.errors import (
    ClientError,
    ConduitError,
    ExecutorUnavailable,
    Forbidden,
    InternalError,
    InvalidParams,
    InvalidRequest,
    MethodNotFound,
    NotFound,
    Overloaded,
    ParseError,
    RateLimited,
    RpcError,
    Unauthenticated,
    UpstreamError,
)
from conduit.core.results import ProgramFailed
from conduit.core.terminal import quoted

__all__ = [
    "ClientError",
    "ConduitError",
    "ConnectionFailed",
    "ConnectionLost",
    "ExecutorUnavailable",
    "Forbidden",
    "InternalError",
    "InvalidParams",
    "InvalidRequest",
    "MethodNotFound",
    "NotFound",
    "Overloaded",
    "ParseError",
    "ProgramFailed",
    "RateLimited",
    "RpcError",
    "SubscriptionDropped",
    "Timeout",
    "TransportError",
    "Unauthenticated",
    "UpstreamError",
]


class TransportError(ClientError):
    """The connection to the daemon failed."""


class ConnectionFailed(TransportError, ConnectionError):
    """The daemon could not be reached; the message says where the client looked."""

    @classmethod
    def after(cls, where: object, attempts: int, last: BaseException) -> ConnectionFailed:
        tries = "" if attempts == 1 else f" after {attempts} attempts"
        return cls(
            f"cannot reach the daemon at {where}{tries}: {last}; is `conduit serve` running?"
        )


class ConnectionLost(TransportError, ConnectionError):
    """The connection dropped while this call was in flight.

    Whether the daemon ran the call is unknown: a lost `execute` may have run. The client
    never retries such a call by itself; the next call reconnects.
    """


class Timeout(ClientError, TimeoutError):
    """No answer within `timeout_s`. The connection stays usable; a late answer is dropped.

    An `execute` that times out on the client side is also cancelled on the daemon.
    """

    @classmethod
    def after(cls, method: str, timeout_s: float | None) -> Timeout:
        within = "in the time allowed" if timeout_s is None else f"within {timeout_s:g} s"
        return cls(
            f"{method}: no answer {within}; the connection is still usable. "
            "Pass a larger timeout_s (None waits as long as it takes)"
        )


class SubscriptionDropped(ClientError):
    """An event subscription ended because its reader fell behind; the message says why.

    `reason` is the daemon's reason as sent; the message quotes it escaped and bounded.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(quoted(reason))
        self.reason = reason
