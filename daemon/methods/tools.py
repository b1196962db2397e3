"""`tools/*`: listing, calling, describing and validating tools.

Two kinds of tool share these methods. The built-in execution tools
(`execute_python`, `execute_typescript`, `execute_javascript`) take the same arguments
as `execute` (less `language`), so any MCP client can use Conduit directly. Upstream
tools (`<upstream>__<tool>`) come from the gateway; sandboxes reach them with their
session tokens and see only what their execution's allowlist permits.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

from pydantic import Field, ValidationError

from conduit.daemon.dispatcher import CallContext, NoParams, Params, invalid_params, method
from conduit.daemon.errors import Forbidden
from conduit.daemon.methods.executions import ExecuteParams
from conduit.daemon.tool_access import allowlists_for, shaped
from conduit.gateway.model import Tool

__all__ = ["BUILTIN_TOOLS"]

BUILTIN_TOOLS = {
    "execute_python": "python",
    "execute_typescript": "typescript",
    "execute_javascript": "javascript",
}

_DESCRIPTIONS = {
    "python": "Run Python in a fresh sandbox. The value of the last expression, or of a "
    "top-level return, is the result; print() goes to stdout.",
    "typescript": "Run TypeScript in a fresh Deno sandbox. Top-level await works; the "
    "value of the final expression, or of a top-level return, is the result.",
    "javascript": "Run JavaScript in a fresh sandbox. Top-level await works; the value "
    "of the final expression, or of a top-level return, is the result.",
}


def _input_schema() -> dict[str, Any]:
    schema = ExecuteParams.model_json_schema()
    schema["properties"].pop("language")
    schema["required"] = ["code"]
    return schema


def builtin_tool_list() -> list[dict[str, Any]]:
    schema = _input_schema()
    return [
        {
            "name": name,
            "description": _DESCRIPTIONS[language],
            "inputSchema": schema,
            "annotations": {"openWorldHint": False},
        }
        for name, language in BUILTIN_TOOLS.items()
    ]


def _mcp_tool(tool: Tool) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": tool.id,
        "description": tool.description,
        "inputSchema": tool.input_schema or {"type": "object"},
        "_meta": {"conduit/path": tool.path, "conduit/upstream": tool.upstream},
    }
    if tool.output_schema:
        entry["outputSchema"] = tool.output_schema
    if tool.annotations:
        entry["annotations"] = tool.annotations
    return entry


class ListParams(Params):
    cursor: str | None = Field(None, description="ignored: the whole list comes at once")


@method("tools/list", params=ListParams, scope="tools", session=True)
async def list_tools(params: ListParams, ctx: CallContext) -> dict[str, Any]:
    """The tools this caller may call (a sandbox sees only its execution's allowlist)."""
    principal = ctx.require_principal()
    upstream_tools = [_mcp_tool(tool) for tool in ctx.daemon.tools.visible(principal)]
    if principal.kind == "session" or "execute" not in principal.scopes:
        return {"tools": upstream_tools}
    return {"tools": builtin_tool_list() + upstream_tools}


class CallParams(Params):
    name: str = Field(min_length=1, description="a tool id (ns__tool) or SDK path (ns.tool)")
    arguments: dict[str, Any] = Field(default_factory=dict)
    shape: Literal["mcp", "value"] = Field(
        "mcp", description="mcp: a CallToolResult; value: {value} or {error}, as SDKs use"
    )


def _execution_result(result: dict[str, Any]) -> dict[str, Any]:
    failed = result["status"] != "ok"
    summary = {k: result[k] for k in ("status", "result", "stdout", "stderr", "error")}
    return {
        "content": [{"type": "text", "text": json.dumps(summary, ensure_ascii=False)}],
        "structuredContent": result,
        "isError": failed,
    }


async def _call_builtin(language: str, params: CallParams, ctx: CallContext) -> dict[str, Any]:
    principal = ctx.require_principal()
    if principal.kind == "session" or "execute" not in principal.scopes:
        raise Forbidden(f"forbidden: {principal.name} may not call {params.name}")
    try:
        arguments = ExecuteParams.model_validate({**params.arguments, "language": language})
    except ValidationError as exc:
        raise invalid_params(exc, params.name) from None
    result = await ctx.daemon.executions.execute(arguments.to_request(ctx), principal)
    return _execution_result(result)


@method("tools/call", params=CallParams, scope="tools", session=True)
async def call_tool(params: CallParams, ctx: CallContext) -> dict[str, Any]:
    """Call a tool by id or SDK path with its arguments; answers an MCP tool result."""
    language = BUILTIN_TOOLS.get(params.name)
    if language is not None:
        return await _call_builtin(language, params, ctx)
    tool, result = await ctx.daemon.tools.call(
        ctx.require_principal(), params.name, params.arguments
    )
    return shaped(tool, result) if params.shape == "value" else result


class ToolParams(Params):
    name: str = Field(min_length=1, description="a tool id (ns__tool) or SDK path (ns.tool)")


@method("tools/schema", params=ToolParams, scope="tools")
async def tool_schema(params: ToolParams, ctx: CallContext) -> dict[str, Any]:
    """A tool's names, description, input and output schemas, and any schema problems."""
    tools = ctx.daemon.tools
    tool = tools.resolve(ctx.require_principal(), params.name)
    return {
        "id": tool.id,
        "path": tool.path,
        "upstream": tool.upstream,
        "description": tool.description,
        "inputSchema": tool.input_schema,
        "outputSchema": tool.output_schema,
        "strict": tools.catalogue.is_strict(tool),
        "schemaProblems": list(tools.catalogue.schema_problems(tool)),
    }


class ValidateParams(ToolParams):
    arguments: dict[str, Any] = Field(default_factory=dict)


@method("tools/validate", params=ValidateParams, scope="tools")
async def validate_tool(params: ValidateParams, ctx: CallContext) -> dict[str, Any]:
    """Check arguments against a tool's input schema without calling it."""
    tools = ctx.daemon.tools
    tool = tools.resolve(ctx.require_principal(), params.name)
    errors = tools.catalogue.validate(tool, params.arguments)
    return {"valid": not errors, "errors": errors, "tool": tool.id}


@method("tools/packages", params=NoParams, scope="tools")
async def packages(params: NoParams, ctx: CallContext) -> dict[str, Any]:
    """The tools this caller may call, grouped by namespace, with one-line summaries."""
    principal = ctx.require_principal()
    listed = ctx.daemon.tools.catalogue.packages(allowlists_for(principal))
    return {"packages": [dataclasses.asdict(package) for package in listed]}
