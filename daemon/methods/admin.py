"""`config/reload` and `daemon/status`: operating the daemon over its own socket."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import trio

from conduit.core.errors import ConfigError, InvalidRequest
from conduit.core.version import VERSION
from conduit.daemon.dispatcher import CallContext, MethodRouter, NoParams

router = MethodRouter()


@router.method("config/reload", params=NoParams, scope="admin")
async def reload(params: NoParams, ctx: CallContext) -> dict[str, Any]:
    """Reload the config file (as SIGHUP does); a bad file is refused, the old one kept."""
    try:
        config = await ctx.daemon.reload()
    except ConfigError as exc:
        raise InvalidRequest(f"config not reloaded, the old one stays: {exc}") from None
    return {"reloaded": True, "source": config.source}


@router.method("daemon/status", params=NoParams, scope="admin")
async def status(params: NoParams, ctx: CallContext) -> dict[str, Any]:
    """Uptime, connections, executions, admission queue, audit store, metrics, config."""
    daemon = ctx.daemon
    admission = daemon.admission.statistics()
    return {
        "version": VERSION,
        "pid": os.getpid(),
        "uptime_s": round(trio.current_time() - daemon.started_at, 3),
        "config": daemon.config.source or None,
        # Clients' connections; the sandboxes' (one per warm or running Deno or Pyodide
        # worker) apart, so a pool filling up does not look like clients arriving.
        "connections": sum(c.transport != "sandbox" for c in daemon.connections),
        "sandbox_connections": sum(c.transport == "sandbox" for c in daemon.connections),
        "executions": {
            "running": admission.running,
            "queued": admission.waiting,
            "capacity": admission.capacity,
            "queue_size": admission.queue_size,
            "draining": daemon.executions.draining,
        },
        "auth_failures": daemon.auth_failures,
        "metrics": {
            "enabled": daemon.config.metrics.enabled,
            "url": daemon.metrics_url(),
            "error": daemon.metrics_error,
        },
        "audit": dataclasses.asdict(daemon.audit.statistics()),
    }
