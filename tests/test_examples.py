"""The examples in `examples/` run, and say what really happens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.daemon.server import ServingInfo
from tests.conftest import WAIT_S, RawClient, link_wasm_cache
from tests.e2e.helpers import daemon_in_a_thread, wait_upstreams
from tests.e2e.test_tools import ECHO, TIME
from tests.served import Served

# Each example against a real daemon, end to end.
pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# What differs from one run to the next, and so is compared by presence only.
VOLATILE = frozenset({"execution_id", "duration_ms", "queue_ms"})


def _steady(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: "…" if k in VOLATILE else _steady(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_steady(item) for item in value]
    return value


def _exchanges(transcript: str) -> list[tuple[str, list[str]]]:
    """Each typed line with the answer lines that follow it."""
    exchanges: list[tuple[str, list[str]]] = []
    for line in transcript.splitlines():
        if line.startswith("> "):
            exchanges.append((line[2:], []))
        elif line.startswith("< "):
            exchanges[-1][1].append(line[2:])
    return exchanges


async def test_the_nc_transcript_is_what_the_daemon_answers(daemon: Any, connect: Any) -> None:
    client: RawClient = await connect(daemon[1])
    exchanges = _exchanges((EXAMPLES / "nc-session.txt").read_text())
    assert len(exchanges) >= 8
    for typed, answers in exchanges:
        await client.send_line(typed)
        for expected in answers:
            actual = await client.recv()
            assert _steady(actual) == _steady(json.loads(expected)), (
                f"after typing {typed}\nthe daemon answered {json.dumps(actual)}\n"
                "update examples/nc-session.txt if the change is meant"
            )


async def test_socket_activation_starts_the_daemon_on_the_first_connection(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("CONDUIT_TOKEN", None)
    env.pop("CONDUIT_CONFIG", None)
    with trio.fail_after(WAIT_S * 2):
        done = await trio.run_process(
            [str(EXAMPLES / "socket-activation.sh"), str(tmp_path / "state")],
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    log = done.stderr.decode()
    assert done.returncode == 0, log
    assert done.stdout.decode().split("\n")[:2] == ["[2, 4, 6]", "{}"]
    assert "Execing" in log  # the activator started the daemon only when asked
    assert '"msg": "stopped"' in log  # and the daemon drained when the example ended
    leftover = await trio.run_process(
        ["pgrep", "-f", str(tmp_path)], capture_stdout=True, check=False
    )
    assert leftover.stdout == b""


async def test_the_agent_loop_feeds_a_failure_back_and_ends_with_two_upstreams_answers(
    start_daemon: Any,
) -> None:
    # Strict validation tells the model which argument was wrong, before the upstream
    # ever sees the call.
    server, info = await start_daemon(upstreams=[ECHO, TIME], gateway={"strict": True})
    await wait_upstreams(server, "echo", "time")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONDUIT_")}
    env["CONDUIT_SOCKET"] = info.unix_path
    with trio.fail_after(WAIT_S * 2):
        done = await trio.run_process(
            [sys.executable, str(EXAMPLES / "agent_loop.py")],
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode()
    lines = done.stdout.decode().splitlines()
    assert lines[0] == "turn 1: error (1 tool calls)"
    assert "invalid arguments for echo__add" in lines[1], lines[1]
    assert "'a' is a required property" in lines[1], lines[1]
    assert lines[2] == "turn 2: ok (3 tool calls)"
    assert json.loads(lines[3]) == {"said": "hello from the sandbox", "sum": 5, "timezone": "UTC"}


@pytest.fixture(scope="module")
def echo_daemon(
    tmp_path_factory: pytest.TempPathFactory, wasm_cache: Path
) -> Iterator[Served[ServingInfo]]:
    """One daemon with the echo upstream for the agent frameworks' examples."""
    state = tmp_path_factory.mktemp("frameworks") / "state"
    link_wasm_cache(state, wasm_cache)
    settings = {"executors.deno.pool_size": 1, "gateway.strict": True, "upstreams": [ECHO]}
    with daemon_in_a_thread(state, settings, upstreams=("echo",)) as served:
        yield served


# Each framework's example, and the last lines it prints: what its scripted model's
# program computed in the sandbox, through the echo upstream.
FRAMEWORK_EXAMPLES = {
    "smolagents_agent.py": ['{"doubled": 10, "sum": 5}'],
    "pydantic_ai_agent.py": ['{"said": "hello from the sandbox", "sum": 5}'],
    "openai_agents_agent.py": ['{"sum": 5}'],
    "langchain_agent.py": ["ok (2 tool calls)", '{"said": "hi", "sum": 5}'],
}


@pytest.mark.parametrize("example", sorted(FRAMEWORK_EXAMPLES))
def test_each_frameworks_example_runs_its_agent_in_conduit(
    echo_daemon: Served[ServingInfo], example: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONDUIT_")}
    env["CONDUIT_SOCKET"] = str(echo_daemon.value.unix_path)
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / example)],
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT_S * 2,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    expected = FRAMEWORK_EXAMPLES[example]
    assert done.stdout.splitlines()[-len(expected) :] == expected, done.stdout
