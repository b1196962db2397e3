"""The API both clients offer, as data: which method, which params, how to read the result.

`AsyncClient` and `Client` differ only in how they wait; each public method of theirs
builds a `Call` here and runs it. Whether a call may be retried after a lost connection
is decided here too (`Call.idempotent`): reads may, `execute` and `tools/call` never.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from conduit.client.results import ExecutionResult, SessionInfo, Tool, ToolResult, ToolSchema
from conduit.core import b64

__all__ = [
    "IDEMPOTENT_METHODS",
    "Call",
    "authenticated",
    "call_tool",
    "cancel",
    "close_session",
    "create_session",
    "effective_timeout_s",
    "execute",
    "list_sessions",
    "list_tools",
    "login",
    "ping",
    "raw",
    "sdk",
    "subscribe",
    "tool_schema",
    "whoami",
]

T = TypeVar("T")

# Methods that only read: sending one twice does no harm, so a call lost with its
# connection is sent once more on a new one. Anything else (execute, tools/call,
# upstreams/register, ...) may already have run and is never resent.
IDEMPOTENT_METHODS = frozenset(
    {
        "ping",
        "auth/whoami",
        "rpc/discover",
        "tools/list",
        "tools/schema",
        "tools/validate",
        "tools/packages",
        "tools/stubs",
        "sdk/get",
        "executors/list",
        "executions/running",
        "sessions/list",
        "upstreams/list",
        "daemon/status",
    }
)

# Added to an execution's own time limit for the client's wait: an execution may sit in
# the daemon's admission queue for up to `limits.queue_timeout_s` (30 s by default)
# before it starts.
EXECUTE_MARGIN_S = 30.0
# The daemon's default `limits.defaults.timeout_ms`, for an execute that names none.
DEFAULT_EXECUTION_TIMEOUT_S = 10.0


def _identity(value: Any) -> Any:
    return value


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request to make and how to read its result."""

    method: str
    params: Mapping[str, Any] = field(default_factory=dict)
    parse: Callable[[Any], T] = _identity
    # The least time worth waiting for this call (an execution's own limit plus queueing);
    # a client's default timeout is raised to it, an explicit timeout_s is not.
    min_timeout_s: float | None = None

    @property
    def idempotent(self) -> bool:
        return self.method in IDEMPOTENT_METHODS


def effective_timeout_s(
    call: Call[Any], explicit_s: float | None, default_s: float | None, *, given: bool
) -> float | None:
    """How long to wait for `call`: `explicit_s` if the caller passed one (`given`, None
    meaning no limit), else the client's default raised to the call's own minimum."""
    if given:
        return explicit_s
    if default_s is None or call.min_timeout_s is None:
        return default_s
    return max(default_s, call.min_timeout_s)


def raw(method: str, params: Mapping[str, Any] | None) -> Call[Any]:
    return Call(method, dict(params or {}))


def ping() -> Call[None]:
    return Call("ping", parse=lambda _: None)


def login(token: str) -> Call[dict[str, Any]]:
    return Call("auth/login", {"token": token}, parse=lambda result: result["principal"])


def authenticated() -> Call[bool]:
    """Whether the connection is let in already (by peer credentials, or a login)."""
    return Call(
        "auth/whoami",
        parse=lambda result: isinstance(result, dict) and result.get("authenticated") is True,
    )


def whoami() -> Call[dict[str, Any] | None]:
    return Call("auth/whoami", parse=lambda result: result.get("principal"))


def execute(
    code: str,
    *,
    language: str | None,
    executor: str | None = None,
    limits: Mapping[str, int] | None = None,
    allowed_tools: Iterable[str] | None = None,
    inputs: Any = None,
    stream: bool = False,
    session_id: str | None = None,
    files: Mapping[str, bytes | str] | None = None,
) -> Call[ExecutionResult]:
    """`execute`; with `session_id`, as that session's next step (its language).
    `files` maps working-directory paths to contents: text as is, bytes as base64."""
    params: dict[str, Any] = {"code": code}
    if language is not None:
        params["language"] = language
    if session_id is not None:
        params["session_id"] = session_id
    if executor is not None:
        params["executor"] = executor
    if limits:
        params["limits"] = dict(limits)
    if allowed_tools is not None:
        params["allowed_tools"] = list(allowed_tools)
    if inputs is not None:
        params["inputs"] = inputs
    if stream:
        params["stream"] = True
    if files:
        params["files"] = [_file_param(path, data) for path, data in files.items()]
    timeout_ms = (limits or {}).get("timeout_ms")
    own_s = timeout_ms / 1000 if timeout_ms else DEFAULT_EXECUTION_TIMEOUT_S
    return Call("execute", params, ExecutionResult.from_wire, own_s + EXECUTE_MARGIN_S)


def _file_param(path: str, data: bytes | str) -> dict[str, str]:
    if isinstance(data, str):
        return {"path": path, "text": data}
    return {"path": path, "base64": b64.encode(data)}


def create_session(
    language: str,
    *,
    executor: str | None = None,
    limits: Mapping[str, int] | None = None,
    idle_timeout_s: float | None = None,
    name: str | None = None,
) -> Call[SessionInfo]:
    params: dict[str, Any] = {"language": language}
    if executor is not None:
        params["executor"] = executor
    if limits:
        params["limits"] = dict(limits)
    if idle_timeout_s is not None:
        params["idle_timeout_s"] = idle_timeout_s
    if name is not None:
        params["name"] = name
    return Call("sessions/create", params, SessionInfo.from_wire)


def close_session(session_id: str) -> Call[None]:
    return Call("sessions/close", {"session_id": session_id}, parse=lambda result: None)


def list_sessions() -> Call[list[SessionInfo]]:
    return Call(
        "sessions/list",
        parse=lambda result: [SessionInfo.from_wire(s) for s in result["sessions"]],
    )


def cancel(*, execution_id: str | None = None, request_id: Any = None) -> Call[str]:
    params = {"execution_id": execution_id} if execution_id else {"request_id": request_id}
    return Call("executions/cancel", params, parse=lambda result: result["execution_id"])


def list_tools() -> Call[list[Tool]]:
    return Call("tools/list", parse=lambda result: [Tool.from_wire(t) for t in result["tools"]])


def tool_schema(name: str) -> Call[ToolSchema]:
    return Call("tools/schema", {"name": name}, ToolSchema.from_wire)


def sdk(
    language: str, *, allowed_tools: Iterable[str] | None = None, namespace: str | None = None
) -> Call[str]:
    params: dict[str, Any] = {"language": language}
    if allowed_tools is not None:
        params["allowed_tools"] = list(allowed_tools)
    if namespace is not None:
        params["namespace"] = namespace
    return Call("sdk/get", params, parse=lambda result: result["declarations"])


def call_tool(name: str, arguments: Mapping[str, Any] | None = None) -> Call[ToolResult]:
    return Call(
        "tools/call", {"name": name, "arguments": dict(arguments or {})}, ToolResult.from_wire
    )


def subscribe(types: Iterable[str] | None = None) -> Call[str]:
    params = {"types": list(types)} if types is not None else {}
    return Call("events/subscribe", params, parse=lambda result: result["subscription"])
