"""OpenAI Agents SDK: the tool from `conduit_tool`, run by the SDK's `Runner` with a
scripted model (no model is called, no trace is sent) against a real daemon."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agents import Agent, Model, ModelResponse, RunConfig, Runner, Usage
from agents.tool_context import ToolContext
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from conduit.client import AsyncClient
from conduit.integrations.openai_agents import conduit_tool
from tests.integrations.conftest import ALLOWED_TOOLS

PROGRAM = "said = tools.echo.echo(text='from the sandbox')\nprint(said)\nlen(said)"


class ScriptedModel(Model):
    """Calls the tool with PROGRAM, then answers with what the tool returned."""

    def __init__(self) -> None:
        self.tools: list[Any] = []

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        items, tools = kwargs["input"], kwargs["tools"]
        outputs = [i["output"] for i in items if i.get("type") == "function_call_output"]
        if not outputs:
            self.tools = tools
            call = ResponseFunctionToolCall(
                type="function_call",
                call_id="call_1",
                name="execute_python",
                arguments=json.dumps({"code": PROGRAM}),
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        text = ResponseOutputText(type="output_text", text=outputs[0], annotations=[])
        message = ResponseOutputMessage(
            id="msg_1", type="message", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def test_the_runner_calls_the_tool_and_the_model_reads_the_programs_outcome(
    socket_path: str,
) -> None:
    model = ScriptedModel()

    async def run() -> str:
        async with AsyncClient(unix_path=socket_path) as client:
            tool = await conduit_tool(client, allowed_tools=ALLOWED_TOOLS)
            agent = Agent(name="coder", model=model, tools=[tool])
            config = RunConfig(tracing_disabled=True)
            result = await Runner.run(agent, "Echo something", run_config=config)
            return str(result.final_output)

    assert json.loads(asyncio.run(run())) == {
        "status": "ok",
        "result": 16,
        "stdout": "from the sandbox\n",
        "stderr": "",
        "error": None,
    }
    (tool,) = model.tools
    assert tool.name == "execute_python"
    assert "def echo(*, text: str) -> Any:" in tool.description
    assert tool.params_json_schema["required"] == ["code"]


def test_a_typescript_tool_answers_a_failing_program_with_its_error(socket_path: str) -> None:
    async def run() -> dict[str, Any]:
        async with AsyncClient(unix_path=socket_path) as client:
            tool = await conduit_tool(client, language="typescript", allowed_tools=["echo.add"])
            assert "add(args: {" in tool.description
            assert "echo(args" not in tool.description  # outside allowed_tools
            arguments = json.dumps({"code": "await tools.echo.echo({text: 'x'})"})
            context = ToolContext(
                context=None,
                tool_name=tool.name,
                tool_call_id="call_1",
                tool_arguments=arguments,
            )
            return json.loads(await tool.on_invoke_tool(context, arguments))

    answer = asyncio.run(run())
    assert answer["status"] == "error"
    assert answer["error"]["type"] == "ToolError"
    assert "not allowed here" in answer["error"]["message"]


def test_arguments_without_a_program_are_told_to_the_model(socket_path: str) -> None:
    async def run() -> list[dict[str, Any]]:
        async with AsyncClient(unix_path=socket_path) as client:
            tool = await conduit_tool(client)
            answers = []
            for arguments in ("not json", "[1]", '{"code": 3}', "{}"):
                context = ToolContext(
                    context=None,
                    tool_name=tool.name,
                    tool_call_id="call_1",
                    tool_arguments=arguments,
                )
                answers.append(json.loads(await tool.on_invoke_tool(context, arguments)))
            return answers

    for answer in asyncio.run(run()):
        assert answer["status"] == "error"
        assert '{"code":' in answer["error"]["message"]
