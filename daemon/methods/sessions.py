"""`sessions/create`, `sessions/list` and `sessions/close`: sandboxes kept across
executions (see `daemon/sessions.py`). Steps run with `execute {session_id, code}`.

A principal sees and closes only its own sessions; to anyone else a session does not
exist (`-32001`, as for an id never made).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from conduit.daemon.dispatcher import CallContext, MethodRouter, NoParams, Params
from conduit.daemon.methods.executions import Language, LimitParams, language_name

router = MethodRouter()

__all__ = ["CloseParams", "CreateParams"]


class CreateParams(Params):
    language: Language = Field(
        description="python, typescript or javascript (py, ts, js also accepted)"
    )
    executor: str | None = Field(None, description="override the language's default executor")
    limits: LimitParams | None = Field(
        None,
        description="each step's limits unless the step sets its own; memory_mb bounds "
        "the session across all its steps",
    )
    idle_timeout_s: float | None = Field(
        None, gt=0, description="end the session after this long unused (default 600)"
    )
    name: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_.:@-]+$",
        description="a name of yours for it: creating a session by a name you already "
        "have answers that session (created: false)",
    )

    _language = field_validator("language", mode="before")(language_name)


@router.method("sessions/create", params=CreateParams, scope="execute")
async def create(params: CreateParams, ctx: CallContext) -> dict[str, Any]:
    """Open a session: a sandbox whose variables, functions, imports and files last
    from one execution to the next, until it is closed or idle too long."""
    session, created = await ctx.sessions.create(
        ctx.require_principal().name,
        params.language,
        executor=params.executor,
        limits=params.limits.overrides() if params.limits else None,
        idle_timeout_s=params.idle_timeout_s,
        name=params.name,
    )
    return {**session.to_wire(), "created": created}


@router.method("sessions/list", params=NoParams, scope="execute")
async def list_sessions(params: NoParams, ctx: CallContext) -> dict[str, Any]:
    """Your live sessions, oldest first."""
    principal = ctx.require_principal()
    return {"sessions": [session.to_wire() for session in ctx.sessions.of(principal.name)]}


class CloseParams(Params):
    session_id: str = Field(max_length=64, description="as sessions/create answered")


@router.method("sessions/close", params=CloseParams, scope="execute")
async def close(params: CloseParams, ctx: CallContext) -> dict[str, Any]:
    """End a session and free its sandbox; a step under way is stopped."""
    await ctx.sessions.close(ctx.require_principal().name, params.session_id)
    return {"closed": True, "session_id": params.session_id}
