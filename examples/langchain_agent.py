"""A LangChain (langchain-core) tool-calling loop with a tool that runs Python in
Conduit.

The chat model is langchain-core's `FakeMessagesListChatModel`, scripted (no model is
called): it asks for `execute_python` with a program that uses a daemon tool, then
answers. The loop is the usual one: run each tool call, append the ToolMessage, ask
again. With a real chat model, `model.bind_tools([execute])` and the same loop.

    pip install 'conduit[langchain]'
    CONDUIT_SOCKET=/path/to/conduit.sock python examples/langchain_agent.py

It expects a daemon with the `echo` upstream (tests/fixtures/mcp_echo_server.py);
tests/test_examples.py runs it against one.
"""

from __future__ import annotations

import json
import sys

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from conduit.client import Client
from conduit.integrations.langchain import ConduitTool

PROGRAM = (
    "said = tools.echo.echo(text='hi')\n{'said': said, 'sum': tools.echo.add(a=2, b=3)['sum']}"
)
CALL = {"name": "execute_python", "args": {"code": PROGRAM}, "id": "call_1"}
MODEL = FakeMessagesListChatModel(
    responses=[AIMessage(content="", tool_calls=[CALL]), AIMessage(content="done")]
)


def main() -> int:
    with Client() as client:
        execute = ConduitTool.from_client(client, allowed_tools=["echo.*"])
        messages: list[BaseMessage] = [HumanMessage("Echo hi and add 2 and 3")]
        while True:
            reply = MODEL.invoke(messages)
            messages.append(reply)
            if not isinstance(reply, AIMessage) or not reply.tool_calls:
                break
            for call in reply.tool_calls:
                messages.append(execute.invoke(call))
    (tool_message,) = [m for m in messages if isinstance(m, ToolMessage)]
    print(f"{tool_message.artifact.status} ({tool_message.artifact.tool_calls} tool calls)")
    print(json.dumps(json.loads(tool_message.content)["result"], sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
