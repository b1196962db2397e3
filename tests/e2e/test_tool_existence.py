"""A sandbox cannot tell a tool that does not exist from one it may not call.

Both get one answer: the same code, message and data, with nothing in it but the
name as the program sent it; so does a client token limited by `allowed_tools`. A
client that may call every tool is told what is missing, with close matches.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from conduit.core.errors import Forbidden, NotFound
from conduit.daemon.auth import hash_token
from tests.conftest import RawClient
from tests.e2e.helpers import execute, wait_upstreams
from tests.fixtures.mcp_echo_server import command as echo_command

ECHO = {
    "name": "echo",
    "transport": "stdio",
    "command": echo_command()[0],
    "args": echo_command()[1:],
}
# Pairs of names a program might try: the first names a tool that exists and its
# allowlist (`echo.echo` alone) excludes, the second one that does not exist.
PAIRS = [
    ("echo.add", "echo.sub"),  # by SDK path
    ("echo__add", "echo__sub"),  # by tool id
    ("echo.fail", "echo.echo2"),  # the second is one letter from the allowed tool
]
TOKEN = "cdt_tool-existence-client-0123456789abcdef"
AGENT = {"name": "agent", "sha256": hash_token(TOKEN), "allowed_tools": ["echo.echo"]}


def _named(answer: Any, name: str) -> str:
    """An answer as JSON with `name` written as NAME: what is left must not differ."""
    return json.dumps(answer, sort_keys=True).replace(name, "NAME")


@pytest.fixture
async def echoing(start_daemon: Any, connect: Any) -> tuple[Any, RawClient]:
    server, info = await start_daemon(upstreams=[ECHO], auth={"clients": [AGENT]})
    await wait_upstreams(server, "echo")
    return server, await connect(info)


async def test_a_program_gets_one_answer_for_missing_and_forbidden_tools(
    echoing: tuple[Any, RawClient],
) -> None:
    _, client = echoing
    # Through the SDK every name is a path; ToolError carries what the daemon said.
    names = [name for pair in PAIRS for name in pair if "__" not in name]
    code = """
const answers = {};
for (const name of NAMES) {
  const [ns, fn] = name.split(".");
  try { await tools[ns][fn]({}); answers[name] = "called"; } catch (e) {
    answers[name] = { code: e.code, tool: e.tool, message: e.message, data: e.data };
  }
}
return answers;
""".replace("NAMES", json.dumps(names))
    result = await execute(client, code, allowed_tools=["echo.echo"])
    assert result["status"] == "ok", result["error"]
    answers = result["result"]
    for forbidden, missing in PAIRS:
        if "__" in forbidden:
            continue
        assert answers[forbidden]["code"] == Forbidden.code, answers
        assert answers[forbidden]["data"] == {"tool": forbidden}
        assert _named(answers[forbidden], forbidden) == _named(answers[missing], missing)
        assert "did you mean" not in answers[missing]["message"]


async def test_a_python_program_gets_one_answer_too(echoing: tuple[Any, RawClient]) -> None:
    _, client = echoing
    code = """
answers = {}
for ns, fn in [("echo", "add"), ("echo", "sub")]:
    try:
        getattr(getattr(tools, ns), fn)()
    except ToolError as e:
        answers[fn] = [e.code, e.tool, e.message]
answers
"""
    params = {"language": "python", "code": code, "allowed_tools": ["echo.echo"]}
    result = await client.call("execute", params)
    assert result["status"] == "ok", result
    forbidden, missing = result["result"]["add"], result["result"]["sub"]
    assert forbidden[0] == Forbidden.code
    assert _named(forbidden, "echo.add") == _named(missing, "echo.sub")


async def test_a_session_gets_one_whole_wire_answer(
    echoing: tuple[Any, RawClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The raw replies on the sandbox socket, for names only a raw caller can send."""
    server, _ = echoing
    # Looking for close matches is the work a missing tool would cost and a forbidden
    # one would not: a sandbox's refusals never do it.
    suggested: list[str] = []
    monkeypatch.setattr(server.tools.catalogue, "_suggest", lambda name, _: suggested.append(name))
    session = server.auth.mint_session("ex_probe", (("echo.echo",),))
    sandbox = RawClient(await trio.open_unix_socket(server.callback_address.unix_path))
    auth = {"bearerToken": session}
    try:
        replies = {}
        for name in [*(n for pair in PAIRS for n in pair), "execute_python", "no_such"]:
            params = {"name": name, "shape": "value"}
            replies[name] = (await sandbox.request("tools/call", params, auth=auth))["error"]
    finally:
        await sandbox.aclose()
    assert replies["echo.add"] == {
        "code": Forbidden.code,
        "message": "forbidden: tool echo.add is not allowed here; add it to allowed_tools, "
        "within what your token allows",
        "data": {"tool": "echo.add"},
    }
    shapes = {_named(error, name) for name, error in replies.items()}
    assert len(shapes) == 1, replies
    assert suggested == []


async def test_a_restricted_client_gets_one_answer_too(echoing: tuple[Any, RawClient]) -> None:
    _, client = echoing
    await client.call("auth/login", {"token": TOKEN})
    forbidden = (await client.request("tools/call", {"name": "echo.add"}))["error"]
    missing = (await client.request("tools/call", {"name": "echo.sub"}))["error"]
    assert forbidden["code"] == Forbidden.code
    assert _named(forbidden, "echo.add") == _named(missing, "echo.sub")


async def test_a_client_that_may_call_every_tool_is_told_what_is_missing(
    echoing: tuple[Any, RawClient],
) -> None:
    _, client = echoing
    missing = (await client.request("tools/call", {"name": "echo.echo2"}))["error"]
    assert missing["code"] == NotFound.code
    assert "did you mean 'echo.echo'" in missing["message"]
