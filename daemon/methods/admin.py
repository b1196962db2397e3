"""`config/reload`: re-read the configuration without dropping connections."""

from __future__ import annotations

from typing import Any

from conduit.daemon.dispatcher import CallContext, NoParams, method
from conduit.daemon.errors import ConfigError, InvalidRequest


@method("config/reload", params=NoParams, scope="admin")
async def reload(params: NoParams, ctx: CallContext) -> dict[str, Any]:
    """Reload the config file (as SIGHUP does); a bad file is refused, the old one kept."""
    try:
        config = await ctx.daemon.reload()
    except ConfigError as exc:
        raise InvalidRequest(f"config not reloaded, the old one stays: {exc}") from None
    return {"reloaded": True, "source": config.source}
