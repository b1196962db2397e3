"""smolagents: a `CodeAgent` whose every step runs in Conduit, driven by a scripted model
(no model is called), against a real daemon with the echo upstream."""

from __future__ import annotations

from typing import Any

import pytest
from smolagents import CodeAgent, tool
from smolagents.models import ChatMessage, MessageRole, Model
from smolagents.monitoring import LogLevel
from smolagents.utils import AgentError

from conduit.client import Client
from conduit.integrations.smolagents import ConduitExecutor
from tests.integrations.conftest import ALLOWED_TOOLS


class ScriptedModel(Model):
    """Answers each step with the next scripted code, and keeps what it was shown."""

    def __init__(self, steps: list[str]) -> None:
        super().__init__(model_id="scripted")
        self.steps = list(steps)
        self.shown: list[str] = []

    def generate(self, messages: list[Any], **kwargs: Any) -> ChatMessage:
        self.shown.append(str(messages[-1]))
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


def _agent(model: Model, executor: ConduitExecutor) -> CodeAgent:
    return CodeAgent(
        tools=[double],
        model=model,
        executor=executor,
        max_steps=4,
        verbosity_level=LogLevel.OFF,
        instructions=executor.sdk_instructions(),
    )


def test_a_code_agent_runs_its_steps_in_one_session_with_both_kinds_of_tools(
    socket_path: str,
) -> None:
    model = ScriptedModel(
        [
            # A wrong argument: the daemon's strict validation names it, and the model
            # is shown that.
            "total = tools.echo.add(sum=[2, 3])",
            "import sys\ntotal = tools.echo.add(a=2, b=3)['sum']\nprint('sum', total)",
            # `total` is still there: the same session. `double` is the agent's own tool,
            # defined in the sandbox from its source; sys.platform says where it ran.
            "final_answer({'sum': total, 'doubled': double(total), 'where': sys.platform})",
        ]
    )
    with Client(unix_path=socket_path) as client:
        executor = ConduitExecutor(client, allowed_tools=ALLOWED_TOOLS)
        with _agent(model, executor) as agent:
            answer = agent.run("Add 2 and 3, then double it")
            (session,) = client.sessions()
            assert session.steps == 4  # the tools' definitions, then the three steps
            # A second run goes on in the same session, its tools sent again.
            model.steps = ["final_answer(double(total) + 1)"]
            again = agent.run("Once more", reset=False)
            assert [s.session_id for s in client.sessions()] == [session.session_id]
        assert client.sessions() == []  # closed with the agent
    assert answer == {"sum": 5, "doubled": 10, "where": "wasi"}
    assert again == 11
    assert "invalid arguments for echo__add" in model.shown[1]
    assert "sum 5" in model.shown[2]  # the step's print() came back as its logs


def test_without_a_session_each_step_runs_in_a_fresh_sandbox_with_the_tools(
    socket_path: str,
) -> None:
    model = ScriptedModel(
        [
            "kept = 1",
            "try:\n    kept\nexcept NameError:\n    kept = 'gone'\n"
            "final_answer([kept, double(21)])",
        ]
    )
    with Client(unix_path=socket_path) as client:
        executor = ConduitExecutor(client, allowed_tools=ALLOWED_TOOLS, use_session=False)
        with _agent(model, executor) as agent:
            answer = agent.run("Show that nothing is kept", additional_args={"seed": 7})
            assert client.sessions() == []
    assert answer == ["gone", 42]


def test_a_step_that_times_out_is_shown_with_its_status_and_the_state_is_sent_again(
    socket_path: str,
) -> None:
    with Client(unix_path=socket_path) as client:
        executor = ConduitExecutor(client, limits={"timeout_ms": 1500})
        try:
            executor.send_variables({"seed": 7})
            with pytest.raises(AgentError, match=r"status timeout"):
                executor("while True:\n    pass")
            (session,) = client.sessions()
            assert session.resets == 1  # the timeout left a fresh sandbox, without `seed`
            assert executor("seed * 6").output == 42
        finally:
            executor.cleanup()


def test_a_session_that_ended_is_replaced_and_given_the_definitions_again(
    socket_path: str,
) -> None:
    with Client(unix_path=socket_path) as client:
        executor = ConduitExecutor(client)
        try:
            executor.send_variables({"seed": 7})
            assert executor("seed").output == 7
            (first,) = client.sessions()
            # As if it had expired while the agent was thinking.
            client.call("sessions/close", {"session_id": first.session_id})
            assert executor("seed + 1").output == 8
            (second,) = client.sessions()
            assert second.session_id != first.session_id
        finally:
            executor.cleanup()
        assert client.sessions() == []


def test_a_forged_pickled_final_answer_is_never_unpickled(socket_path: str) -> None:
    # The program writes the final-answer message: even where the app allows pickle for
    # its own variables, what comes back from the sandbox is never unpickled.
    forged = (
        "import base64, pickle\n"
        "class Boom:\n"
        "    def __reduce__(self):\n"
        "        return (print, ('HOST CODE RAN',))\n"
        "class FinalAnswerException(BaseException):\n"
        "    pass\n"
        "raise FinalAnswerException('pickle:' + base64.b64encode(pickle.dumps(Boom())).decode())"
    )
    with Client(unix_path=socket_path) as client:
        executor = ConduitExecutor(client, allow_pickle=True)
        try:
            with pytest.raises(Exception, match=r"(?i)pickle"):
                executor(forged)
        finally:
            executor.cleanup()


def test_a_daemon_refusing_the_config_stops_the_run_instead_of_the_model_guessing(
    socket_path: str,
) -> None:
    model = ScriptedModel(["final_answer(1)"])
    with Client(unix_path=socket_path) as client:
        executor = ConduitExecutor(client, allowed_tools=["ech*"])  # not a valid pattern
        agent = CodeAgent(tools=[], model=model, executor=executor, verbosity_level=LogLevel.OFF)
        with pytest.raises(Exception, match="allowed_tools"):
            agent.run("Answer 1")
        executor.cleanup()
    assert model.shown == []  # the model was never asked


def test_the_model_is_told_of_a_reset_and_shown_bounded_output(socket_path: str) -> None:
    with Client(unix_path=socket_path) as client:
        executor = ConduitExecutor(client, limits={"timeout_ms": 1500})
        try:
            with pytest.raises(AgentError, match="sandbox was reset"):
                executor("while True:\n    pass")
            printed = executor("print('x' * 1_000_000)")
            assert len(printed.logs) < 25_000
            assert "characters left out" in printed.logs
        finally:
            executor.cleanup()
