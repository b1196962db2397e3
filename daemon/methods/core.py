"""`initialize`, `notifications/initialized`, `notifications/cancelled`, `ping`,
`logging/setLevel`, `rpc/discover`.

What `initialize` states is what is implemented: tools, whose list changing is announced
with `notifications/tools/list_changed` (see `Daemon._tools_changed`), and logging
(`notifications/message`, see `mcp_notifications`). No prompts, resources or completions.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, StrictInt, StrictStr

from conduit.core.errors import NotFound
from conduit.core.version import VERSION
from conduit.daemon.client_asks import declared_answers
from conduit.daemon.dispatcher import CallContext, MethodRouter, Params
from conduit.daemon.methods.executions import origin_of

router = MethodRouter()

__all__ = ["PROTOCOL_VERSIONS"]

# Newest first; a client asking for one of these gets it, anything else gets the newest.
PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")

INSTRUCTIONS = (
    "Conduit runs programs in fresh sandboxes. Call execute (or the execute_* tools) "
    "with a language and code; the result carries status, result, stdout and stderr."
)


class InitializeParams(Params):
    # MCP clients send more than we read; what we do not know we ignore here.
    model_config = ConfigDict(extra="allow", frozen=True)
    protocolVersion: str = PROTOCOL_VERSIONS[0]
    capabilities: dict[str, Any] = Field(default_factory=dict)
    clientInfo: dict[str, Any] = Field(default_factory=dict)


@router.method("initialize", params=InitializeParams, scope=None)
async def initialize(params: InitializeParams, ctx: CallContext) -> dict[str, Any]:
    """Start an MCP session: negotiate the protocol version and state capabilities."""
    version = params.protocolVersion
    if version not in PROTOCOL_VERSIONS:
        version = PROTOCOL_VERSIONS[0]
    if ctx.peer is not None:
        ctx.peer.mcp_session = True
        ctx.peer.answers = declared_answers(params.capabilities)
    return {
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": True}, "logging": {}},
        "serverInfo": {"name": "conduit", "version": VERSION},
        "instructions": INSTRUCTIONS,
    }


class AnyParams(Params):
    model_config = ConfigDict(extra="allow", frozen=True)


# A `notifications/...` method may be served by the connection's reader itself (while
# every slot is taken, `Connection._tell`): it must never wait on its peer.
@router.method("notifications/initialized", params=AnyParams, scope=None)
async def initialized(params: AnyParams, ctx: CallContext) -> None:
    """The client's acknowledgement of `initialize`; nothing to answer."""


class CancelledParams(Params):
    model_config = ConfigDict(extra="allow", frozen=True)
    # Strict: `true` or `1.0` names no request (lax, they would name request 1).
    requestId: StrictStr | StrictInt = Field(description="the id of the request to stop")
    reason: str | None = None


@router.method("notifications/cancelled", params=CancelledParams, scope=None)
async def cancelled(params: CancelledParams, ctx: CallContext) -> None:
    """MCP's cancellation of an earlier request on this connection: stops its program."""
    if ctx.principal is None or ctx.peer is None:
        return
    try:
        # A program stops with its output so far, and its call answers `cancelled`.
        ctx.executions.cancel(ctx.principal, origin=origin_of(ctx, params.requestId))
    except NotFound:
        # No program: the transport stops the request itself if it can (HTTP: any of
        # them; a socket's or stdio's: one still waiting for a slot); otherwise it
        # finished already, or has nothing to stop.
        cancel_request = getattr(ctx.peer, "cancel_request", None)
        if cancel_request is not None:
            cancel_request(params.requestId)


class SetLevelParams(Params):
    model_config = ConfigDict(extra="allow", frozen=True)
    level: Literal["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]


@router.method("logging/setLevel", params=SetLevelParams, scope=None)
async def set_level(params: SetLevelParams, ctx: CallContext) -> dict[str, Any]:
    """MCP logging: hear `notifications/message` at this level and more severe ones."""
    if ctx.peer is not None:
        ctx.peer.log_level = params.level
    return {}


@router.method("ping", params=AnyParams, scope=None, session=True)
async def ping(params: AnyParams, ctx: CallContext) -> dict[str, Any]:
    """Check the daemon is alive; answers an empty object."""
    return {}


@router.method("rpc/discover", scope=None)
async def discover(params: Params, ctx: CallContext) -> dict[str, Any]:
    """Every method with its description, required scope and params schema."""
    from conduit.daemon.methods.compat import ALIASES

    return {
        "version": VERSION,
        "methods": [
            {
                "name": spec.name,
                "description": spec.description,
                "scope": spec.scope,
                "session": spec.session,
                "params": spec.params.model_json_schema(),
            }
            for spec in ctx.methods.specs()
            if spec.name not in ALIASES
        ],
        "aliases": {name: alias.describe() for name, alias in sorted(ALIASES.items())},
    }
