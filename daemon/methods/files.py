"""`files/put`, `files/get` and `files/list`: a session's working directory, between
its steps (see `docs/sessions.md`).

Each takes the session's turn, as a step does, so files never move while a step runs.
Paths are checked as `execute`'s `files` are (`core.files`); a link, a directory or a
special file in the working directory is never read or written through.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from conduit.core import b64
from conduit.core.errors import InvalidParams, NotFound
from conduit.core.files import MAX_FILES, checked_path, mime_of
from conduit.daemon.dispatcher import CallContext, MethodRouter, Params
from conduit.daemon.methods.executions import FileParam, checked_files
from conduit.executors.base import FilesRefused

router = MethodRouter()

__all__ = ["GetFileParams", "ListFilesParams", "PutFilesParams"]

MIB = 1024 * 1024


class PutFilesParams(Params):
    session_id: str = Field(max_length=64, description="as sessions/create answered")
    files: list[FileParam] = Field(
        min_length=1,
        max_length=MAX_FILES,
        description="files to place, replacing any by the same path",
    )


@router.method("files/put", params=PutFilesParams, scope="execute")
async def put_files(params: PutFilesParams, ctx: CallContext) -> dict[str, Any]:
    """Place files in a session's working directory, for its next steps."""
    session = ctx.sessions.get(ctx.require_principal().name, params.session_id)
    files = checked_files(params.files)
    async with session.turn(ctx.executions.limits.queue_timeout_s):
        try:
            await session.sandbox.put_files(files, session.limits.disk_mb * MIB)
        except FilesRefused as exc:
            raise InvalidParams(f"invalid params: {exc}", {"field": "files"}) from None
    return {"put": [{"path": file.path, "size": len(file.data)} for file in files]}


class GetFileParams(Params):
    session_id: str = Field(max_length=64, description="as sessions/create answered")
    path: str = Field(description="the file's path in the working directory")

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        return checked_path(value)


@router.method("files/get", params=GetFileParams, scope="execute")
async def get_file(params: GetFileParams, ctx: CallContext) -> dict[str, Any]:
    """One file of a session's working directory, base64-encoded (within the
    session's limits.result_bytes, else `truncated` without its bytes)."""
    session = ctx.sessions.get(ctx.require_principal().name, params.session_id)
    async with session.turn(ctx.executions.limits.queue_timeout_s):
        data = await session.sandbox.get_file(params.path)
    if data is None:
        raise NotFound(f"not found: no file {params.path!r}", {"path": params.path})
    answer: dict[str, Any] = {
        "path": params.path,
        "size": len(data),
        "mime": mime_of(params.path, data),
        "base64": None,
        "truncated": True,
    }
    # Within what a step's result may carry: a reply is built whole, in memory.
    if 4 * ((len(data) + 2) // 3) <= session.limits.result_bytes:
        answer |= {"base64": b64.encode(data), "truncated": False}
    return answer


class ListFilesParams(Params):
    session_id: str = Field(max_length=64, description="as sessions/create answered")


@router.method("files/list", params=ListFilesParams, scope="execute")
async def list_files(params: ListFilesParams, ctx: CallContext) -> dict[str, Any]:
    """The files in a session's working directory, with their sizes."""
    session = ctx.sessions.get(ctx.require_principal().name, params.session_id)
    async with session.turn(ctx.executions.limits.queue_timeout_s):
        listed = await session.sandbox.list_files()
    return {
        "files": [{"path": f.path, "size": f.size} for f in listed[:MAX_FILES]],
        "truncated": len(listed) > MAX_FILES,
    }
