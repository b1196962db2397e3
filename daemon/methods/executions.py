"""`execute`, `executions/cancel`, `executions/running`, and the audit store's
`executions/list`, `executions/get` and `executions/stats`.

A principal sees only its own executions; the master (the `admin` scope) sees all.
"""

from __future__ import annotations

import time
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from conduit.core import b64
from conduit.core.errors import Forbidden, InvalidParams, NotFound
from conduit.core.files import MAX_FILES, FileData, checked_path
from conduit.daemon.audit import AuditState, ExecutionQuery
from conduit.daemon.dispatcher import CallContext, MethodRouter, NoParams, Params
from conduit.daemon.executions import ExecutionRequest
from conduit.daemon.records import RECORD_STATUSES
from conduit.executors.base import Status

router = MethodRouter()

if TYPE_CHECKING:
    from conduit.daemon.dispatcher import Peer
    from conduit.daemon.sessions import LiveSession

__all__ = [
    "ExecuteParams",
    "ExecutionListParams",
    "FileParam",
    "GetParams",
    "LimitParams",
    "StatsParams",
    "checked_files",
    "language_name",
    "origin_of",
]

# A day: enough executions for percentiles to mean something, recent enough to act on.
DEFAULT_STATS_WINDOW_S = 86_400.0
# A page of 50 fits a terminal and an agent's context; 1000 bounds one reply's size.
DEFAULT_PAGE = 50
MAX_PAGE = 1000

# What people and models write for the three languages.
LANGUAGE_NAMES = {
    "python": "python",
    "py": "python",
    "typescript": "typescript",
    "ts": "typescript",
    "javascript": "javascript",
    "js": "javascript",
}


Language = Literal["python", "typescript", "javascript"]


def language_name(cls: type, value: Any) -> Any:
    """The canonical name for what was written (`py` → `python`)."""
    return LANGUAGE_NAMES.get(value.lower(), value) if isinstance(value, str) else value


class LimitParams(Params):
    """Per-execution limits; each is capped by the daemon's configured maximum."""

    timeout_ms: int | None = Field(None, ge=1, description="wall-clock limit")
    memory_mb: int | None = Field(None, ge=16, description="memory limit")
    output_bytes: int | None = Field(None, ge=0, description="stdout+stderr bytes")
    output_lines: int | None = Field(None, ge=0, description="stdout+stderr lines")
    tool_calls: int | None = Field(None, ge=0, description="tool calls")
    result_bytes: int | None = Field(None, ge=0, description="size of the JSON result")
    disk_mb: int | None = Field(
        None, ge=1, description="what the working directory may hold, input files included"
    )

    def overrides(self) -> dict[str, int]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class FileParam(Params):
    """A file to place in the program's working directory before it runs."""

    path: str = Field(description="relative path, e.g. data/input.csv (no .., not absolute)")
    text: str | None = Field(None, description="the file's contents as UTF-8 text")
    base64: str | None = Field(None, description="the file's contents, base64-encoded")

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        return checked_path(value)

    @model_validator(mode="after")
    def _one_content(self) -> FileParam:
        if (self.text is None) == (self.base64 is None):
            raise ValueError(f"file {self.path!r}: give exactly one of text or base64")
        return self

    def to_file(self) -> FileData:
        if self.text is not None:
            return FileData(self.path, self.text.encode("utf-8", "surrogatepass"))
        try:
            data = b64.decode(self.base64 or "")
        except ValueError:  # binascii.Error, or a character outside ASCII
            raise InvalidParams(
                f"invalid params: file {self.path!r}: base64 is not valid base64",
                {"field": "files.base64", "reason": "not base64", "path": self.path},
            ) from None
        return FileData(self.path, data)


def checked_files(files: list[FileParam]) -> tuple[FileData, ...]:
    """The files as data; `InvalidParams` naming the path for one given twice, or
    whose path another file's directory takes."""
    if len(files) > MAX_FILES:
        raise InvalidParams(
            f"invalid params: {len(files)} files; at most {MAX_FILES}",
            {"field": "files", "reason": f"more than {MAX_FILES}"},
        )
    paths = {file.path for file in files}
    for file in files:
        taken = _file_in_the_way(file.path, paths)
        if taken is not None:
            raise InvalidParams(
                f"invalid params: file {file.path!r} needs {taken!r} to be a directory, "
                "and it is a file",
                {"field": "files.path", "reason": "its directory is a file", "path": file.path},
            )
    if len(paths) != len(files):
        raise InvalidParams(
            "invalid params: a file path is given twice",
            {"field": "files.path", "reason": "given twice"},
        )
    return tuple(file.to_file() for file in files)


def _file_in_the_way(path: str, paths: set[str]) -> str | None:
    """The first of `path`'s directories that is among `paths` (a file), if any."""
    parts = path.split("/")
    for depth in range(1, len(parts)):
        directory = "/".join(parts[:depth])
        if directory in paths:
            return directory
    return None


