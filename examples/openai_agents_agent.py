"""An OpenAI Agents SDK agent with a tool that runs Python in Conduit.

The model is scripted (no model is called, and tracing is off, so nothing leaves the
machine): it calls `execute_python` with a program that uses a daemon tool, then
answers with what the tool returned. Drop `model=` (and `tracing_disabled`) to use
OpenAI's models; the rest stays.

    pip install 'conduit[openai-agents]'
    CONDUIT_SOCKET=/path/to/conduit.sock python examples/openai_agents_agent.py

It expects a daemon with the `echo` upstream (tests/fixtures/mcp_echo_server.py);
tests/test_examples.py runs it against one.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from agents import Agent, Model, ModelResponse, RunConfig, Runner, Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from conduit.client import AsyncClient
from conduit.integrations.openai_agents import conduit_tool

PROGRAM = "total = tools.echo.add(a=2, b=3)\n{'sum': total['sum']}"


class ScriptedModel(Model):
    """Stands in for a model: first a call of the tool, then the tool's answer as text."""

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        items = kwargs["input"]
        outputs = [i["output"] for i in items if i.get("type") == "function_call_output"]
        if not outputs:
            arguments = json.dumps({"code": PROGRAM})
            call = ResponseFunctionToolCall(
                type="function_call", call_id="call_1", name="execute_python", arguments=arguments
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        answer = json.dumps(json.loads(outputs[0])["result"], sort_keys=True)
        text = ResponseOutputText(type="output_text", text=answer, annotations=[])
        message = ResponseOutputMessage(
            id="msg_1", type="message", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the scripted model does not stream")


async def main() -> int:
    async with AsyncClient() as client:
        execute = await conduit_tool(client, allowed_tools=["echo.*"])
        agent = Agent(name="coder", model=ScriptedModel(), tools=[execute])
        config = RunConfig(tracing_disabled=True)
        result = await Runner.run(agent, "Add 2 and 3", run_config=config)
    print(result.final_output)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
