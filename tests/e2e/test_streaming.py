"""`execute {stream: true}`: output as `execution/output` notifications while it runs.

Liveness is proved without timing: each program prints, then spins until the test
cancels it. The test can only cancel after it has seen the first piece of output, so
that piece came while the program ran; a result that says `cancelled` confirms it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RawClient
from tests.e2e.test_pyodide_tools import share_install

# Long enough that only the test's cancel ends these programs.
SPIN_TIMEOUT_MS = 120_000

SPINNERS = {
    "deno": ("typescript", "console.log('first'); while (true) {}"),
    "wasm-python": ("python", "print('first')\nwhile True:\n    pass"),
    "wasm-js": ("javascript", "console.log('first'); while (true) {}"),
}

# The same, waiting instead of spinning: what was printed before a wait streams while the
# guest waits (a Wasmtime guest blocked in a wait runs none of its code meanwhile).
WAITERS = {
    "wasm-python": ("python", "import time\nprint('first')\ntime.sleep(600)"),
    "wasm-js": ("javascript", "console.log('first'); await new Promise((r) => setTimeout(r, 6e5))"),
}

# Output spread over time, on both streams.
SPREAD = {
    "deno": (
        "typescript",
        "console.log('one'); console.error('two');\n"
        "await new Promise((r) => setTimeout(r, 200));\n"
        "console.log('three'); 7",
    ),
    "wasm-python": (
        "python",
        "import sys, time\nprint('one')\nprint('two', file=sys.stderr)\n"
        "time.sleep(0.2)\nprint('three')\n7",
    ),
    "wasm-js": (
        "javascript",
        "console.log('one'); console.error('two');\n"
        "await new Promise((r) => setTimeout(r, 200));\n"
        "console.log('three'); 7",
    ),
}


async def collect(client: RawClient, request_id: int) -> tuple[list[dict[str, Any]], Any]:
    """The `execution/output` params received before the reply to `request_id`, and it."""
    pieces = []
    while True:
        message = await client.recv()
        if message.get("id") == request_id:
            return pieces, message
        assert message["method"] == "execution/output", message
        pieces.append(message["params"])


def joined(pieces: list[dict[str, Any]], stream: str) -> str:
    return "".join(piece["text"] for piece in pieces if piece["stream"] == stream)


async def spin_then_cancel(client: RawClient, language: str, code: str, executor: str) -> None:
    params = {
        "language": language,
        "executor": executor,
        "code": code,
        "stream": True,
        "limits": {"timeout_ms": SPIN_TIMEOUT_MS},
    }
    await client.send({"jsonrpc": "2.0", "id": 1, "method": "execute", "params": params})
    pieces: list[dict[str, Any]] = []
    while joined(pieces, "stdout") != "first\n":  # a guest may write the newline apart
        message = await client.recv()
        assert message["method"] == "execution/output", message
        pieces.append(message["params"])
    assert [piece["seq"] for piece in pieces] == list(range(len(pieces)))
    execution_id = pieces[0]["execution_id"]
    assert execution_id.startswith("ex_")
    cancel = {"request_id": 1}
    await client.send({"jsonrpc": "2.0", "id": 2, "method": "executions/cancel", "params": cancel})
    replies = {}
    while len(replies) < 2:
        message = await client.recv()
        replies[message["id"]] = message
    result = replies[1]["result"]
    assert result["status"] == "cancelled", result
    assert result["stdout"] == "first\n"
    assert result["execution_id"] == execution_id


LIVE = [(executor, "spinning", *program) for executor, program in sorted(SPINNERS.items())] + [
    (executor, "waiting", *program) for executor, program in sorted(WAITERS.items())
]


@pytest.mark.parametrize(
    ("executor", "language", "code"),
    [(executor, language, code) for executor, _, language, code in LIVE],
    ids=[f"{executor}-{how}" for executor, how, *_ in LIVE],
)
async def test_output_arrives_while_the_program_runs(
    start_daemon: Any, connect: Any, executor: str, language: str, code: str
) -> None:
    _, info = await start_daemon()
    client = await connect(info)
    await spin_then_cancel(client, language, code, executor)


@pytest.mark.parametrize("executor", sorted(SPREAD))
async def test_pieces_come_in_order_before_the_result_and_add_up_to_it(
    start_daemon: Any, connect: Any, executor: str
) -> None:
    _, info = await start_daemon()
    client = await connect(info)
    language, code = SPREAD[executor]
    params = {"language": language, "executor": executor, "code": code, "stream": True}
    await client.send({"jsonrpc": "2.0", "id": 1, "method": "execute", "params": params})
    pieces, reply = await collect(client, 1)
    result = reply["result"]
    assert result["status"] == "ok", result
    assert result["result"] == 7
    assert [piece["seq"] for piece in pieces] == list(range(len(pieces)))
    assert {piece["execution_id"] for piece in pieces} == {result["execution_id"]}
    assert {piece["request_id"] for piece in pieces} == {1}
    assert joined(pieces, "stdout") == result["stdout"] == "one\nthree\n"
    assert joined(pieces, "stderr") == result["stderr"] == "two\n"
    # "three" was printed 200 ms after the rest: never in the same piece as "one".
    assert not any("one" in piece["text"] and "three" in piece["text"] for piece in pieces)
    # Nothing of it follows the result.
    assert (await client.request("ping"))["result"] == {}


@pytest.mark.parametrize("executor", ["wasm-python", "wasm-js"])
async def test_in_process_guests_keep_the_order_across_streams(
    start_daemon: Any, connect: Any, executor: str
) -> None:
    """A Wasmtime guest's writes reach the host in one sequence, so that order is kept."""
    if executor == "wasm-python":
        language = "python"
        code = (
            "import sys\nfor i in range(5):\n"
            "    print(f'o{i}')\n    print(f'e{i}', file=sys.stderr)"
        )
    else:
        language = "javascript"
        code = "for (let i = 0; i < 5; i++) { console.log(`o${i}`); console.error(`e${i}`); }"
    _, info = await start_daemon()
    client = await connect(info)
    params = {"language": language, "executor": executor, "code": code, "stream": True}
    await client.send({"jsonrpc": "2.0", "id": 1, "method": "execute", "params": params})
    pieces, _ = await collect(client, 1)
    runs: list[list[str]] = []  # the text of each run of pieces on one stream
    for piece in pieces:
        if runs and runs[-1][0] == piece["stream"]:
            runs[-1][1] += piece["text"]
        else:
            runs.append([piece["stream"], piece["text"]])
    expected = [
        [stream, f"{tag}{i}\n"]
        for i in range(5)
        for stream, tag in (("stdout", "o"), ("stderr", "e"))
    ]
    assert runs == expected


