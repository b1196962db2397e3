"""PydanticAI: `execute_python` / `execute_typescript` from ConduitToolset, called by the
framework's own offline models against a real daemon with the echo upstream."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from conduit.client import AsyncClient
from conduit.integrations.pydantic_ai import ConduitToolset
from tests.integrations.conftest import ALLOWED_TOOLS

PROGRAM = "total = tools.echo.add(a=2, b=3)\nprint('adding')\n{'sum': total['sum'] * 10}"


def _returns(messages: list[ModelMessage]) -> dict[str, Any]:
    """Each tool's return, by tool name."""
    return {
        part.tool_name: part.content
        for message in messages
        for part in getattr(message, "parts", ())
        if isinstance(part, ToolReturnPart)
    }


def test_a_function_model_sees_the_typed_sdk_and_gets_the_programs_result(
    socket_path: str,
) -> None:
    shown: dict[str, str] = {}

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returned = _returns(messages)
        if not returned:
            shown.update({tool.name: tool.description or "" for tool in info.function_tools})
            return ModelResponse(parts=[ToolCallPart("execute_python", {"code": PROGRAM})])
        return ModelResponse(parts=[TextPart(json.dumps(returned["execute_python"]))])

    async def run() -> str:
        async with AsyncClient(unix_path=socket_path) as client:
            toolset = ConduitToolset(client, allowed_tools=ALLOWED_TOOLS)
            agent = Agent(FunctionModel(model), toolsets=[toolset])
            return (await agent.run("Add 2 and 3, times ten")).output

    output = json.loads(asyncio.run(run()))
    assert output == {
        "status": "ok",
        "result": {"sum": 50},
        "stdout": "adding\n",
        "stderr": "",
        "error": None,
    }
    assert set(shown) == {"execute_python", "execute_typescript"}
    assert "def add(*, a: int, b: int) -> echo__add__Result:" in shown["execute_python"]
    assert "add(args: {" in shown["execute_typescript"]


def test_the_test_model_calls_both_tools_and_a_failing_program_is_a_result(
    socket_path: str,
) -> None:
    async def run() -> list[ModelMessage]:
        async with AsyncClient(unix_path=socket_path) as client:
            agent = Agent(TestModel(), toolsets=[ConduitToolset(client)])
            return (await agent.run("Run something")).all_messages()

    returned = _returns(asyncio.run(run()))
    # TestModel writes `code` as a plain word: a name neither language defines.
    assert returned["execute_python"]["status"] == "error"
    assert returned["execute_python"]["error"]["type"] == "NameError"
    assert returned["execute_typescript"]["status"] == "error"
    assert returned["execute_typescript"]["error"]["type"] == "ReferenceError"
