"""`config/reload` and `daemon/status`: operating the daemon over its own socket."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from conduit.core.errors import ConfigError, InvalidRequest
from conduit.core.version import VERSION
from conduit.daemon.dispatcher import CallContext, MethodRouter, NoParams

router = MethodRouter()


@router.method("config/reload", params=NoParams, scope="admin")
async def reload(params: NoParams, ctx: CallContext) -> dict[str, Any]:
    """Reload the config file (as SIGHUP does); a bad file is refused, the old one kept."""
    try:
        config = await ctx.control.reload()
    except ConfigError as exc:
        raise InvalidRequest(f"config not reloaded, the old one stays: {exc}") from None
    return {"reloaded": True, "source": config.source}


@router.method("daemon/status", params=NoParams, scope="admin")
async def status(params: NoParams, ctx: CallContext) -> dict[str, Any]:
    """Uptime, connections, executions, admission queue, readiness, sessions, audit, metrics.

    `ready` is what `GET /ready` answers, and which executors are still preparing.
    """
    daemon = ctx.control.statistics()
    admission = ctx.admission.statistics()
    return {
        "version": VERSION,
        "pid": os.getpid(),
        "uptime_s": round(daemon.uptime_s, 3),
        "config": daemon.config_source,
        "connections": daemon.connections,
        "sandbox_connections": daemon.sandbox_connections,
        "executions": {
            "running": admission.running,
            "queued": admission.waiting,
            "capacity": admission.capacity,
            "queue_size": admission.queue_size,
            # What a client needs to know how long an answer may take.
            "queue_timeout_s": ctx.executions.limits.queue_timeout_s,
            "default_timeout_ms": ctx.executions.limits.defaults.timeout_ms,
            "draining": ctx.executions.draining,
        },
        "sessions": {
            "live": len(ctx.sessions),
            "max_total": ctx.sessions.config.max_total,
            "max_per_principal": ctx.sessions.config.max_per_principal,
        },
        "ready": {
            "ok": daemon.unready_reason is None,
            "reason": daemon.unready_reason,
            "preparing": list(daemon.preparing),
        },
        "auth_failures": daemon.auth_failures,
        "metrics": {
            "enabled": daemon.metrics_enabled,
            "url": daemon.metrics_url,
            "error": daemon.metrics_error,
        },
        "mcp_http": {"url": daemon.mcp_http_url, "sessions": daemon.mcp_http_sessions},
        "audit": dataclasses.asdict(ctx.audit.statistics()),
    }
