"""PydanticAI tools that run programs in Conduit: `execute_python` and
`execute_typescript`, described to the model with the typed `tools.*` SDK they may call.

```python
from conduit.client import AsyncClient
from conduit.integrations.pydantic_ai import ConduitToolset

async with AsyncClient() as client:
    agent = Agent(model, toolsets=[ConduitToolset(client, allowed_tools=["echo.*"])])
    result = await agent.run("Add 2 and 3 with the echo tools")
```

Each call runs one program in a fresh sandbox and returns what the model needs to use
or fix it: `{status, result, stdout, stderr, error}`. A program that fails is such a
result, not an exception, so the model sees why and can try again; errors of the
connection or the daemon are raised as `conduit.client` errors. The descriptions are
asked of the daemon (`sdk/get`) each time the model is shown the tools, for exactly
`allowed_tools`, so they follow the upstreams the daemon has now.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from conduit.integrations._extras import missing_extra

try:
    from pydantic_ai import RunContext
    from pydantic_ai.tools import Tool, ToolDefinition
    from pydantic_ai.toolsets import FunctionToolset
except ModuleNotFoundError as exc:
    raise missing_extra("pydantic_ai", "pydantic-ai-slim", "pydantic-ai") from exc

from conduit.client import AsyncClient
from conduit.integrations._programs import LANGUAGES, describe_tool, outcome

__all__ = ["ConduitToolset"]

ExecuteFunction = Callable[..., Awaitable[dict[str, Any]]]


class ConduitToolset(FunctionToolset[Any]):
    """A toolset with one `execute_<language>` tool per language in `languages`.

    `client` is an `AsyncClient` opened by the caller in the event loop the agent runs
    in (and closed by the caller); `allowed_tools` and `limits` are those of `execute`.
    """

    def __init__(
        self,
        client: AsyncClient,
        *,
        languages: Iterable[str] = ("python", "typescript"),
        allowed_tools: Iterable[str] | None = None,
        limits: Mapping[str, int] | None = None,
    ) -> None:
        self.client = client
        self.allowed_tools = list(allowed_tools) if allowed_tools is not None else None
        self.limits = dict(limits) if limits is not None else None
        tools = [self._tool(language) for language in languages]
        super().__init__(tools)

    def _tool(self, language: str) -> Tool[Any]:
        if language not in LANGUAGES:
            raise ValueError(f"no execute tool for {language!r}; choose from {sorted(LANGUAGES)}")
        return Tool(
            self._execute_function(language),
            name=f"execute_{language}",
            description=f"Run a {LANGUAGES[language][0]} program in a Conduit sandbox.",
            prepare=self._describe(language),
        )

    def _execute_function(self, language: str) -> ExecuteFunction:
        async def execute(code: str, inputs: Any = None) -> dict[str, Any]:
            """Run the program and say how it ended.

            Args:
                code: the whole program.
                inputs: JSON data the program reads as the variable `inputs`.
            """
            result = await self.client.execute(
                code,
                language=language,
                allowed_tools=self.allowed_tools,
                limits=self.limits,
                inputs=inputs,
            )
            return outcome(result)

        return execute

    def _describe(
        self, language: str
    ) -> Callable[[RunContext[Any], ToolDefinition], Awaitable[ToolDefinition]]:
        """The `prepare` hook that puts the SDK's declarations in the description."""

        async def prepare(ctx: RunContext[Any], definition: ToolDefinition) -> ToolDefinition:
            declarations = await self.client.sdk(language, allowed_tools=self.allowed_tools)
            return dataclasses.replace(
                definition, description=describe_tool(language, declarations)
            )

        return prepare
