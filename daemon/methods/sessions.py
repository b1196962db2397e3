"""`sessions/create`, `sessions/list` and `sessions/close`: sandboxes kept across
executions (see `daemon/sessions.py`). Steps run with `execute {session_id, code}`.

A principal sees and closes only its own sessions; to anyone else a session does not
exist (`-32001`, as for an id never made).
"""

from __future__ import annotations

import contextlib
from functools import partial
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

from conduit.core.errors import InvalidParams, NotFound
from conduit.daemon.dispatcher import CallContext, MethodRouter, NoParams, Params
from conduit.daemon.methods.executions import Language, LimitParams, language_name

if TYPE_CHECKING:
    from conduit.daemon.sessions import LiveSession, NamedSessions, Sessions

router = MethodRouter()

__all__ = ["CloseParams", "CreateParams", "connection_session"]

# A session name an MCP tool call may give: short, printable, the model's own choice.
MAX_NAME_CHARS = 64


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
    """Open a session: what one step defines is there for the next (see execute).

    A session lasts until closed, idle past its timeout, or the daemon stops."""
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


# ---- sessions an MCP connection names -------------------------------------------------


async def connection_session(ctx: CallContext, name: str, language: str) -> LiveSession:
    """The session the caller's connection knows by `name`, opened now if it has none
    (or its session ended): `execute_*`'s `session` argument. The connection ends its
    sessions when it closes; like any of the principal's sessions, they are listed by
    `sessions/list` on its other connections."""
    peer = ctx.peer
    if peer is None:
        raise InvalidParams(
            "invalid params: session needs a connection to keep it on",
            {"field": "session", "reason": "no connection"},
        )
    if not name or len(name) > MAX_NAME_CHARS:
        raise InvalidParams(
            f"invalid params: session must be 1 to {MAX_NAME_CHARS} characters",
            {"field": "session", "reason": "empty or too long"},
        )
    principal = ctx.require_principal().name
    named = peer.named_sessions
    async with named.lock:
        session = _known(ctx.sessions, principal, named, name)
        if session is None:
            session, _ = await ctx.sessions.create(principal, language)
            named.ids[name] = session.session_id
            if not named.closing:
                named.closing = True
                peer.at_close(partial(_close_named, ctx.sessions, principal, named))
    if session.language != language:
        raise InvalidParams(
            f"invalid params: session {name!r} runs {session.language}; use another name "
            f"for {language}",
            {"field": "session", "reason": "in use for another language"},
        )
    return session


def _known(
    sessions: Sessions, principal: str, named: NamedSessions, name: str
) -> LiveSession | None:
    """The live session `name` stands for, forgetting it if it has ended."""
    known = named.ids.get(name)
    if known is None:
        return None
    try:
        return sessions.get(principal, known)
    except NotFound:
        del named.ids[name]  # expired: a fresh one under the same name
        return None


async def _close_named(sessions: Sessions, principal: str, named: NamedSessions) -> None:
    for session_id in named.ids.values():
        with contextlib.suppress(NotFound):  # expired or closed already
            await sessions.close(principal, session_id)
