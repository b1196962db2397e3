"""The method table and the one place exceptions become wire errors.

Each API module declares its handlers on a `MethodRouter` (`@router.method(name,
params=Model, scope=...)`); a daemon builds its own `MethodTable` from the routers, so
two daemons in one process have two tables, and a name registered twice fails when the
table is built. `dispatch` validates params (a failure is -32602 naming the field),
checks the caller's scope, runs the handler and maps anything unexpected to -32603 with
an error id that is also logged. Every refusal (`Forbidden`) is also published as a
`policy.violation` event. It is deliberately not about streams or framing.

A handler gets a `CallContext`: who calls, the caller's connection as a `Peer` (the
little of it a handler may touch), and the daemon's parts it may use, each by name.
Nothing here imports the server or the connection; they fit these shapes, so imports
point down.
"""

from __future__ import annotations

import difflib
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import trio
from pydantic import BaseModel, ConfigDict, ValidationError

from conduit.core.errors import (
    Forbidden,
    InternalError,
    InvalidParams,
    MethodNotFound,
    RpcError,
    ToolLimitReached,
    Unauthenticated,
)
from conduit.daemon.events import BusEvent, EventType

if TYPE_CHECKING:
    from conduit.daemon.audit import AuditStore
    from conduit.daemon.auth import Principal
    from conduit.daemon.control import Control
    from conduit.daemon.events import EventBus
    from conduit.daemon.executions import Executions
    from conduit.daemon.limits import Admission
    from conduit.daemon.sessions import NamedSessions, Sessions
    from conduit.daemon.tool_access import ToolAccess

__all__ = [
    "ANSWERED",
    "CANCELLED",
    "CallContext",
    "Dispatcher",
    "MethodRouter",
    "MethodSpec",
    "MethodTable",
    "NoParams",
    "Params",
    "Peer",
    "invalid_params",
]

log = logging.getLogger("conduit.dispatcher")

# How a call ended when not with an `RpcError` (whose code says it), for the metrics.
ANSWERED = "ok"
CANCELLED = "cancelled"


class Params(BaseModel):
    """Base of every params model: unknown members are errors, not silently dropped."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NoParams(Params):
    pass


class Peer(Protocol):
    """What a handler may use of the caller's connection (a `Connection`)."""

    # Set by `initialize`: the peer is an MCP client, and hears MCP notifications.
    mcp_session: bool
    # Its event subscriptions, by id (`events/subscribe`).
    subscriptions: dict[str, trio.CancelScope]
    # The sessions its MCP tool calls named.
    named_sessions: NamedSessions
    # Set by `logging/setLevel`: the least severe MCP log level it hears (None: none).
    log_level: str | None
    # Set by `initialize`: the server-to-client requests it answers (`ask`), by method,
    # each with the sub-capabilities it declared (`client_asks.declared_answers`).
    answers: dict[str, frozenset[str]]

    def login(self, token: str) -> Principal: ...

    async def notify(
        self, method: str, params: dict[str, Any], *, request_id: Any = None
    ) -> None: ...

    async def ask(
        self, method: str, params: dict[str, Any], *, request_id: Any = None
    ) -> dict[str, Any]: ...

    def start_stream(self, stream: Callable[[], Awaitable[object]]) -> None: ...

    def at_close(self, callback: Callable[[], Awaitable[object]]) -> None: ...


@dataclass(slots=True)
class CallContext:
    """What a handler may know about its call and use of the daemon."""

    principal: Principal | None
    methods: MethodTable
    executions: Executions
    tools: ToolAccess
    events: EventBus
    audit: AuditStore
    admission: Admission
    control: Control
    sessions: Sessions
    # None for calls from inside the process (a sandbox's, through its bridge).
    peer: Peer | None = None
    request_id: Any = None

    def require_principal(self) -> Principal:
        if self.principal is None:
            raise Unauthenticated(_LOGIN_HINT)
        return self.principal


