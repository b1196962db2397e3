"""Typed views of what the daemon answers: execution results, output, events, tools.

Each is a frozen dataclass built by `from_wire(...)` from the JSON the daemon sends
(`ExecutionResult`, `ProgramError`, `Event` and `Tool` are the daemon's own, from
`conduit.core`, one model for both ends). A result's `raw` keeps that JSON whole, so a
field a newer daemon adds is never lost. Fields follow the wire names in snake_case.
This module does no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from conduit.core.events import Event
from conduit.core.results import STATUSES, ExecutionResult, ProgramError
from conduit.core.tools import Tool

__all__ = [
    "STATUSES",
    "Event",
    "ExecutionResult",
    "OutputChunk",
    "ProgramError",
    "SessionInfo",
    "Tool",
    "ToolResult",
    "ToolSchema",
]


@dataclass(frozen=True, slots=True)
class OutputChunk:
    """A piece of a running program's output (`execution/output`), in `seq` order."""

    execution_id: str
    stream: str  # "stdout" or "stderr"
    text: str
    seq: int

    @classmethod
    def from_wire(cls, params: Mapping[str, Any]) -> OutputChunk:
        return cls(
            execution_id=str(params.get("execution_id", "")),
            stream=str(params.get("stream", "stdout")),
            text=str(params.get("text", "")),
            seq=int(params.get("seq") or 0),
        )


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A live session (`sessions/create`, `sessions/list`): a sandbox kept across steps."""

    session_id: str
    language: str
    executor: str
    name: str | None = None
    idle_timeout_s: float = 0.0
    steps: int = 0
    resets: int = 0
    # Whether `sessions/create` made it now (False: a session by that name was there).
    created: bool = True
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> SessionInfo:
        name = wire.get("name")
        return cls(
            session_id=str(wire.get("session_id", "")),
            language=str(wire.get("language", "")),
            executor=str(wire.get("executor", "")),
            name=None if name is None else str(name),
            idle_timeout_s=float(wire.get("idle_timeout_s") or 0.0),
            steps=int(wire.get("steps") or 0),
            resets=int(wire.get("resets") or 0),
            created=bool(wire.get("created", True)),
            raw=dict(wire),
        )


@dataclass(frozen=True, slots=True)
class ToolSchema:
    """One tool's schemas and any problems found in them (`tools/schema`)."""

    id: str
    path: str
    upstream: str
    description: str
    input_schema: Mapping[str, Any] | None
    output_schema: Mapping[str, Any] | None
    strict: bool
    schema_problems: tuple[str, ...]

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> ToolSchema:
        return cls(
            id=str(wire["id"]),
            path=str(wire.get("path", "")),
            upstream=str(wire.get("upstream", "")),
            description=wire.get("description") or "",
            input_schema=wire.get("inputSchema"),
            output_schema=wire.get("outputSchema"),
            strict=bool(wire.get("strict", False)),
            schema_problems=tuple(str(p) for p in wire.get("schemaProblems") or ()),
        )


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool answered (`tools/call`): MCP content, structured content, and whether
    the tool reported an error. A failing tool is a result, as a failing program is."""

    content: tuple[Mapping[str, Any], ...] = ()
    structured: Any = None
    is_error: bool = False

    @property
    def text(self) -> str:
        """The text parts of `content`, joined by newlines."""
        return "\n".join(
            str(part.get("text", "")) for part in self.content if part.get("type") == "text"
        )

    @property
    def value(self) -> Any:
        """The structured content if any, else the text parsed as JSON, else the text."""
        if self.structured is not None:
            return self.structured
        try:
            return json.loads(self.text)
        except ValueError:
            return self.text

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> ToolResult:
        return cls(
            content=tuple(wire.get("content") or ()),
            structured=wire.get("structuredContent"),
            is_error=bool(wire.get("isError", False)),
        )
