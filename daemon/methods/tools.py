"""`tools/list` and `tools/call` (MCP) for the built-in execution tools.

Any MCP client can use Conduit directly: `execute_python`, `execute_typescript` and
`execute_javascript` take the same arguments as `execute` (less `language`) and answer
an MCP tool result whose `structuredContent` is the execution result.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field, ValidationError

from conduit.daemon.dispatcher import CallContext, Params, invalid_params, method
from conduit.daemon.errors import Forbidden, NotFound
from conduit.daemon.methods.executions import ExecuteParams

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


class ListParams(Params):
    cursor: str | None = None


@method("tools/list", params=ListParams, scope="tools", session=True)
async def list_tools(params: ListParams, ctx: CallContext) -> dict[str, Any]:
    """The tools this caller may call (a sandbox sees only its execution's allowlist)."""
    if ctx.require_principal().kind == "session":
        return {"tools": []}
    return {"tools": builtin_tool_list()}


class CallParams(Params):
    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


def _tool_result(result: dict[str, Any]) -> dict[str, Any]:
    failed = result["status"] != "ok"
    summary = {k: result[k] for k in ("status", "result", "stdout", "stderr", "error")}
    return {
        "content": [{"type": "text", "text": json.dumps(summary, ensure_ascii=False)}],
        "structuredContent": result,
        "isError": failed,
    }


@method("tools/call", params=CallParams, scope="tools", session=True)
async def call_tool(params: CallParams, ctx: CallContext) -> dict[str, Any]:
    """Call a tool by name with its arguments; answers an MCP tool result."""
    principal = ctx.require_principal()
    language = BUILTIN_TOOLS.get(params.name)
    if language is None:
        raise NotFound(
            f"not found: no tool named {params.name!r}; tools/list shows the tools",
            {"tool": params.name},
        )
    if principal.kind == "session" or "execute" not in principal.scopes:
        raise Forbidden(f"forbidden: {principal.name} may not call {params.name}")
    try:
        arguments = ExecuteParams.model_validate({**params.arguments, "language": language})
    except ValidationError as exc:
        raise invalid_params(exc, params.name) from None
    result = await ctx.daemon.executions.execute(arguments.to_request(), principal)
    return _tool_result(result)
