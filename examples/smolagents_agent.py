"""A smolagents `CodeAgent` whose every step runs in Conduit, in one session.

The model is scripted (no model is called): its first step calls a daemon tool and
keeps the sum in a variable, its second calls the agent's own `double` tool, defined in
the sandbox from its source, and hands in the final answer. Swap `ScriptedModel` for a
real smolagents model (InferenceClientModel, LiteLLMModel, ...) and the rest stays.

    pip install 'conduit[smolagents]'
    CONDUIT_SOCKET=/path/to/conduit.sock python examples/smolagents_agent.py

It expects a daemon with the `echo` upstream (tests/fixtures/mcp_echo_server.py);
tests/test_examples.py runs it against one.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from smolagents import CodeAgent, tool
from smolagents.models import ChatMessage, MessageRole, Model
from smolagents.monitoring import LogLevel

from conduit.client import Client
from conduit.integrations.smolagents import ConduitExecutor

STEPS = [
    "total = tools.echo.add(a=2, b=3)['sum']\nprint('the sandbox added', total)",
    # `total` is still defined: both steps run in the same Conduit session.
    "final_answer({'sum': total, 'doubled': double(total)})",
]


class ScriptedModel(Model):
    """Stands in for a model: each step's answer is the next scripted code."""

    def __init__(self) -> None:
        super().__init__(model_id="scripted")
        self.steps = list(STEPS)

    def generate(self, messages: list[Any], **kwargs: Any) -> ChatMessage:
        code = self.steps.pop(0)
        return ChatMessage(
            role=MessageRole.ASSISTANT, content=f"Thought: go\n<code>\n{code}\n</code>"
        )


@tool
def double(n: int) -> int:
    """Doubles a number.

    Args:
        n: the number to double.
    """
    return n * 2


def main() -> int:
    with Client() as client:
        executor = ConduitExecutor(client, allowed_tools=["echo.*"])
        with CodeAgent(
            tools=[double],
            model=ScriptedModel(),
            executor=executor,
            instructions=executor.sdk_instructions(),
            verbosity_level=LogLevel.OFF,
        ) as agent:
            answer = agent.run("Add 2 and 3 with the echo tools, then double the sum")
    print(json.dumps(answer, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
