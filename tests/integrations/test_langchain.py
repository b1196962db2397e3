"""LangChain: ConduitTool's `invoke` and `ainvoke`, as a LangChain agent would call it,
on both clients against a real daemon with the echo upstream."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from langchain_core.messages import ToolMessage

from conduit.client import AsyncClient, Client, ExecutionResult
from conduit.integrations.langchain import ConduitTool
from tests.integrations.conftest import ALLOWED_TOOLS

PROGRAM = "print('working')\ntools.echo.add(a=20, b=22)['sum']"


def test_invoke_runs_the_program_and_answers_json_for_the_model(socket_path: str) -> None:
    with Client(unix_path=socket_path) as client:
        tool = ConduitTool.from_client(client, allowed_tools=ALLOWED_TOOLS)
        content = tool.invoke({"code": PROGRAM})
        # A model's tool call: LangChain answers a ToolMessage with the artifact.
        call = {"name": tool.name, "args": {"code": "1 / 0"}, "id": "call_1", "type": "tool_call"}
        message = tool.invoke(call)
    assert tool.name == "execute_python"
    assert "def add(*, a: int, b: int) -> echo__add__Result:" in tool.description
    assert tool.tool_call_schema.model_json_schema()["required"] == ["code"]
    assert json.loads(content) == {
        "status": "ok",
        "result": 42,
        "stdout": "working\n",
        "stderr": "",
        "error": None,
    }
    assert isinstance(message, ToolMessage)
    assert message.tool_call_id == "call_1"
    assert json.loads(message.content)["error"]["type"] == "ZeroDivisionError"
    assert isinstance(message.artifact, ExecutionResult)
    assert message.artifact.status == "error"


def test_ainvoke_runs_on_either_client(socket_path: str) -> None:
    async def run() -> list[Any]:
        async with AsyncClient(unix_path=socket_path) as client:
            tool = await ConduitTool.afrom_client(
                client, language="typescript", allowed_tools=ALLOWED_TOOLS
            )
            code = "const { sum } = await tools.echo.add({ a: 1, b: 2 });\nreturn sum;"
            on_async = await tool.ainvoke({"code": code})
            with pytest.raises(TypeError, match="call ainvoke"):
                tool.invoke({"code": code})
        with Client(unix_path=socket_path) as blocking:
            sync_tool = ConduitTool.from_client(blocking, allowed_tools=ALLOWED_TOOLS)
            on_thread = await sync_tool.ainvoke({"code": PROGRAM})
        return [json.loads(on_async)["result"], json.loads(on_thread)["result"]]

    assert asyncio.run(run()) == [3, 42]


def test_tool_calls_from_many_threads_share_a_blocking_client(socket_path: str) -> None:
    # LangGraph runs a turn's tool calls in threads at once; the blocking client is not
    # thread-safe, so the tool takes turns on it.
    from concurrent.futures import ThreadPoolExecutor

    with Client(unix_path=socket_path) as client:
        tool = ConduitTool.from_client(client)
        with ThreadPoolExecutor(4) as threads:
            answers = list(threads.map(lambda n: tool.invoke({"code": f"{n} * 2"}), range(8)))
    assert [json.loads(answer)["result"] for answer in answers] == [n * 2 for n in range(8)]
