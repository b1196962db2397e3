"""`sdk/get` and `tools/stubs`: the typed `tools.*` SDK, for an agent's prompt.

The declarations describe exactly the tools the caller (narrowed by `allowed_tools`, as
an execution would be) may call, so a model is never shown a tool it cannot use. They
open with one comment line saying what programs cannot use on the language's default
executor (`executors.caveats`), also given alone as `cannot_use`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from conduit.daemon.dispatcher import CallContext, MethodRouter, Params
from conduit.daemon.tool_access import allowlists_for, requested_allowlist
from conduit.executors.caveats import cannot_use
from conduit.gateway.catalogue import Catalogue
from conduit.gateway.model import UpstreamTool
from conduit.gateway.sdk import python_stubs, typescript_declarations

router = MethodRouter()

__all__ = ["render_declarations"]

# How each language's text opens a comment line.
_COMMENT = {"typescript": "// ", "javascript": "// ", "python": "# "}
# What each guest language reads: TypeScript declarations serve JavaScript too.
_RENDERERS = {
    "typescript": typescript_declarations,
    "javascript": typescript_declarations,
    "python": python_stubs,
}


class SdkParams(Params):
    language: Literal["typescript", "javascript", "python"] = "typescript"
    allowed_tools: list[str] | None = Field(
        None, description="narrow to these patterns, as execute's allowed_tools would"
    )
    namespace: str | None = Field(None, description="only this namespace")


def _selected(params: SdkParams, ctx: CallContext) -> list[UpstreamTool]:
    allow = allowlists_for(ctx.require_principal())
    if params.allowed_tools is not None:
        allow.append(requested_allowlist(params.allowed_tools))
    tools = ctx.tools.catalogue.tools(allow)
    if params.namespace is not None:
        tools = [tool for tool in tools if tool.namespace == params.namespace]
    return tools


def render_declarations(language: str, tools: list[UpstreamTool], catalogue: Catalogue) -> str:
    """The `tools.*` declarations of `tools` in `language`'s terms, namespaces described.

    TypeScript declarations for typescript and javascript, Python stubs for python.
    """
    descriptions = {package.namespace: package.description for package in catalogue.packages()}
    return _RENDERERS[language](tools, descriptions=descriptions)


def _render(params: SdkParams, ctx: CallContext) -> dict[str, Any]:
    tools = _selected(params, ctx)
    text = render_declarations(params.language, tools, ctx.tools.catalogue)
    executor = ctx.executions.registry.describing().get(params.language)
    caveat = cannot_use(executor, params.language)
    if caveat:
        text = f"{_COMMENT[params.language]}{caveat}\n{text}"
    return {
        "language": params.language,
        "tools": len(tools),
        "cannot_use": caveat,
        "declarations": text,
    }


@router.method("sdk/get", params=SdkParams, scope="tools")
async def get_sdk(params: SdkParams, ctx: CallContext) -> dict[str, Any]:
    """The `tools.*` SDK's declarations for a language, for the tools this caller may use."""
    return _render(params, ctx)


@router.method("tools/stubs", params=SdkParams, scope="tools")
async def stubs(params: SdkParams, ctx: CallContext) -> dict[str, Any]:
    """Typed stubs for the tools (by namespace if given); the same text as sdk/get."""
    return _render(params, ctx)
