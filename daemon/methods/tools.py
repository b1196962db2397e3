"""`tools/*`: listing, calling, describing and validating tools.

Two kinds of tool share these methods. The built-in execution tools
(`execute_python`, `execute_typescript`, `execute_javascript`) take the same arguments
as `execute` (less `language`), so any MCP client can use Conduit directly. Upstream
tools (`<upstream>__<tool>`) come from the gateway; sandboxes reach them with their
session tokens and see only what their execution's allowlist permits.

What an MCP client's model reads about the execution tools is built here, per caller:
each description says in one line what programs cannot use on the language's default
executor (`executors.caveats`) and in another which packages the operator installed
there, if any, then declares the `tools.*` that caller's programs may
call (Python stubs for Python, TypeScript declarations for TypeScript and JavaScript),
cut down to a list of names past `MAX_DECLARATIONS_CHARS`. Their input schema is the
`execute` params model flattened to what strict clients accept (no `$ref`, no nullable
`anyOf`), and their output schema describes the execution result that every call
returns as `structuredContent`, failed programs included.

While a call runs, an MCP client may hear about it (`mcp_notifications`): a program's
output as progress if the call carried a progress token, an upstream tool's own
progress and log messages, and how a program ended if it set a log level.
"""

from __future__ import annotations

import dataclasses
import json
import urllib.parse
import weakref
from collections.abc import Mapping
from functools import partial
from typing import Any, Literal

import trio
from pydantic import ConfigDict, Field, ValidationError

from conduit.core.errors import (
    ExecutorUnavailable,
    Forbidden,
    InvalidParams,
    Overloaded,
    RateLimited,
)
from conduit.core.files import ReturnedFile
from conduit.core.results import ANY_JSON, ExecutionResult
from conduit.core.tools import Tool
from conduit.daemon.dispatcher import CallContext, MethodRouter, NoParams, Params, invalid_params
from conduit.daemon.mcp_notifications import log, open_progress, open_upstream_relay
from conduit.daemon.methods.executions import ExecuteParams
from conduit.daemon.methods.sdk import render_declarations
from conduit.daemon.methods.sessions import MAX_NAME_CHARS, connection_session
from conduit.daemon.tool_access import allowlists_for, hides_catalogue, shaped, unavailable
from conduit.executors.caveats import cannot_use, installed_packages
from conduit.gateway.catalogue import Catalogue
from conduit.gateway.model import UpstreamTool

router = MethodRouter()

__all__ = ["BUILTIN_TOOLS", "MAX_DECLARATIONS_CHARS"]

BUILTIN_TOOLS = {
    "execute_python": "python",
    "execute_typescript": "typescript",
    "execute_javascript": "javascript",
}

# MCP clients put every tool's description in the model's context, and the three
# execute tools each carry the declarations: 16,000 characters (about 4,000 tokens)
# apiece holds a few dozen typed tools; past it, names and a pointer to discovery.
MAX_DECLARATIONS_CHARS = 16_000

_SESSIONS = (
    "Each call runs in a fresh sandbox, unless you pass `session` (a name of your "
    "choice): calls with the same session name share one sandbox, so variables, "
    "functions and imports defined in one call are there in the next, until this "
    "connection ends or the session is idle for 10 minutes. The program's working "
    "directory starts with the `files` you pass; files it writes under `out/` (a chart "
    "as out/chart.png, say) come back with the result, images as images."
)
_DESCRIPTIONS = {
    "python": "Run Python. The value of the last expression, or of a top-level return, "
    "is the result; print() goes to stdout. " + _SESSIONS,
    "typescript": "Run TypeScript. Top-level await works; the value of the "
    "final expression, or of a top-level return, is the result. " + _SESSIONS,
    "javascript": "Run JavaScript. Top-level await works; the value of the final "
    "expression, or of a top-level return, is the result. " + _SESSIONS,
}

_JS_CALLS = (
    "Call a tool as `await tools.<namespace>.<tool>({...})`: it resolves to the tool's "
    "result and throws `ToolError` if the call fails; `await tools.$discover()` lists "
    "the tools with their schemas."
)
_HOW_TO_CALL = {
    "python": "Call a tool as `tools.<namespace>.<tool>(name=value, ...)` (synchronous, "
    "no await): it returns the tool's result and raises `ToolError` if the call fails; "
    "`tools._discover()` lists the tools with their schemas.",
    "typescript": _JS_CALLS,
    "javascript": _JS_CALLS,
}
_FENCES = {"python": "python", "typescript": "typescript", "javascript": "typescript"}
# Returned files a client is shown as images (`core.files.mime_of` tells them by bytes).
# SVG is not among them: rendered, it may fetch a URL (carrying what the program read
# out of the sandbox) or run a script. It comes as an embedded resource, as text.
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
SVG = "image/svg+xml"
_NO_TOOLS = "No tools are available to these programs: they compute, print and return."

