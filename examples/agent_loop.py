"""An agent's loop in miniature, on `conduit.client`: show the model the tools it may
call, run the program it writes, hand failures back to it, and stop on success.

The "model" here is a scripted one: its first program calls a tool with a wrong
argument, as models do; the loop hands the ToolError back, and its second program
calls two upstream tools and returns a result. Swap `ScriptedModel` for a real model
call and the loop stays the same.

    CONDUIT_SOCKET=/path/to/conduit.sock python examples/agent_loop.py

It expects a daemon with two upstreams, `echo` (tests/fixtures/mcp_echo_server.py) and
`time` (PyPI mcp-server-time), and `[gateway] strict = true`, so that a wrong argument
is refused with a message naming it, which is what a model needs to fix its program;
tests/test_examples.py runs it against such a daemon.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field

from conduit.client import Client, ExecutionResult

# A model that never gets it right should not loop for ever.
MAX_TURNS = 4
ALLOWED_TOOLS = ["echo.*", "time.get_current_time"]


@dataclass
class ScriptedModel:
    """Stands in for a model: it answers each prompt with its next program."""

    programs: list[str] = field(
        default_factory=lambda: [
            # A plausible first try: `sum` is not an argument of echo.add.
            "total = tools.echo.add(sum=[2, 3])\ntotal",
            # Corrected after reading the ToolError, and using a second upstream.
            "said = tools.echo.echo(text='hello from the sandbox')\n"
            "total = tools.echo.add(a=2, b=3)\n"
            "now = tools.time.get_current_time(timezone='UTC')\n"
            "{'said': said, 'sum': total['sum'], 'timezone': now['timezone']}",
        ]
    )

    def write_program(self, prompt: str) -> str:
        return self.programs.pop(0)


def prompt_for(declarations: str, feedback: str | None) -> str:
    """What the model would be shown: the typed SDK, and why the last try failed."""
    text = f"Write Python that uses these tools:\n{declarations}"
    if feedback:
        text += f"\nYour last program failed:\n{feedback}\nFix it."
    return text


def feedback_of(result: ExecutionResult) -> str:
    error = result.error
    detail = f"{error.type}: {error.message}" if error else ""
    return f"status {result.status}. {detail}\n{result.stderr}".strip()


def run_agent(client: Client, model: ScriptedModel) -> ExecutionResult:
    declarations = client.sdk("python", allowed_tools=ALLOWED_TOOLS)
    feedback = None
    for turn in range(1, MAX_TURNS + 1):
        code = model.write_program(prompt_for(declarations, feedback))
        result = client.execute(code, language="python", allowed_tools=ALLOWED_TOOLS)
        print(f"turn {turn}: {result.status} ({result.tool_calls} tool calls)")
        if result.ok:
            return result
        feedback = feedback_of(result)
        print(f"  fed back: {feedback.splitlines()[0]}")
    raise SystemExit(f"no working program in {MAX_TURNS} turns")


def main() -> int:
    with Client() as client:
        result = run_agent(client, ScriptedModel())
    print(json.dumps(result.result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
