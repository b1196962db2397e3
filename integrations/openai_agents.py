"""An OpenAI Agents SDK tool that runs a program in Conduit.

```python
from conduit.client import AsyncClient
from conduit.integrations.openai_agents import conduit_tool

async with AsyncClient() as client:
    execute = await conduit_tool(client, allowed_tools=["echo.*"])
    agent = Agent(name="coder", tools=[execute])
    result = await Runner.run(agent, "Add 2 and 3 with the echo tools")
```

The tool (`execute_python`, or `execute_<language>`) takes one argument, `code`, under a
strict schema, and answers the model with JSON text: `{status, result, stdout, stderr,
error}`. A program that fails is such an answer, so the model sees why; errors of the
connection or the daemon are raised as `conduit.client` errors and reach the SDK's
own tool-error handling. Its description holds the typed `tools.*` declarations
(`sdk/get`) for exactly `allowed_tools`, asked for once, when the tool is made.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from conduit.integrations._extras import missing_extra

try:
    from agents import FunctionTool, RunContextWrapper
except ModuleNotFoundError as exc:
    raise missing_extra("openai_agents", "openai-agents", "openai-agents") from exc

from conduit.client import AsyncClient
from conduit.integrations._programs import LANGUAGES, describe_tool, outcome

__all__ = ["conduit_tool"]

BAD_ARGUMENTS = 'the arguments must be a JSON object {"code": "<the whole program>"}'


def _parameters(language: str) -> dict[str, Any]:
    """The tool's arguments, in the strict form the SDK sends models by default."""
    return {
        "type": "object",
        "properties": {
            "code": {
                "type": "string",
                "description": f"The whole {LANGUAGES[language][0]} program.",
            }
        },
        "required": ["code"],
        "additionalProperties": False,
    }


async def conduit_tool(
    client: AsyncClient,
    *,
    language: str = "python",
    allowed_tools: Iterable[str] | None = None,
    limits: Mapping[str, int] | None = None,
) -> FunctionTool:
    """A `FunctionTool` that runs `language` programs through `client` (an `AsyncClient`
    the caller opened in the agent's event loop and closes); `allowed_tools` and
    `limits` are those of `execute`."""
    if language not in LANGUAGES:
        raise ValueError(f"no execute tool for {language!r}; choose from {sorted(LANGUAGES)}")
    allowed = list(allowed_tools) if allowed_tools is not None else None
    declarations = await client.sdk(language, allowed_tools=allowed)

    async def invoke(context: RunContextWrapper[Any], arguments: str) -> str:
        code = _code_of(arguments)
        if code is None:  # the model's mistake, told to the model
            return json.dumps({"status": "error", "error": {"message": BAD_ARGUMENTS}})
        result = await client.execute(code, language=language, allowed_tools=allowed, limits=limits)
        return json.dumps(outcome(result))

    return FunctionTool(
        name=f"execute_{language}",
        description=describe_tool(language, declarations),
        params_json_schema=_parameters(language),
        on_invoke_tool=invoke,
    )


def _code_of(arguments: str) -> str | None:
    """The program in the model's arguments, or None if they hold none."""
    try:
        code = json.loads(arguments).get("code")
    except (ValueError, AttributeError):
        return None
    return code if isinstance(code, str) else None