# Rendered sections per catalogue, by (fence, tool ids), replaced by an empty dict
# whenever its tools change (a render still running then lands in the old one, unseen):
# rendering checks every tool's schema, milliseconds a tool, too much to redo on
# every tools/list. Keys differ only by the callers' allowlists, so they stay few.
_SECTIONS: weakref.WeakKeyDictionary[Catalogue, dict[tuple[str, ...], str]] = (
    weakref.WeakKeyDictionary()
)
# Past this many distinct allowlists between two changes, start the cache afresh.
_MAX_SECTIONS = 64
# Rendering runs in a worker thread (large catalogues take a second); one at a time.
_RENDERING = trio.CapacityLimiter(1)


def _listing(catalogue: Catalogue, tools: list[UpstreamTool], budget: int) -> str:
    """Namespaces and tool names within `budget` characters, for too many to declare."""
    lines: list[str] = []
    used = shown = 0
    for package in catalogue.packages():
        names = [tool.sdk_name for tool in tools if tool.namespace == package.namespace]
        line = f"- {package.namespace}: {', '.join(names)}"
        if not names:
            continue
        if used + len(line) + 1 > budget:
            break
        lines.append(line)
        used += len(line) + 1
        shown += len(names)
    if shown < len(tools):
        lines.append(f"- ... and {len(tools) - shown} more")
    return "\n".join(lines)


def _tools_section(language: str, tools: list[UpstreamTool], catalogue: Catalogue) -> str:
    if not tools:
        return _NO_TOOLS
    how = _HOW_TO_CALL[language]
    declarations = render_declarations(language, tools, catalogue)
    if len(declarations) <= MAX_DECLARATIONS_CHARS:
        return (
            f"{how} The tools your programs may call:\n\n```{_FENCES[language]}\n{declarations}```"
        )
    return (
        f"{how} Your programs may call {len(tools)} tools, too many to declare here: "
        "discover them from inside a program (socket clients: sdk/get gives the "
        f"declarations).\n\n{_listing(catalogue, tools, MAX_DECLARATIONS_CHARS)}"
    )


