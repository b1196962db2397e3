"""`execute`, `executions/cancel` and `executions/running`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from conduit.daemon.dispatcher import CallContext, NoParams, Params, method
from conduit.daemon.errors import InvalidParams
from conduit.daemon.executions import ExecutionRequest

__all__ = ["ExecuteParams", "LimitParams", "request_origin"]

# What people and models write for the three languages.
LANGUAGE_NAMES = {
    "python": "python",
    "py": "python",
    "typescript": "typescript",
    "ts": "typescript",
    "javascript": "javascript",
    "js": "javascript",
}


class LimitParams(Params):
    """Per-execution limits; each is capped by the daemon's configured maximum."""

    timeout_ms: int | None = Field(None, ge=1, description="wall-clock limit")
    memory_mb: int | None = Field(None, ge=16, description="memory limit")
    output_bytes: int | None = Field(None, ge=0, description="stdout+stderr bytes")
    output_lines: int | None = Field(None, ge=0, description="stdout+stderr lines")
    tool_calls: int | None = Field(None, ge=0, description="tool calls")
    result_bytes: int | None = Field(None, ge=0, description="size of the JSON result")

    def overrides(self) -> dict[str, int]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class ExecuteParams(Params):
    language: Literal["python", "typescript", "javascript"] = Field(
        description="python, typescript or javascript (py, ts, js also accepted)"
    )
    code: str = Field(description="the program; a markdown fence around it is removed")
    executor: str | None = Field(None, description="override the language's default executor")
    limits: LimitParams | None = None
    allowed_tools: list[str] | None = Field(
        None, description="tool patterns this program may call: *, ns.*, ns.tool"
    )
    inputs: Any = Field(None, description="any JSON, visible to the program as `inputs`")
    stream: bool = Field(False, description="send execution/output notifications (not yet)")

    @field_validator("language", mode="before")
    @classmethod
    def _language(cls, value: Any) -> Any:
        return LANGUAGE_NAMES.get(value.lower(), value) if isinstance(value, str) else value

    def to_request(self, origin: tuple[int, Any] | None = None) -> ExecutionRequest:
        if self.stream:
            raise InvalidParams(
                "invalid params: stream is not supported by this version; omit it",
                {"field": "stream", "reason": "not supported yet"},
            )
        return ExecutionRequest(
            language=self.language,
            code=self.code,
            executor=self.executor,
            limits=self.limits.overrides() if self.limits else {},
            allowed_tools=tuple(self.allowed_tools) if self.allowed_tools is not None else None,
            inputs=self.inputs,
            origin=origin,
        )


@method("execute", params=ExecuteParams, scope="execute")
async def execute(params: ExecuteParams, ctx: CallContext) -> dict[str, Any]:
    """Run a program in a fresh sandbox and return its result, output and status."""
    request = params.to_request(origin=request_origin(ctx, ctx.request_id))
    return await ctx.daemon.executions.execute(request, ctx.require_principal())


def request_origin(ctx: CallContext, request_id: Any) -> tuple[int, Any] | None:
    """Who started an execution, as `executions/cancel` names it: (connection, request id)."""
    return (id(ctx.connection), request_id) if ctx.connection is not None else None


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


@method("executions/cancel", params=CancelParams, scope="executions")
async def cancel(params: CancelParams, ctx: CallContext) -> dict[str, Any]:
    """Stop a running execution; its execute call answers with status cancelled."""
    execution_id = ctx.daemon.executions.cancel(
        ctx.require_principal(),
        execution_id=params.execution_id,
        origin=request_origin(ctx, params.request_id) if params.request_id is not None else None,
    )
    return {"cancelled": True, "execution_id": execution_id}


@method("executions/running", params=NoParams, scope="executions")
async def running(params: NoParams, ctx: CallContext) -> dict[str, Any]:
    """The executions running now (yours, or all for the master)."""
    principal = ctx.require_principal()
    rows = ctx.daemon.executions.running()
    if not principal.is_admin:
        rows = [row for row in rows if row["principal"] == principal.name]
    return {"executions": rows}
