"""What the daemon remembers of an execution once it has ended: plain data, no behaviour.

`ExecutionRecord` is built once per execution by `Executions` and handed, through the
event bus, to everything that keeps account of executions: the audit store, the metrics
and live subscribers. It holds sizes and bounded heads of the program's output, never
the whole of it, and never a token.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "INTERRUPTED",
    "RECORD_STATUSES",
    "RUNNING",
    "ExecutionRecord",
    "FileRecord",
    "SessionRecord",
    "ToolCallRecord",
    "code_digest",
    "head",
]

# A leading snippet of the code, and of the result and each output stream: enough to
# recognise a program in a listing without the store growing with every flood.
SNIPPET_CHARS = 200
HEAD_CHARS = 256


# What the store holds besides how executions end: `running` from an execution's start
# until its end is written, and `interrupted` for one whose daemon died before that.
RUNNING = "running"
INTERRUPTED = "interrupted"
RECORD_STATUSES = (RUNNING, INTERRUPTED)


def code_digest(code: str) -> str:
    """The program's sha256, hex: how executions of one program are found again."""
    # Lone surrogates (legal in a JSON string) are hashed as the bytes they would be.
    return hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()


def head(text: str, limit: int = HEAD_CHARS) -> str:
    """The first `limit` characters of `text`."""
    return text[:limit]


@dataclass(frozen=True, slots=True)
class ToolCallRecord:
    """One tool call a program made: the tool's id (or the name as called, when it was
    refused before it could be resolved), how long it took, how it ended.

    `outcome` is `ok`, `error` (the tool answered with an error), or the wire error's
    name when the daemon refused or failed the call (`forbidden`, `not_found`, ...).
    """

    tool: str
    duration_ms: float
    outcome: str


@dataclass(frozen=True, slots=True)
class FileRecord:
    """A file an execution was given or gave back: its path and size, not its bytes."""

    path: str
    size: int


@dataclass(frozen=True, slots=True)
class ExecutionRecord:
    """One ended execution, as the audit store keeps it and events report it."""

    execution_id: str
    principal: str
    executor: str
    language: str
    code_sha256: str
    code_bytes: int
    code_snippet: str
    allowed_tools: tuple[str, ...]
    status: str
    started_at: float  # Unix time
    queue_ms: float
    duration_ms: float
    exit_code: int | None = None
    error_type: str | None = None
    error_message: str | None = None
    # Which limit stopped it (timeout, memory, output, tool_calls), if one did.
    limit_hit: str | None = None
    # Which policy rule refused it before it ran (`python.forbidden_import`), if one did.
    policy_rule: str | None = None
    result_bytes: int = 0
    result_head: str = ""
    stdout_bytes: int = 0
    stdout_head: str = ""
    stderr_bytes: int = 0
    stderr_head: str = ""
    memory_peak_bytes: int | None = None
    tool_calls: tuple[ToolCallRecord, ...] = field(default=())
    # The session it ran in, if it was a session's step.
    session_id: str | None = None
    # The files it was given and gave back, by path and size (never their contents).
    files_in: tuple[FileRecord, ...] = ()
    files_out: tuple[FileRecord, ...] = ()
    # The daemon that ran it (`audit.daemon_id`): stores may be shared. Empty until the
    # store stamps it with its own.
    daemon_id: str = ""

    def to_wire(self) -> dict[str, Any]:
        """The record as JSON-ready data (tool calls as objects)."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """A session's life as the audit store keeps it: one row, written when the session
    is created and again, complete, when it ends."""

    session_id: str
    principal: str
    executor: str
    language: str
    created_at: float  # Unix time
    ended_at: float | None = None
    # Why it ended (closed, expired, daemon_stopped); None while it lives.
    end_reason: str | None = None
    steps: int = 0
    resets: int = 0

    def to_wire(self) -> dict[str, Any]:
        """The record as JSON-ready data."""
        return asdict(self)
