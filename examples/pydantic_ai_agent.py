"""A PydanticAI agent with Conduit's `execute_python` and `execute_typescript` tools.

The model is PydanticAI's `FunctionModel`, scripted (no model is called): it reads the
typed SDK in the tool's description, calls `execute_python` with a program that uses
two daemon tools, and answers with the program's result. Swap it for a real model
(`Agent("openai:gpt-5", ...)`) and the rest stays.

    pip install 'conduit[pydantic-ai]'
    CONDUIT_SOCKET=/path/to/conduit.sock python examples/pydantic_ai_agent.py

It expects a daemon with the `echo` upstream (tests/fixtures/mcp_echo_server.py);
tests/test_examples.py runs it against one.
"""

from __future__ import annotations

import asyncio
import json
import sys

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from conduit.client import AsyncClient
from conduit.integrations.pydantic_ai import ConduitToolset

PROGRAM = (
    "said = tools.echo.echo(text='hello from the sandbox')\n"
    "total = tools.echo.add(a=2, b=3)\n"
    "{'said': said, 'sum': total['sum']}"
)


def scripted_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """First turn: run PROGRAM (its tool is described with the SDK); then: its result."""
    returned = [
        part.content
        for message in messages
        for part in getattr(message, "parts", ())
        if isinstance(part, ToolReturnPart)
    ]
    if not returned:
        (python,) = [tool for tool in info.function_tools if tool.name == "execute_python"]
        assert "def add(*, a: int, b: int)" in (python.description or "")
        return ModelResponse(parts=[ToolCallPart("execute_python", {"code": PROGRAM})])
    return ModelResponse(parts=[TextPart(json.dumps(returned[0]["result"], sort_keys=True))])


async def main() -> int:
    async with AsyncClient() as client:
        toolset = ConduitToolset(client, allowed_tools=["echo.*"])
        agent = Agent(FunctionModel(scripted_model), toolsets=[toolset])
        result = await agent.run("Echo a greeting and add 2 and 3")
    print(result.output)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
