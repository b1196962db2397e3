"""Plain data the gateway hands around: tools, tool results, upstream states.

No behaviour here; every other gateway module and the daemon's tool methods speak in
these types. A tool as callers see it listed is `conduit.core.tools.Tool`
(`UpstreamTool.listed()`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from conduit.core.tools import Tool

__all__ = ["UpstreamState", "UpstreamStatus", "UpstreamTool"]


@dataclass(frozen=True, slots=True)
class UpstreamTool:
    """One tool an upstream offers, under the names Conduit gives it.

    `id` is `<upstream>__<name>` (the wire id); `namespace` and `sdk_name` are valid
    identifiers in every guest language, so the SDK calls it as
    `tools.<namespace>.<sdk_name>(args)`; `path` is `<namespace>.<sdk_name>`, what
    allowlists match.
    """

    id: str
    upstream: str
    name: str
    namespace: str
    sdk_name: str
    description: str = ""
    input_schema: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    output_schema: dict[str, Any] | None = None
    annotations: dict[str, Any] | None = None

    @property
    def path(self) -> str:
        return f"{self.namespace}.{self.sdk_name}"

    def listed(self) -> Tool:
        """This tool as `tools/list` describes it: by id, with its path and upstream."""
        return Tool(
            name=self.id,
            description=self.description,
            # MCP requires an object schema; a tool that takes nothing still declares one.
            input_schema=self.input_schema or {"type": "object"},
            output_schema=self.output_schema,
            path=self.path,
            upstream=self.upstream,
            annotations=self.annotations,
        )


class UpstreamState(enum.StrEnum):
    """An upstream's lifecycle, as `upstreams/list` shows it."""

    STARTING = "starting"
    READY = "ready"
    BACKING_OFF = "backing_off"  # crashed or unreachable; retrying after a delay
    FAILED = "failed"  # gave up (configuration error), until reconfigured
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class UpstreamStatus:
    """A snapshot of one upstream for `upstreams/list`."""

    name: str
    transport: str  # "stdio" or "http"
    state: UpstreamState
    tools: int
    last_error: str | None = None
    restarts: int = 0
    protocol_version: str | None = None
    server_info: dict[str, Any] | None = None