def _flat(schema: Any, defs: dict[str, Any]) -> Any:
    """`schema` with `$ref`s inlined, `anyOf: [X, null]` read as X, no titles or null
    defaults: the same contract in the form the strictest MCP clients accept (a
    missing member is how a tool call leaves an option out)."""
    if isinstance(schema, list):
        return [_flat(item, defs) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        return _flat(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    options = schema.get("anyOf")
    if isinstance(options, list) and len(options) == 2 and {"type": "null"} in options:
        (kept,) = [option for option in options if option != {"type": "null"}]
        schema = {**{k: v for k, v in schema.items() if k != "anyOf"}, **_flat(kept, defs)}
    flat: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("title", "$defs") or (key == "default" and value is None):
            continue
        if key == "properties":  # property names are data, not keywords
            flat[key] = {name: _flat(sub, defs) for name, sub in value.items()}
        else:
            flat[key] = _flat(value, defs)
    return flat


def _any_json(description: str) -> dict[str, Any]:
    return {"anyOf": list(ANY_JSON), "description": description}


def _input_schema() -> dict[str, Any]:
    schema = ExecuteParams.model_json_schema()
    properties = schema["properties"]
    properties.pop("language")
    # Streaming needs notifications an MCP tool call has no place for.
    properties.pop("stream")
    # A model names its sessions; the daemon keeps their ids for the connection.
    properties.pop("session_id")
    properties["session"] = {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_NAME_CHARS,
        "description": "run in the session of this name (made on first use): what "
        "earlier calls in it defined is there",
    }
    properties["inputs"] = _any_json(properties["inputs"]["description"])
    schema["required"] = ["code"]
    return _flat(schema, schema.get("$defs", {}))


INPUT_SCHEMA = _input_schema()
# The result (`execute`'s), as every execute tool's `structuredContent`.
OUTPUT_SCHEMA = ExecutionResult.json_schema()


def _forget_sections(catalogue: weakref.ref[Catalogue]) -> None:
    alive = catalogue()
    if alive is not None:
        _SECTIONS[alive] = {}


async def _section(language: str, tools: list[UpstreamTool], catalogue: Catalogue) -> str:
    """`_tools_section`, from the cache or rendered off the event loop."""
    sections = _SECTIONS.get(catalogue)
    if sections is None:
        sections = _SECTIONS[catalogue] = {}
        catalogue.watch(partial(_forget_sections, weakref.ref(catalogue)))
    key = (_FENCES[language], *(tool.id for tool in tools))
    if key not in sections:
        render = partial(_tools_section, language, tools, catalogue)
        text = await trio.to_thread.run_sync(render, limiter=_RENDERING)
        if len(sections) >= _MAX_SECTIONS:
            sections.clear()
        sections[key] = text
    return sections[key]


async def builtin_tool_list(
    tools: list[UpstreamTool],
    catalogue: Catalogue,
    defaults: dict[str, str],
    packages: Mapping[str, Mapping[str, str]] | None = None,
) -> list[dict[str, Any]]:
    """The execute tools as MCP `Tool`s, their descriptions declaring `tools` and
    saying what programs cannot use on the executor each language's programs meet the
    limits of (`defaults`: `ExecutorRegistry.describing`),
    and which packages it has installed (`packages`: versions by name, by language)."""
    listed = []
    for name, language in BUILTIN_TOOLS.items():
        section = await _section(language, tools, catalogue)
        notes = (
            cannot_use(defaults.get(language), language),
            installed_packages((packages or {}).get(language, {})),
        )
        summary = " ".join([_DESCRIPTIONS[language], *(note for note in notes if note)])
        tool = Tool(
            name=name,
            description=f"{summary}\n\n{section}",
            input_schema=INPUT_SCHEMA,
            output_schema=OUTPUT_SCHEMA,
            annotations={"openWorldHint": bool(tools)},
        )
        listed.append(tool.to_wire())
    return listed


class _McpParams(Params):
    # MCP lets every request carry `_meta` (progress tokens, client extensions).
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    meta: dict[str, Any] | None = Field(
        None,
        alias="_meta",
        description="MCP request metadata: a tools/call's progressToken gets the program's "
        "output as notifications/progress",
    )


class ToolListParams(_McpParams):
    cursor: str | None = Field(None, description="ignored: the whole list comes at once")


@router.method("tools/list", params=ToolListParams, scope="tools", session=True)
async def list_tools(params: ToolListParams, ctx: CallContext) -> dict[str, Any]:
    """The tools this caller may call (a sandbox sees only its execution's allowlist)."""
    principal = ctx.require_principal()
    visible = ctx.tools.visible(principal)
    upstream_tools = [tool.listed().to_wire() for tool in visible]
    if principal.kind == "session" or "execute" not in principal.scopes:
        return {"tools": upstream_tools}
    registry = ctx.executions.registry
    defaults = registry.describing()
    packages = {language: registry.packages(name) for language, name in defaults.items()}
    builtin = await builtin_tool_list(visible, ctx.tools.catalogue, defaults, packages)
    return {"tools": builtin + upstream_tools}


class CallParams(_McpParams):
    name: str = Field(min_length=1, description="a tool id (ns__tool) or SDK path (ns.tool)")
    arguments: dict[str, Any] = Field(default_factory=dict)
    shape: Literal["mcp", "value"] = Field(
        "mcp", description="mcp: a CallToolResult; value: {value} or {error}, as SDKs use"
    )


def _execution_result(result: ExecutionResult) -> dict[str, Any]:
    """The result as a tool's: the summary as text, each image the program returned as
    MCP image content beside it, and the whole result as structured content."""
    wire = result.to_wire()
    summary = {k: wire[k] for k in ("status", "result", "stdout", "stderr", "error")}
    if result.files:
        summary["files"] = [
            {"path": f.path, "size": f.size, "mime": f.mime, "truncated": f.truncated}
            for f in result.files
        ]
    content: list[dict[str, Any]] = [
        {"type": "text", "text": json.dumps(summary, ensure_ascii=False)}
    ]
    content += [_file_content(f) for f in result.files if f.base64 is not None]
    return {
        "content": [part for part in content if part],
        "structuredContent": wire,
        "isError": not result.ok,
    }


def _file_content(file: ReturnedFile) -> dict[str, Any]:
    """A returned image as MCP content: PNG, JPEG, GIF or WebP as an image, SVG as an
    embedded resource holding its text; {} for any other file."""
    if file.mime in IMAGE_TYPES:
        return {"type": "image", "data": file.base64, "mimeType": file.mime}
    if file.mime == SVG and file.data is not None:
        text = file.data.decode("utf-8", "replace")
        uri = "file:///out/" + urllib.parse.quote(file.path)
        resource = {"uri": uri, "mimeType": SVG, "text": text}
        return {"type": "resource", "resource": resource}
    return {}


def _refused(message: str) -> dict[str, Any]:
    """A tool error for a call that did not run, saying what the model can do about it."""
    return {"content": [{"type": "text", "text": message}], "isError": True}


# What a model can act on (fix an argument, wait, pick another executor): a tool error
# it reads, as MCP advises, rather than a protocol error a client may keep from it.
_TOOL_ERRORS = (InvalidParams, ExecutorUnavailable, Overloaded, RateLimited)


async def _call_builtin(language: str, params: CallParams, ctx: CallContext) -> dict[str, Any]:
    principal = ctx.require_principal()
    if "execute" not in principal.scopes:
        if hides_catalogue(principal):  # refused as every tool outside its allowlist is
            raise unavailable(params.name)
        raise Forbidden(f"forbidden: {principal.name} may not call {params.name}")
    # Bad arguments are the model's to correct, so they come back as tool errors
    # (MCP's advice), not as protocol errors a client might hide from it.
    given = dict(params.arguments)
    session_name = given.pop("session", None)
    if "session_id" in given:  # sessions are named here, never given by id
        return _refused(f"invalid arguments for {params.name}: use session (a name)")
    if session_name is not None and not isinstance(session_name, str):
        return _refused(f"invalid arguments for {params.name}: session must be a string")
    try:
        arguments = ExecuteParams.model_validate({**given, "language": language})
    except ValidationError as exc:
        problem = invalid_params(exc, params.name).data
        return _refused(
            f"invalid arguments for {params.name}: {problem['field']} {problem['reason']}; "
            "the tool's inputSchema lists its arguments"
        )
    try:
        session = None
        if session_name is not None:
            session = await connection_session(ctx, session_name, language)
        request = arguments.to_request(ctx, session)
        async with open_progress(ctx.peer, params.meta, ctx.request_id) as on_output:
            if on_output is not None:
                request = dataclasses.replace(request, on_output=on_output)
            await log(ctx.peer, "debug", f"{params.name}: running", request_id=ctx.request_id)
            result = await ctx.executions.execute(request, principal)
        await _log_outcome(ctx, params.name, result)
    except _TOOL_ERRORS as exc:
        return _refused(exc.message)
    return _execution_result(result)


async def _log_outcome(ctx: CallContext, name: str, result: ExecutionResult) -> None:
    """Tell a client that listens how the program ended (`notifications/message`)."""
    level = "info" if result.ok else "warning"
    data = {
        "tool": name,
        "execution_id": result.execution_id,
        "status": str(result.status),
        "executor": result.executor,
        "duration_ms": result.duration_ms,
    }
    await log(ctx.peer, level, data, request_id=ctx.request_id)


@router.method("tools/call", params=CallParams, scope="tools", session=True)
async def call_tool(params: CallParams, ctx: CallContext) -> dict[str, Any]:
    """Call a tool by id or SDK path with its arguments; answers an MCP tool result.

    A caller whose allowlists hold tools back (a sandbox, a client token with
    `allowed_tools`) is refused alike (-32003, one message and `data.tool`, the name as
    sent) for a tool that does not exist and one it may not call; a caller that may call
    every tool gets -32001 with close matches. In the MCP shape, arguments the tool
    refuses are a tool error (`isError`), for the model to correct; sandboxes' SDKs
    (the value shape) get the error itself, whose code their `ToolError` carries."""
    language = BUILTIN_TOOLS.get(params.name)
    if language is not None:
        return await _call_builtin(language, params, ctx)
    principal = ctx.require_principal()
    meta = params.meta if params.shape == "mcp" else None
    relaying = ctx.peer if params.shape == "mcp" else None
    try:
        async with open_upstream_relay(relaying, meta, ctx.request_id) as observer:
            tool, result = await ctx.tools.call(
                principal, params.name, params.arguments, observer=observer
            )
    except InvalidParams as exc:
        if params.shape == "value":
            raise
        return _refused(exc.message)
    return shaped(tool, result) if params.shape == "value" else result


class ToolParams(Params):
    name: str = Field(min_length=1, description="a tool id (ns__tool) or SDK path (ns.tool)")


@router.method("tools/schema", params=ToolParams, scope="tools")
async def tool_schema(params: ToolParams, ctx: CallContext) -> dict[str, Any]:
    """A tool's names, description, input and output schemas, and any schema problems."""
    tools = ctx.tools
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


@router.method("tools/validate", params=ValidateParams, scope="tools")
async def validate_tool(params: ValidateParams, ctx: CallContext) -> dict[str, Any]:
    """Check arguments against a tool's input schema without calling it."""
    tools = ctx.tools
    tool = tools.resolve(ctx.require_principal(), params.name)
    errors = tools.catalogue.validate(tool, params.arguments)
    return {"valid": not errors, "errors": errors, "tool": tool.id}


@router.method("tools/packages", params=NoParams, scope="tools")
async def packages(params: NoParams, ctx: CallContext) -> dict[str, Any]:
    """The tools this caller may call, grouped by namespace, with one-line summaries."""
    principal = ctx.require_principal()
    listed = ctx.tools.catalogue.packages(allowlists_for(principal))
    return {"packages": [dataclasses.asdict(package) for package in listed]}