class ExecuteParams(Params):
    language: Language | None = Field(
        None,
        description="python, typescript or javascript (py, ts, js also accepted); "
        "required unless session_id is given",
    )
    code: str = Field(description="the program; a markdown fence around it is removed")
    executor: str | None = Field(None, description="override the language's default executor")
    session_id: str | None = Field(
        None,
        max_length=64,
        description="run in this session (sessions/create): what earlier steps defined is there",
    )
    limits: LimitParams | None = None
    allowed_tools: list[str] | None = Field(
        None, description="tool patterns this program may call: *, ns.*, ns.tool"
    )
    inputs: Any = Field(None, description="any JSON, visible to the program as `inputs`")
    files: list[FileParam] | None = Field(
        None,
        max_length=MAX_FILES,
        description="files placed in the program's working directory before it runs; "
        "what it writes under out/ comes back in the result's files",
    )
    stream: bool = Field(
        False,
        description="send the output as execution/output notifications while the program "
        "runs, before the result",
    )

    _language = field_validator("language", mode="before")(language_name)

    @model_validator(mode="after")
    def _language_or_session(self) -> ExecuteParams:
        if self.language is None and self.session_id is None:
            raise ValueError("give language (or session_id, to run in a session)")
        return self

    def to_request(self, ctx: CallContext, session: LiveSession | None = None) -> ExecutionRequest:
        """The execution this asks for, on behalf of the call `ctx`: in `session`, or
        else in the session `session_id` names (the caller's own, or `NotFound`).

        With `stream`, its output goes to the caller's connection as `execution/output`
        notifications; a caller with no connection (in-process) gets the result only.
        """
        if session is None and self.session_id is not None:
            session = ctx.sessions.get(ctx.require_principal().name, self.session_id)
        if session is not None:
            _check_session_fits(session, self.language, self.executor)
        on_output = None
        if self.stream and ctx.peer is not None:
            on_output = partial(_send_output, ctx.peer, ctx.request_id)
        return ExecutionRequest(
            language=session.language if session is not None else str(self.language),
            code=self.code,
            executor=self.executor,
            limits=self.limits.overrides() if self.limits else {},
            allowed_tools=tuple(self.allowed_tools) if self.allowed_tools is not None else None,
            inputs=self.inputs,
            files=checked_files(self.files) if self.files else (),
            origin=origin_of(ctx, ctx.request_id),
            on_output=on_output,
            session=session,
        )


def _check_session_fits(session: LiveSession, language: str | None, executor: str | None) -> None:
    """`InvalidParams` if the request names another language or executor than the
    session's (leaving them out is the usual way)."""
    if language not in (None, session.language):
        raise InvalidParams(
            f"invalid params: the session runs {session.language}, not {language}; "
            "leave language out to run in it",
            {"field": "language", "reason": "not the session's"},
        )
    if executor not in (None, session.executor):
        raise InvalidParams(
            f"invalid params: the session runs on {session.executor}, not {executor}",
            {"field": "executor", "reason": "not the session's"},
        )


async def _send_output(connection: Peer, request_id: Any, params: dict[str, Any]) -> None:
    # The request id lets a client with several streams in flight route each piece
    # before it has learnt the execution id from the first piece or the result.
    await connection.notify("execution/output", {**params, "request_id": request_id})


@router.method("execute", params=ExecuteParams, scope="execute")
async def execute(params: ExecuteParams, ctx: CallContext) -> dict[str, Any]:
    """Run a program in a fresh sandbox and return its result, output and status."""
    request = params.to_request(ctx)
    return (await ctx.executions.execute(request, ctx.require_principal())).to_wire()


def origin_of(ctx: CallContext, request_id: Any) -> tuple[int, Any] | None:
    """Who started an execution, as `executions/cancel` names it: (connection, request id)."""
    return (id(ctx.peer), request_id) if ctx.peer is not None else None


class CancelParams(Params):
    execution_id: str | None = Field(None, description="as listed by executions/running")
    request_id: str | int | None = Field(
        None, description="the id of the execute request on this connection"
    )

    @model_validator(mode="after")
    def _one_of(self) -> CancelParams:
        if (self.execution_id is None) == (self.request_id is None):
            raise ValueError("give exactly one of execution_id or request_id")
        return self


@router.method("executions/cancel", params=CancelParams, scope="executions")
async def cancel(params: CancelParams, ctx: CallContext) -> dict[str, Any]:
    """Stop a running execution; its execute call answers with status cancelled."""
    execution_id = ctx.executions.cancel(
        ctx.require_principal(),
        execution_id=params.execution_id,
        origin=origin_of(ctx, params.request_id) if params.request_id is not None else None,
    )
    return {"cancelled": True, "execution_id": execution_id}


@router.method("executions/running", params=NoParams, scope="executions")
async def running(params: NoParams, ctx: CallContext) -> dict[str, Any]:
    """The executions running now (yours, or all for the master)."""
    principal = ctx.require_principal()
    rows = ctx.executions.running()
    if not principal.is_admin:
        rows = [row for row in rows if row["principal"] == principal.name]
    return {"executions": rows}


