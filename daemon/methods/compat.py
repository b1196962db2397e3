"""The seed Conduit's method names, as rows of one alias table.

Each alias runs the same execution path as `execute` and answers the seed's shape,
`{stdout, stderr, exitCode}`. Where the seed reported a limit as an error (timeout
-32008, memory -32009, output -32013, log lines -32014) so does the alias, with the
partial output in the error's `data` rather than dropped.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import Any

from pydantic import ConfigDict, Field

from conduit.core.errors import LimitMemory, LimitOutput, LimitTimeout, RpcError
from conduit.core.results import ExecutionResult
from conduit.daemon.dispatcher import CallContext, MethodSpec, MethodTable, Params
from conduit.daemon.executions import ExecutionRequest

__all__ = ["ALIASES", "Alias", "add_aliases"]


@dataclass(frozen=True, slots=True)
class Alias:
    """A seed name: an execution in the seed's shape (`language`), or a plain rename."""

    target: str
    language: str | None = None

    def describe(self) -> dict[str, Any]:
        if self.language is None:
            return {"target": self.target, "shape": "same"}
        return {"target": self.target, "language": self.language, "shape": "seed"}


ALIASES: dict[str, Alias] = {
    "mcp.executeTypeScript": Alias("execute", "typescript"),
    "mcp.executePython": Alias("execute", "python"),
    "mcp.executeIsolate": Alias("execute", "javascript"),
    "mcp_execute_typescript": Alias("execute", "typescript"),
    "mcp_execute_python": Alias("execute", "python"),
    "mcp_execute_isolate": Alias("execute", "javascript"),
    "mcp.discoverTools": Alias("tools/list"),
    "mcp_discover_tools": Alias("tools/list"),
    "mcp.callTool": Alias("tools/call"),
    "mcp_call_tool": Alias("tools/call"),
    "mcp_list_tool_packages": Alias("tools/packages"),
    "mcp_list_tool_stubs": Alias("tools/stubs"),
    "mcp_read_tool_schema": Alias("tools/schema"),
    "mcp_validate_tool": Alias("tools/validate"),
    "mcp_register_upstream": Alias("upstreams/register"),
}


class SeedLimits(Params):
    model_config = ConfigDict(extra="ignore", frozen=True)
    timeoutMs: int | None = Field(None, ge=1)
    memoryLimitMb: int | None = Field(None, ge=16)
    maxOutputBytes: int | None = Field(None, ge=0)
    maxLogEntries: int | None = Field(None, ge=0)

    def overrides(self) -> dict[str, int]:
        names = {
            "timeoutMs": "timeout_ms",
            "memoryLimitMb": "memory_mb",
            "maxOutputBytes": "output_bytes",
            "maxLogEntries": "output_lines",
        }
        return {names[k]: v for k, v in self.model_dump().items() if v is not None}


class SeedExecuteParams(Params):
    # The seed's clients sent assorted extras; they are ignored, as the seed did.
    model_config = ConfigDict(extra="ignore", frozen=True)
    code: str
    limits: SeedLimits | None = None
    allowedTools: list[str] | None = None


_LIMIT_ERRORS: dict[str, type[RpcError]] = {
    "timeout": LimitTimeout,
    "memory_limit": LimitMemory,
    "output_limit": LimitOutput,
}


# Statuses whose error the seed showed on stderr: the program's own failure, and a
# refusal by the policy (which the seed did not have, and whose reason is all there is).
_ERROR_ON_STDERR = frozenset(("error", "refused"))


def _seed_shape(result: ExecutionResult) -> dict[str, Any]:
    stderr = result.stderr
    error = result.error
    if error and result.status in _ERROR_ON_STDERR:
        stderr += error.traceback or f"{error.type}: {error.message}\n"
    exit_code = result.exit_code
    if exit_code is None:
        exit_code = 0 if result.ok else 1
    return {"stdout": result.stdout, "stderr": stderr, "exitCode": exit_code}


async def _execute_alias(
    language: str, name: str, params: SeedExecuteParams, ctx: CallContext
) -> dict[str, Any]:
    request = ExecutionRequest(
        language=language,
        code=params.code,
        limits=params.limits.overrides() if params.limits else {},
        allowed_tools=tuple(params.allowedTools) if params.allowedTools is not None else None,
    )
    result = await ctx.executions.execute(request, ctx.require_principal())
    shaped = _seed_shape(result)
    error_class = _LIMIT_ERRORS.get(result.status)
    if error_class is not None:
        message = result.error.message if result.error else result.status
        raise error_class(f"{name}: {message}", {**shaped, "status": result.status})
    return shaped


def add_aliases(table: MethodTable) -> None:
    """Add every alias to `table`; call once all target methods are in it."""
    for name, alias in ALIASES.items():
        if alias.language is None:
            target = table[alias.target]
            table.add(
                dataclasses.replace(target, name=name, description=f"Seed alias of {alias.target}.")
            )
            continue
        table.add(
            MethodSpec(
                name,
                partial(_execute_alias, alias.language, name),
                SeedExecuteParams,
                scope="execute",
                session=False,
                description=(
                    f"Seed alias: run {alias.language}, answer {{stdout, stderr, exitCode}}"
                ),
            )
        )
