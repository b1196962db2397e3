"""Every error Conduit raises, as one hierarchy users can catch.

```
ConduitError
├── RpcError(code, message, data)      the only errors that reach the wire
│   ├── ParseError -32700 · InvalidRequest -32600 (RequestCancelled) · MethodNotFound -32601
│   ├── InvalidParams -32602 · InternalError -32603 · Overloaded -32000 · NotFound -32001
│   ├── Unauthenticated -32002 · Forbidden -32003 (ToolLimitReached)
│   ├── StoreUnavailable -32004 · RateLimited -32005 · ExecutorUnavailable -32006
│   ├── UpstreamError -32007
│   └── compat only: LimitTimeout -32008 · LimitMemory -32009 · LimitOutput -32013
│                    · LimitLogLines -32014
├── ConfigError                        bad configuration; start-up or reload refuses it
├── ExecutorError                      internal: the runtime failed, not the program
│   ├── RuntimeMissing
│   └── SandboxCrashed
└── GatewayError                       internal
    ├── UpstreamUnreachable
    └── SchemaInvalid
```

Only the dispatcher turns exceptions into wire errors. A failing *program* is never an
exception: it is an execution result with a non-ok status.
"""

from __future__ import annotations

from typing import Any, ClassVar

from conduit.core.terminal import quoted

__all__ = [
    "ClientError",
    "ConduitError",
    "ConfigError",
    "ExecutorError",
    "ExecutorUnavailable",
    "Forbidden",
    "GatewayError",
    "InternalError",
    "InvalidParams",
    "InvalidRequest",
    "LimitLogLines",
    "LimitMemory",
    "LimitOutput",
    "LimitTimeout",
    "MethodNotFound",
    "NotFound",
    "Overloaded",
    "ParseError",
    "RateLimited",
    "RequestCancelled",
    "RpcError",
    "RuntimeMissing",
    "SandboxCrashed",
    "SchemaInvalid",
    "StoreUnavailable",
    "ToolLimitReached",
    "Unauthenticated",
    "UpstreamError",
    "UpstreamUnreachable",
]


class ConduitError(Exception):
    """Base of every error Conduit raises on purpose."""


class ClientError(ConduitError):
    """Raised by a client itself (`conduit.client`); the daemon never sends these."""


# JSON-RPC error codes as peers read them: 32-bit integers.
_WIRE_CODES = range(-(2**31), 2**31)


class RpcError(ConduitError):
    """An error that is answered on the wire as a JSON-RPC error object."""

    code: ClassVar[int] = -32603
    _by_code: ClassVar[dict[int, type[RpcError]]] = {}

    def __init__(self, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        RpcError._by_code.setdefault(cls.code, cls)

    def to_wire(self) -> dict[str, Any]:
        """The JSON-RPC `error` member for this error."""
        wire: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            wire["data"] = self.data
        return wire

    @classmethod
    def from_wire(cls, error: dict[str, Any]) -> RpcError:
        """Rebuild the most specific error class for a wire error object, whoever sent
        it: a code that is not a 32-bit integer (a bool, a string, 4,000 digits) is
        taken as an internal error's, and a message that is not text is made text."""
        code = error.get("code")
        if not isinstance(code, int) or isinstance(code, bool) or code not in _WIRE_CODES:
            code = InternalError.code
        klass = RpcError._by_code.get(code, RpcError)
        message = error.get("message")
        exc = klass("" if message is None else str(message), error.get("data"))
        if klass is RpcError:
            exc.code = code  # type: ignore[misc]  # an unknown code keeps its number
        return exc

    def __str__(self) -> str:
        # The message may be an upstream's or a program's: printed, it obeys no one.
        return quoted(self.message)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code}, message={self.message!r})"


class ParseError(RpcError):
    code = -32700


class InvalidRequest(RpcError):
    code = -32600


class RequestCancelled(InvalidRequest):
    """The answer to a request its client cancelled before it ran, or while it ran on
    a transport that must answer it (there is no better JSON-RPC code)."""

    def __init__(self) -> None:
        super().__init__("request cancelled: the client sent notifications/cancelled for it")


class MethodNotFound(RpcError):
    code = -32601


class InvalidParams(RpcError):
    code = -32602


class InternalError(RpcError):
    code = -32603


class Overloaded(RpcError):
    code = -32000


class NotFound(RpcError):
    code = -32001


class Unauthenticated(RpcError):
    code = -32002


class Forbidden(RpcError):
    code = -32003


class StoreUnavailable(RpcError):
    """A store the method reads (the audit store) is off or failing; executions still run."""

    code = -32004


class ToolLimitReached(Forbidden):
    """An execution's tool calls are spent: a limit it reached, not a policy it broke
    (so no `policy.violation` event; the execution ends with `tool_limit`)."""


class RateLimited(RpcError):
    code = -32005


class ExecutorUnavailable(RpcError):
    code = -32006


class UpstreamError(RpcError):
    code = -32007


class LimitTimeout(RpcError):
    """Compat aliases only: the seed Conduit reported limits as errors."""

    code = -32008


class LimitMemory(RpcError):
    code = -32009


class LimitOutput(RpcError):
    code = -32013


class LimitLogLines(RpcError):
    code = -32014


class ConfigError(ConduitError):
    """The configuration is invalid; the message names the key and what to do."""


class ExecutorError(ConduitError):
    """The runtime failed (not the program)."""


class RuntimeMissing(ExecutorError):
    """The runtime an executor needs is not installed or not usable."""


class SandboxCrashed(ExecutorError):
    """The sandbox died in a way the program cannot have caused on purpose."""


class GatewayError(ConduitError):
    """A fault in the tool gateway."""


class UpstreamUnreachable(GatewayError):
    """An upstream could not be reached or died."""


class SchemaInvalid(GatewayError):
    """An upstream gave a tool schema that is not valid JSON Schema."""
