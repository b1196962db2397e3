"""What an operator's methods may do to the daemon itself: reload it, and read its state.

`Control` is the shape `config/reload` and `daemon/status` need of the daemon, and no
more; the server fits it. This module imports nothing of the server's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from conduit.daemon.config import Config

__all__ = ["Control", "DaemonStatistics"]


@dataclass(frozen=True, slots=True)
class DaemonStatistics:
    """A snapshot of the daemon's own state, for `daemon/status`."""

    uptime_s: float
    config_source: str | None
    # Clients' connections; the sandboxes' (one per warm or running Deno or Pyodide
    # worker) apart, so a pool filling up does not look like clients arriving.
    connections: int
    sandbox_connections: int
    auth_failures: int
    metrics_enabled: bool
    # Where GET /metrics answers, or why it does not (None: it serves, or is off).
    metrics_url: str | None
    metrics_error: str | None
    # Where MCP over HTTP answers (None: off), and its sessions open now.
    mcp_http_url: str | None = None
    mcp_http_sessions: int = 0
    # Why the daemon should be sent no programs now (None: it should), and which
    # executors are still preparing (building, probing their runtime): while some are,
    # the reason may yet go away; once none are, it stays until an operator acts.
    unready_reason: str | None = None
    preparing: tuple[str, ...] = ()


class Control(Protocol):
    async def reload(self) -> Config:
        """Re-read the configuration and apply it; raises `ConfigError` (the old one
        stays) for a bad one."""
        ...

    def statistics(self) -> DaemonStatistics: ...