async def test_without_stream_there_are_no_notifications(client: RawClient) -> None:
    code = "console.log('quiet')"
    await client.send(
        {"jsonrpc": "2.0", "id": 1, "method": "execute", "params": {"language": "ts", "code": code}}
    )
    pieces, reply = await collect(client, 1)
    assert pieces == []
    assert reply["result"]["stdout"] == "quiet\n"


async def test_streamed_output_stops_at_the_output_limit(client: RawClient) -> None:
    code = "for (let i = 0; i < 1000; i++) console.log('x'.repeat(99));"
    params = {
        "language": "typescript",
        "code": code,
        "stream": True,
        "limits": {"output_bytes": 1000},
    }
    await client.send({"jsonrpc": "2.0", "id": 1, "method": "execute", "params": params})
    pieces, reply = await collect(client, 1)
    result = reply["result"]
    assert result["status"] == "output_limit"
    assert joined(pieces, "stdout") == result["stdout"]
    assert len(result["stdout"]) == 1000


async def test_a_client_that_stops_reading_cannot_stretch_the_timeout(
    start_daemon: Any, connect: Any
) -> None:
    """Streaming gives up on a client that takes nothing; the program's limit holds."""
    _, info = await start_daemon()
    watcher = await connect(info)
    await watcher.call("events/subscribe", {"types": ["execution.timed_out"]})
    stuck = await connect(info)
    # 40,000 pieces of output (each write to stderr ends one of stdout: the streams
    # keep their order): far more than the socket and the connection's outbox hold.
    # Then the program runs until its timeout.
    code = (
        "import sys\nfor _ in range(20_000):\n"
        "    print('y' * 40)\n    print('e', file=sys.stderr)\nwhile True:\n    pass"
    )
    params = {
        "language": "python",
        "code": code,
        "stream": True,
        "limits": {"timeout_ms": 3000, "output_lines": 100_000},
    }
    await stuck.send({"jsonrpc": "2.0", "id": 1, "method": "execute", "params": params})
    # The execution ends on its timeout while its client still reads nothing.
    ended = await watcher.recv()
    assert ended["params"]["type"] == "execution.timed_out"
    pieces, reply = await collect(stuck, 1)
    result = reply["result"]
    assert result["status"] == "timeout", result["status"]
    assert result["execution_id"] == ended["params"]["execution_id"]
    assert set(result["stdout"]) == {"y", "\n"}
    streamed = joined(pieces, "stdout")
    assert result["stdout"].startswith(streamed)
    assert len(streamed) < len(result["stdout"])  # streaming gave up; the result has it all


async def test_seed_aliases_still_answer_their_shape(client: RawClient) -> None:
    result = await client.call("mcp_execute_typescript", {"code": "console.log('hi')"})
    assert result == {"stdout": "hi\n", "stderr": "", "exitCode": 0}


async def test_builtin_execute_tools_stream_too(client: RawClient) -> None:
    arguments = {"code": "print('via tool')", "stream": True}
    params = {"name": "execute_python", "arguments": arguments}
    await client.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
    pieces, reply = await collect(client, 1)
    assert joined(pieces, "stdout") == "via tool\n"
    assert reply["result"]["structuredContent"]["stdout"] == "via tool\n"


@pytest.mark.slow
async def test_pyodide_streams_while_the_program_runs(
    start_daemon: Any, connect: Any, tmp_path: Path, pyodide_install: Path
) -> None:
    share_install(tmp_path / "state", pyodide_install)
    _, info = await start_daemon(executors={"pyodide": {"enabled": True, "pool_size": 1}})
    client = await connect(info)
    await spin_then_cancel(client, "python", "print('first')\nwhile True:\n    pass", "pyodide")
