"""A tool as `tools/list` describes it: one model for the daemon's listing and the
client's parsed view of it.

The daemon lists each tool a caller may use as `to_wire()`, an MCP `Tool` object with
Conduit's names under `_meta`; the client reads it back with `from_wire()`. What the
gateway knows beyond that (the upstream's own name for the tool, its namespace) stays
in the gateway. This module does no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Tool"]

# Where Conduit's names for a tool go in its MCP `_meta`: the SDK path and the upstream.
_PATH_META = "conduit/path"
_UPSTREAM_META = "conduit/upstream"


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool this caller may use, as `tools/list` describes it.

    `name` is the tool id (`<upstream>__<tool>`, or a built-in such as
    `execute_python`); `path` is its SDK name (`echo.add`) for upstream tools.
    """

    name: str
    description: str = ""
    input_schema: Mapping[str, Any] = field(default_factory=dict)
    output_schema: Mapping[str, Any] | None = None
    path: str | None = None
    upstream: str | None = None
    annotations: Mapping[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        """The MCP `Tool` object; an empty output schema or annotations are left out,
        and `_meta` only for a tool with Conduit's names (an upstream's)."""
        wire: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "inputSchema": dict(self.input_schema),
        }
        if self.path is not None or self.upstream is not None:
            wire["_meta"] = {_PATH_META: self.path, _UPSTREAM_META: self.upstream}
        if self.output_schema:
            wire["outputSchema"] = dict(self.output_schema)
        if self.annotations:
            wire["annotations"] = dict(self.annotations)
        return wire

    @classmethod
    def from_wire(cls, entry: Mapping[str, Any]) -> Tool:
        meta = entry.get("_meta") or {}
        return cls(
            name=str(entry["name"]),
            description=entry.get("description") or "",
            input_schema=entry.get("inputSchema") or {},
            output_schema=entry.get("outputSchema"),
            path=meta.get(_PATH_META),
            upstream=meta.get(_UPSTREAM_META),
            annotations=entry.get("annotations"),
        )