Handler = Callable[[Any, CallContext], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class MethodSpec:
    name: str
    handler: Handler
    params: type[Params]
    # None: anyone may call it, authenticated or not.
    scope: str | None
    # Session tokens (sandboxes) may call only methods that say so.
    session: bool
    description: str


_LOGIN_HINT = (
    'unauthenticated: call auth/login with {"token": "..."} first, or add '
    '"auth": {"bearerToken": "..."} to the request'
)


class MethodRouter:
    """Handlers one module declares, for a `MethodTable` to include."""

    def __init__(self) -> None:
        self.specs: list[MethodSpec] = []

    def method(
        self,
        name: str,
        *,
        params: type[Params] = NoParams,
        scope: str | None,
        session: bool = False,
        description: str | None = None,
    ) -> Callable[[Handler], Handler]:
        """Declare `handler` under the wire name `name`; its docstring's first line is
        its description unless `description` is given."""

        def declare(handler: Handler) -> Handler:
            doc = description or (handler.__doc__ or "").strip().partition("\n")[0]
            if not doc:
                raise RuntimeError(f"method {name!r} needs a docstring: rpc/discover shows it")
            self.specs.append(MethodSpec(name, handler, params, scope, session, doc))
            return handler

        return declare


class MethodTable:
    """A daemon's methods by wire name."""

    def __init__(self, *routers: MethodRouter) -> None:
        self._specs: dict[str, MethodSpec] = {}
        for router in routers:
            self.add(*router.specs)

    def add(self, *specs: MethodSpec) -> None:
        """Add each of `specs`; a name that is already there is an error."""
        for spec in specs:
            if spec.name in self._specs:
                raise RuntimeError(f"method {spec.name!r} is registered twice")
            self._specs[spec.name] = spec

    def get(self, name: str) -> MethodSpec | None:
        return self._specs.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __getitem__(self, name: str) -> MethodSpec:
        return self._specs[name]

    def specs(self) -> list[MethodSpec]:
        """Every method, by name."""
        return sorted(self._specs.values(), key=lambda spec: spec.name)

    def names(self) -> list[str]:
        return sorted(self._specs)


def _unknown_method(name: str, table: MethodTable) -> MethodNotFound:
    close = difflib.get_close_matches(name, table.names(), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return MethodNotFound(
        f"method not found: {name!r}{hint} (rpc/discover lists every method)",
        {"method": name},
    )


def invalid_params(exc: ValidationError, method_name: str) -> InvalidParams:
    """-32602 naming the first failing field, in the caller's own dotted terms."""
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or "params"
    if first["type"] == "extra_forbidden":
        reason = "is not a parameter of this method"
    elif first["type"] == "missing":
        reason = "is required"
    else:
        reason = first["msg"]
    return InvalidParams(
        f"invalid params for {method_name}: {field} {reason} (rpc/discover shows the schema)",
        {"field": field, "reason": reason},
    )


def _authorise(spec: MethodSpec, principal: Principal | None) -> None:
    if spec.scope is None:
        return
    if principal is None:
        raise Unauthenticated(_LOGIN_HINT)
    if principal.kind == "session" and not spec.session:
        raise Forbidden(
            f"forbidden: a sandbox's session token cannot call {spec.name}",
            {"method": spec.name},
        )
    if spec.scope not in principal.scopes:
        raise Forbidden(
            f"forbidden: {spec.name} needs the {spec.scope!r} scope, which "
            f"{principal.name} does not have",
            {"method": spec.name, "scope": spec.scope},
        )


def _access_rule(refusal: Forbidden) -> str:
    """Which access rule refused a call, named like the pre-execution policy's rules so
    one `policy.violation` subscriber reads both: `access.scope`, `access.tools`, or
    `access.method` (a method a sandbox may not call)."""
    data = refusal.data if isinstance(refusal.data, dict) else {}
    if data.get("tool"):
        return "access.tools"
    if data.get("scope"):
        return "access.scope"
    return "access.method"


def _violation(name: str, refusal: Forbidden, ctx: CallContext) -> BusEvent:
    """A `policy.violation` event for a refused call, owned by whoever answers for the
    caller: a sandbox's refusals are its execution owner's to see."""
    principal = ctx.principal
    data: dict[str, Any] = {
        "principal": principal.name if principal else None,
        "rule": _access_rule(refusal),
        "method": name,
        "reason": refusal.message,
    }
    owner = data["principal"]
    if principal is not None and principal.execution_id is not None:
        data["execution_id"] = principal.execution_id
        owner = ctx.executions.owner(principal.execution_id) or owner
    if isinstance(refusal.data, dict) and refusal.data.get("tool"):
        data["tool"] = refusal.data["tool"]
    return BusEvent(EventType.POLICY_VIOLATION, data, owner)


class Dispatcher:
    """One daemon's dispatch: its method table, and what its handlers may use.

    `dispatch` runs one call and raises only `RpcError`; every call, and every message
    refused before it named a method (`refused`), is counted by `count_request`.
    """

    def __init__(
        self,
        methods: MethodTable,
        *,
        executions: Executions,
        tools: ToolAccess,
        events: EventBus,
        audit: AuditStore,
        admission: Admission,
        control: Control,
        sessions: Sessions,
        count_request: Callable[[str | None, int | str], None],
    ) -> None:
        self.methods = methods
        self._executions = executions
        self._tools = tools
        self._events = events
        self._audit = audit
        self._admission = admission
        self._control = control
        self._sessions = sessions
        self._count_request = count_request

    async def dispatch(
        self,
        name: str,
        raw_params: dict[str, Any],
        *,
        principal: Principal | None,
        peer: Peer | None = None,
        request_id: Any = None,
    ) -> Any:
        """Run method `name` for `principal` and return its JSON-ready result; raise
        only `RpcError` (or `Cancelled`)."""
        ctx = CallContext(
            principal,
            self.methods,
            self._executions,
            self._tools,
            self._events,
            self._audit,
            self._admission,
            self._control,
            self._sessions,
            peer,
            request_id,
        )
        outcome: int | str = ANSWERED
        if name == "tools/call" and principal is not None and principal.kind == "session":
            # Counted whatever becomes of it: the daemon waits for the calls a sandbox
            # wrote before it answered to be read (`Executions.call_arrived`).
            self._executions.call_arrived(principal.execution_id)
        try:
            return await _call(name, raw_params, ctx)
        except RpcError as exc:
            outcome = exc.code
            raise
        except BaseException:
            outcome = CANCELLED
            raise
        finally:
            self._count_request(name, outcome)

    def refused(self, name: str | None, error: RpcError) -> None:
        """Count a message refused before dispatch (`name`: None if it named none)."""
        self._count_request(name, error.code)


async def _call(name: str, raw_params: dict[str, Any], ctx: CallContext) -> Any:
    try:
        spec = ctx.methods.get(name)
        if spec is None:
            raise _unknown_method(name, ctx.methods)
        _authorise(spec, ctx.principal)
        try:
            params = spec.params.model_validate(raw_params)
        except ValidationError as exc:
            raise invalid_params(exc, name) from None
        result = await spec.handler(params, ctx)
        return result.model_dump(mode="json") if isinstance(result, BaseModel) else result
    except Forbidden as exc:
        if not isinstance(exc, ToolLimitReached):
            ctx.events.publish(_violation(name, exc, ctx))
        raise
    except (RpcError, trio.Cancelled):
        raise
    except ExceptionGroup as group:
        # A handler's nursery wraps what its body raised: a lone error the client
        # should hear (the executor is busy, say) is still that error.
        lone = _lone_error(group)
        if isinstance(lone, RpcError):
            raise lone from None
        raise _internal_error(name) from group
    except Exception as exc:
        raise _internal_error(name) from exc


def _lone_error(group: BaseExceptionGroup) -> BaseException:
    """The one exception a group of one (however nested) holds, else the group."""
    found: BaseException = group
    while isinstance(found, BaseExceptionGroup) and len(found.exceptions) == 1:
        found = found.exceptions[0]
    return found


def _internal_error(name: str) -> InternalError:
    """Log the exception being handled, under an id the client's answer names."""
    error_id = secrets.token_hex(6)
    log.exception("internal error in %s", name, extra={"error_id": error_id})
    return InternalError(
        f"internal error (id {error_id}); the daemon's log has the details",
        {"error_id": error_id},
    )
