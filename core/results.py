"""An execution's result: one model for the wire, the MCP tools' output schema, the
client's parsed result and the audit record.

The daemon builds an `ExecutionResult` when an execution ends and sends `to_wire()`;
the client reads it back with `from_wire()`, leniently (a field a newer daemon adds is
kept in `raw`, one it leaves out takes its default); `json_schema()` describes the
wire form, field by field from the same dataclasses. This module does no I/O.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from conduit.core.errors import ClientError
from conduit.core.files import ReturnedFile
from conduit.core.terminal import quoted

__all__ = [
    "ANY_JSON",
    "STATUSES",
    "ExecutionResult",
    "ProgramError",
    "ProgramFailed",
    "Status",
    "Truncated",
]


class Status(enum.StrEnum):
    """How an execution ended. Every limit has its own status."""

    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    MEMORY_LIMIT = "memory_limit"
    # Its working directory's files took more than `limits.disk_mb`.
    DISK_LIMIT = "disk_limit"
    OUTPUT_LIMIT = "output_limit"
    TOOL_LIMIT = "tool_limit"
    CANCELLED = "cancelled"
    CRASHED = "crashed"
    # Never run: the daemon's pre-execution policy refused the program's text.
    REFUSED = "refused"


# Only "ok" is success; partial output is kept whatever the status.
STATUSES = tuple(str(status) for status in Status)
# Schema keywords of a field that counts something (a field's metadata joins its schema).
_COUNT = {"minimum": 0}


@dataclass(frozen=True, slots=True)
class ProgramError:
    """Why a program failed: the exception it raised, or the limit it hit. A program
    the policy refused (status `refused`) also has the rule and where it matched."""

    type: str
    message: str
    traceback: str = ""
    rule: str | None = None
    line: int | None = None
    column: int | None = None
    snippet: str | None = None

    def to_wire(self) -> dict[str, Any]:
        wire = {"type": self.type, "message": self.message, "traceback": self.traceback}
        if self.rule is not None:
            wire |= {"rule": self.rule, "line": self.line, "column": self.column}
            wire["snippet"] = self.snippet
        return wire

    @classmethod
    def from_wire(cls, error: Mapping[str, Any] | None) -> ProgramError | None:
        if not error:
            return None
        return cls(
            type=str(error.get("type", "")),
            message=str(error.get("message", "")),
            traceback=str(error.get("traceback") or ""),
            rule=error.get("rule"),
            line=error.get("line"),
            column=error.get("column"),
            snippet=error.get("snippet"),
        )


@dataclass(frozen=True, slots=True)
class Truncated:
    """Whether a limit cut each stream short."""

    stdout: bool = False
    stderr: bool = False


@dataclass(frozen=True, slots=True)
class ExecutionResult:
    """How one execution ended. `status` is one of `STATUSES`; `ok` means "ok".

    A non-ok result is still a result (the request itself succeeded): output, the error
    and timings are all here. `raise_for_status()` raises `ProgramFailed` for it.
    """

    execution_id: str
    status: str
    result: Any = None
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    error: ProgramError | None = None
    truncated: Truncated = Truncated()
    tool_calls: int = field(default=0, metadata=_COUNT)
    duration_ms: float = field(default=0.0, metadata=_COUNT)
    queue_ms: float = field(default=0.0, metadata=_COUNT)
    executor: str = ""
    memory_peak_bytes: int | None = None
    # The session it ran in (None: a fresh sandbox), and whether that session's sandbox
    # was started afresh after it (its state lost): a timeout, a crash, the memory cap.
    session_id: str | None = None
    session_reset: bool = False
    # What the program left under `out/`, in path order (see `core.files`).
    files: tuple[ReturnedFile, ...] = ()
    # The wire object as received (`from_wire`), members this version does not know
    # included; empty for a result built here.
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.status == Status.OK

    @property
    def truncated_stdout(self) -> bool:
        return self.truncated.stdout

    @property
    def truncated_stderr(self) -> bool:
        return self.truncated.stderr

    def raise_for_status(self) -> ExecutionResult:
        """Return this result if it is ok; else raise `ProgramFailed` carrying it."""
        if not self.ok:
            raise ProgramFailed(self)
        return self

    def to_wire(self) -> dict[str, Any]:
        """The JSON object `execute` answers with (and MCP's `structuredContent`)."""
        wire = {name: getattr(self, name) for name in _WIRE_FIELDS}
        wire["error"] = None if self.error is None else self.error.to_wire()
        wire["truncated"] = {"stdout": self.truncated.stdout, "stderr": self.truncated.stderr}
        wire["files"] = [file.to_wire() for file in self.files]
        return wire

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> ExecutionResult:
        truncated = wire.get("truncated") or {}
        return cls(
            execution_id=str(wire.get("execution_id", "")),
            status=str(wire.get("status", "")),
            result=wire.get("result"),
            stdout=wire.get("stdout") or "",
            stderr=wire.get("stderr") or "",
            exit_code=wire.get("exit_code"),
            error=ProgramError.from_wire(wire.get("error")),
            truncated=Truncated(
                stdout=bool(truncated.get("stdout", False)),
                stderr=bool(truncated.get("stderr", False)),
            ),
            tool_calls=int(wire.get("tool_calls") or 0),
            duration_ms=float(wire.get("duration_ms") or 0.0),
            queue_ms=float(wire.get("queue_ms") or 0.0),
            executor=str(wire.get("executor", "")),
            memory_peak_bytes=wire.get("memory_peak_bytes"),
            session_id=None if wire.get("session_id") is None else str(wire["session_id"]),
            session_reset=bool(wire.get("session_reset", False)),
            files=_files_from_wire(wire.get("files")),
            raw=dict(wire),
        )

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        """The JSON Schema of `to_wire()`'s object. Every member is always sent, so all
        are required; others are allowed, so a result that gains a member validates."""
        schema = _object_schema(cls)
        schema["properties"]["status"]["enum"] = list(STATUSES)
        schema["properties"]["result"]["description"] = "the program's result"
        return schema


def _count(value: Any) -> int:
    """A count from the wire, 0 for anything that is not one."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _files_from_wire(files: Any) -> tuple[ReturnedFile, ...]:
    """The result's files, leniently: an entry that is not an object is skipped."""
    if not isinstance(files, list):
        return ()
    return tuple(
        ReturnedFile(
            path=str(file.get("path", "")),
            size=_count(file.get("size")),
            mime=str(file.get("mime", "application/octet-stream")),
            base64=None if file.get("base64") is None else str(file["base64"]),
            truncated=bool(file.get("truncated", False)),
        )
        for file in files
        if isinstance(file, dict)
    )


class ProgramFailed(ClientError):
    """The program ended with a non-ok status; `result` is its whole `ExecutionResult`.

    The message quotes the program's error type and message escaped and bounded
    (`terminal.quoted`); `result.error` holds them as the program wrote them.
    """

    def __init__(self, result: ExecutionResult) -> None:
        error = result.error
        detail = f": {quoted(error.type)}: {quoted(error.message)}" if error is not None else ""
        super().__init__(f"the program ended with status {quoted(result.status)}{detail}")
        self.result = result


_WIRE_FIELDS = tuple(f.name for f in dataclasses.fields(ExecutionResult) if f.name != "raw")
_SCALARS = {str: "string", bool: "boolean", int: "integer", float: "number"}
# "Any JSON value" spelled out type by type: a schema with no keyword at all means the
# same, but clients that map schemas onto a one-type dialect (Gemini's) cannot read it.
ANY_JSON: tuple[dict[str, str], ...] = tuple(
    {"type": kind} for kind in ("object", "array", "string", "number", "boolean", "null")
)


def _object_schema(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.name != "raw"]
    return {
        "type": "object",
        "properties": {f.name: _schema(hints[f.name]) | dict(f.metadata) for f in fields},
        "required": [f.name for f in fields],
    }


def _schema(hint: Any) -> dict[str, Any]:
    """The JSON Schema of a field typed `hint`: a scalar, one of these dataclasses,
    either of them or None, or Any (any JSON value)."""
    if hint is Any:
        return {"anyOf": [dict(kind) for kind in ANY_JSON]}
    if isinstance(hint, types.UnionType):
        (inner,) = (arg for arg in typing.get_args(hint) if arg is not type(None))
        return {"anyOf": [_schema(inner), {"type": "null"}]}
    if typing.get_origin(hint) is tuple:
        item, _ = typing.get_args(hint)
        return {"type": "array", "items": _schema(item)}
    if dataclasses.is_dataclass(hint):
        schema = _object_schema(hint)
        optional = [
            f.name for f in dataclasses.fields(hint) if f.default is not dataclasses.MISSING
        ]
        schema["required"] = [name for name in schema["required"] if name not in optional]
        return schema
    return {"type": _SCALARS[hint]}
