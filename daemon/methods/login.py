"""`auth/login` and `auth/whoami`: authenticating a connection, as a person with `nc` would."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from conduit.core.errors import InvalidRequest
from conduit.daemon.dispatcher import CallContext, MethodRouter, NoParams, Params

router = MethodRouter()


class LoginParams(Params):
    token: str = Field(min_length=1, description="the master token or a client token")


@router.method("auth/login", params=LoginParams, scope=None)
async def login(params: LoginParams, ctx: CallContext) -> dict[str, Any]:
    """Authenticate this connection; later requests need no token."""
    if ctx.peer is None:
        raise InvalidRequest("auth/login authenticates a connection; there is none here")
    principal = ctx.peer.login(params.token)
    return {"principal": principal.describe()}


@router.method("auth/whoami", params=NoParams, scope=None, session=True)
async def whoami(params: NoParams, ctx: CallContext) -> dict[str, Any]:
    """Who this connection (or this request's bearer token) is authenticated as."""
    if ctx.principal is None:
        return {"authenticated": False, "principal": None}
    return {"authenticated": True, "principal": ctx.principal.describe()}
