"""`upstreams/list` and `upstreams/register`: the gateway's upstream MCP servers."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from pydantic import Field, TypeAdapter, ValidationError

from conduit.daemon.dispatcher import CallContext, MethodRouter, NoParams, Params, invalid_params
from conduit.daemon.tool_access import gateway_errors, hides_catalogue
from conduit.daemon.wiring import build_upstream
from conduit.gateway.settings import UpstreamSettings

router = MethodRouter()

_SETTINGS = TypeAdapter(UpstreamSettings)


@router.method("upstreams/list", params=NoParams, scope="tools")
async def list_upstreams(params: NoParams, ctx: CallContext) -> dict[str, Any]:
    """Each upstream: transport, state (ready, backing off, ...), tools, last error.

    A caller that may not learn which tools exist (`hides_catalogue`) sees only the
    upstreams with a tool it may call, and counts only those tools.
    """
    statuses = ctx.tools.catalogue.statuses()
    principal = ctx.require_principal()
    if hides_catalogue(principal):
        callable_tools = Counter(tool.upstream for tool in ctx.tools.visible(principal))
        statuses = [
            dataclasses.replace(status, tools=callable_tools[status.name])
            for status in statuses
            if callable_tools[status.name]
        ]
    return {"upstreams": [dataclasses.asdict(status) for status in statuses]}


class RegisterParams(Params):
    upstream: dict[str, Any] = Field(
        description="one [[upstreams]] entry as JSON: name, transport, command/url, ..."
    )


@router.method("upstreams/register", params=RegisterParams, scope="admin")
async def register(params: RegisterParams, ctx: CallContext) -> dict[str, Any]:
    """Add an upstream while the daemon runs (lost on restart: put it in conduit.toml)."""
    try:
        settings = _SETTINGS.validate_python(params.upstream)
    except ValidationError as exc:
        raise invalid_params(exc, "upstreams/register") from None
    with gateway_errors(settings.name):
        await ctx.tools.catalogue.register(build_upstream(settings))
    return {"registered": settings.name}
