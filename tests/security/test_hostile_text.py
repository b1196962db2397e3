"""The hostile lines and programs that once ended the daemon, kept as regressions.

A lone UTF-16 surrogate (legal JSON text, not encodable as UTF-8), an integer past
Python's 4,300-digit limit, and ids JSON cannot carry back each ended the whole process,
from a client line or from what a program raised, printed or returned, on every
executor. Each now gets an error reply or a result, always strict JSON with U+FFFD in
place of the surrogate, and the daemon goes on serving and recording.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import RawClient
from tests.e2e.helpers import wait_upstreams
from tests.e2e.mcp_helpers import NO_SANDBOXES
from tests.e2e.test_pyodide_tools import share_install
from tests.e2e.test_tools import ECHO
from tests.fuzz.test_fuzz_wire import strict_json

HOSTILE_LINES = [
    pytest.param(
        b'{"jsonrpc":"2.0","id":1,"method":"\\ud800"}', -32601, id="method-lone-surrogate"
    ),
    pytest.param(
        b'{"jsonrpc":"2.0","id":1,"method":"\xed\xa0\x80"}', -32700, id="method-cesu-bytes"
    ),
    pytest.param(b'{"jsonrpc":"2.0","id":"\\udfff","method":"ping"}', None, id="id-lone-surrogate"),
    pytest.param(
        b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"\\ud800":1}}', None, id="key-surrogate"
    ),
    pytest.param(
        b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"n":' + b"9" * 4301 + b"}}",
        -32700,
        id="integer-past-digit-limit",
    ),
    pytest.param(
        b'{"jsonrpc":"2.0","id":' + b"1" * 5000 + b',"method":"ping"}', -32700, id="id-huge"
    ),
    pytest.param(b'{"jsonrpc":"2.0","id":NaN,"method":"ping"}', -32700, id="id-nan"),
    pytest.param(b'{"jsonrpc":"2.0","id":1e400,"method":"ping"}', -32700, id="id-1e400"),
    pytest.param(b'{"jsonrpc":"2.0","id":-Infinity,"method":"ping"}', -32700, id="id-infinity"),
    pytest.param(
        b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":1e999}}', -32700, id="float-inf"
    ),
    pytest.param(b"[" * 100_000, -32700, id="deep-nesting"),
    pytest.param(
        b'{"jsonrpc":"2.0","id":1,"method":"execute","params":{"language":"\\ud800","code":"1"}}',
        -32602,
        id="execute-language-surrogate",
    ),
    pytest.param(
        b'{"jsonrpc":"2.0","id":1,"method":"auth/login","params":{"token":"\\ud800"}}',
        -32002,
        id="login-token-surrogate",
    ),
    pytest.param(
        b'{"jsonrpc":"2.0","id":1,"method":"ping","auth":{"bearerToken":"\\udc00"}}',
        -32002,
        id="bearer-surrogate",
    ),
    pytest.param(b'[{"jsonrpc":"2.0","id":1,"method":"\\ud800"}]', -32601, id="batch-surrogate"),
]


@pytest.mark.parametrize(("line", "code"), HOSTILE_LINES)
@pytest.mark.parametrize("transport", ["unix", "tcp"])
async def test_a_hostile_line_gets_strict_json_and_the_daemon_serves_on(
    start_daemon: Any, connect: Any, line: bytes, code: int | None, transport: str
) -> None:
    # A line is judged before any sandbox is involved: none is started.
    _, info = await start_daemon(server={"tcp": "127.0.0.1:0"}, executors=NO_SANDBOXES)
    client = await connect(info, transport)
    await client.send_line(line)
    reply = strict_json(await raw_line(client))
    message = reply[0] if isinstance(reply, list) else reply
    if code is None:  # the surrogate is only text: replaced, and the call goes on
        assert "result" in message or message["error"]["code"] == -32002, message
    elif transport == "tcp" and code not in (-32700, -32600):
        # Unauthenticated: refused before the method is looked at, still as JSON.
        assert message["error"]["code"] in (code, -32002), message
    else:
        assert message["error"]["code"] == code, message
    fresh = await connect(info)
    assert await fresh.call("ping") == {}


async def raw_line(client: RawClient) -> bytes:
    """The next line exactly as sent, so the test, not the client, judges its JSON."""
    with trio.fail_after(30):
        while b"\n" not in client._buffer:
            chunk = await client.stream.receive_some(65536)
            assert chunk, "the daemon closed the connection"
            client._buffer += chunk
    line, _, client._buffer = client._buffer.partition(b"\n")
    return line


PROGRAMS = {
    "typescript": {
        "raise": 'throw new Error("bad \\ud800 text")',
        "print": 'console.log("out \\ud800"); console.error("err \\udfff"); return 1',
        "return": 'return {"\\ud800": "\\udfff", n: NaN, big: 1e308 * 10}',
    },
    "javascript": {
        "raise": 'throw new Error("bad \\ud800 text")',
        "print": 'console.log("out \\ud800"); console.error("err \\udfff"); 1',
        "return": '({"\\ud800": "\\udfff", n: NaN, big: 1e308 * 10})',
    },
    "python": {
        "raise": 'raise ValueError("bad \\ud800 text")',
        # Python's own stdout refuses a lone surrogate, as CPython does: hostile bytes
        # are what a Python program can write.
        "print": (
            "import sys\n"
            'sys.stdout.buffer.write(b"out \\xed\\xa0\\x80\\n")\n'
            'print("err \\udfff", file=sys.stderr)\n'
            "1"
        ),
        "return": '{"\\ud800": "\\udfff", "n": None, "big": None}',
    },
}
EXECUTORS = [
    ("typescript", "deno"),
    ("javascript", "wasm-js"),
    ("python", "wasm-python"),
    pytest.param("python", "pyodide", marks=pytest.mark.slow),
]


@pytest.fixture
def start_for(
    start_daemon: Callable[..., Any], tmp_path: Path, request: pytest.FixtureRequest
) -> Callable[..., Any]:
    """Start a daemon that serves `executor` (Pyodide is off by default: turn it on,
    with the session's install)."""

    async def start(executor: str, **sections: Any) -> tuple[Any, Any]:
        if executor == "pyodide":
            share_install(tmp_path / "state", request.getfixturevalue("pyodide_install"))
            sections["executors"] = {"pyodide": {"enabled": True, "pool_size": 1}}
        return await start_daemon(**sections)

    return start


@pytest.mark.parametrize(("language", "executor"), EXECUTORS)
async def test_a_program_s_surrogates_and_odd_numbers_come_back_replaced(
    start_for: Callable[..., Any], connect: Any, language: str, executor: str
) -> None:
    _, info = await start_for(executor)
    client = await connect(info)
    answers = {}
    for name, code in PROGRAMS[language].items():
        await client.send(
            {
                "jsonrpc": "2.0",
                "id": name,
                "method": "execute",
                "params": {"language": language, "executor": executor, "code": code},
            }
        )
        answers[name] = strict_json(await raw_line(client))["result"]
    raised, printed, returned = answers["raise"], answers["print"], answers["return"]
    assert raised["status"] == "error", raised
    assert "bad \ufffd text" in raised["error"]["message"], raised
    assert printed["status"] == "ok", printed
    assert "out \ufffd" in printed["stdout"], printed
    # CPython's stderr writes what it cannot encode as an escape, on every platform.
    assert ("err \\udfff" if language == "python" else "err \ufffd") in printed["stderr"]
    assert returned["status"] == "ok", returned
    assert returned["result"] == {"\ufffd": "\ufffd", "n": None, "big": None}, returned
    # The audit writer took all three: the record store still answers, with each of them.
    with trio.fail_after(30):
        while True:
            listed = await client.call("executions/list", {"limit": 10})
            ids = {row["execution_id"] for row in listed["executions"]}
            if {a["execution_id"] for a in answers.values()} <= ids:
                break
            await trio.sleep(0.05)
    assert await client.call("ping") == {}


# An upstream's answer is as hostile as a program's: JSON text with a lone surrogate,
# NaN and a number past a float's range, handed to the program as a value.
UPSTREAM_TEXT = '["\\ud800", 1e999, {"k": NaN}]'
UPSTREAM_PROGRAMS = {
    "typescript": f"return await tools.echo.echo({{text: {json.dumps(UPSTREAM_TEXT)}}})",
    "javascript": f"await tools.echo.echo({{text: {json.dumps(UPSTREAM_TEXT)}}})",
    "python": f"tools.echo.echo(text={UPSTREAM_TEXT!r})",
}


@pytest.mark.parametrize(("language", "executor"), EXECUTORS)
async def test_an_upstream_s_surrogates_and_odd_numbers_reach_a_program_replaced(
    start_for: Callable[..., Any], connect: Any, language: str, executor: str
) -> None:
    server, info = await start_for(executor, upstreams=[ECHO])
    await wait_upstreams(server, "echo")
    client = await connect(info)
    await client.send(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "execute",
            "params": {
                "language": language,
                "executor": executor,
                "code": UPSTREAM_PROGRAMS[language],
            },
        }
    )
    answer = strict_json(await raw_line(client))["result"]
    assert answer["status"] == "ok", answer
    assert answer["result"] == ["\ufffd", None, {"k": None}], answer