# ---- the audit store ---------------------------------------------------------------


def _visible_owner(ctx: CallContext, asked: str | None) -> str | None:
    """Whose executions the caller may read: `asked` (None: all) for the master, else
    its own; asking for another's is `Forbidden`."""
    principal = ctx.require_principal()
    if principal.is_admin:
        return asked
    if asked is not None and asked != principal.name:
        raise Forbidden(
            f"forbidden: {principal.name} may read only its own executions; leave out "
            "principal (only the master reads others')",
            {"field": "principal"},
        )
    return principal.name


def _store_warning(ctx: CallContext) -> dict[str, Any]:
    """A `warning` member while the store is open but failing to write."""
    stats = ctx.audit.statistics()
    if stats.state is AuditState.FAILING:
        return {"warning": f"recent executions may be missing: {stats.reason}"}
    return {}


# How executions end, and what the store says of one still running or never ended.
_STATUSES = (*Status, *RECORD_STATUSES)


class ExecutionListParams(Params):
    principal: str | None = Field(
        None, description="only this principal's executions (others' need the admin scope)"
    )
    status: str | None = Field(None, description="only this status: " + ", ".join(_STATUSES))
    executor: str | None = Field(None, description="only this executor's")
    daemon_id: str | None = Field(
        None, description="only the executions this daemon ran (stores may be shared)"
    )
    language: Language | None = Field(None, description="only this language's")
    since: float | None = Field(
        None, ge=0, description="Unix time: only executions started at or after it"
    )
    code_sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-fA-F]{4,64}$",
        description="only runs of this program: its sha256, or a prefix of 4+ hex digits",
    )
    limit: int = Field(DEFAULT_PAGE, ge=1, le=MAX_PAGE, description="executions per page")
    cursor: str | None = Field(None, description="next_cursor of the previous page")

    _language = field_validator("language", mode="before")(language_name)

    @field_validator("status")
    @classmethod
    def _status(cls, value: str | None) -> str | None:
        if value is not None and value not in _STATUSES:
            raise ValueError(f"is not a status; use one of {', '.join(_STATUSES)}")
        return value


@router.method("executions/list", params=ExecutionListParams, scope="executions")
async def list_executions(params: ExecutionListParams, ctx: CallContext) -> dict[str, Any]:
    """Executions from the audit store (of every daemon sharing it), newest first, a page
    at a time; one still running shows `status: running`."""
    query = ExecutionQuery(
        principal=_visible_owner(ctx, params.principal),
        status=params.status,
        executor=params.executor,
        language=params.language,
        since=params.since,
        code_sha256=params.code_sha256,
        daemon_id=params.daemon_id,
        limit=params.limit,
        cursor=params.cursor,
    )
    page = await ctx.audit.list_executions(query)
    return {"executions": page.executions, "next_cursor": page.next_cursor, **_store_warning(ctx)}


class GetParams(Params):
    execution_id: str = Field(description="as execute answered it, or executions/list lists it")


@router.method("executions/get", params=GetParams, scope="executions")
async def get(params: GetParams, ctx: CallContext) -> dict[str, Any]:
    """One execution's audit record (code snippet, output heads, tool calls), or its age.

    A running execution is not in the store yet: it answers from the table of running
    executions, with `status: running` and `running_ms`.
    """
    owner = _visible_owner(ctx, None)
    running = [
        row
        for row in ctx.executions.running()
        if row["execution_id"] == params.execution_id and owner in (None, row["principal"])
    ]
    if running:
        return {**running[0], "status": "running"}
    record = await ctx.audit.get_execution(params.execution_id)
    if record is None or owner not in (None, record.principal):
        raise NotFound(
            f"not found: no execution {params.execution_id} of yours in the audit store; "
            "it may be older than audit.retention_days",
            {"execution_id": params.execution_id},
        )
    return record.to_wire()


class StatsParams(Params):
    window_s: float | None = Field(
        None, gt=0, description="the last this many seconds (default: a day)"
    )
    since: float | None = Field(
        None, ge=0, description="Unix time: from then on (instead of window_s)"
    )
    principal: str | None = Field(
        None, description="only this principal's executions (others' need the admin scope)"
    )

    @model_validator(mode="after")
    def _one_window(self) -> StatsParams:
        if self.window_s is not None and self.since is not None:
            raise ValueError("give window_s or since, not both")
        return self


@router.method("executions/stats", params=StatsParams, scope="executions")
async def stats(params: StatsParams, ctx: CallContext) -> dict[str, Any]:
    """Counts, success rate, timeouts, p50/p95 durations over a window, by executor/language."""
    owner = _visible_owner(ctx, params.principal)
    until = time.time()
    since = params.since
    if since is None:
        since = until - (params.window_s or DEFAULT_STATS_WINDOW_S)
    summary = await ctx.audit.stats(since, owner)
    return {"since": since, "until": until, "principal": owner, **summary, **_store_warning(ctx)}
