"""A token whose allowlists hold tools back cannot tell a missing tool from a forbidden one.

On every path a tool is named by such a caller (the socket's `tools/call`,
`tools/schema`, `tools/validate`, a sandbox's call on the callback socket, the MCP front
on stdio), both get one answer: the same code, message and data, naming only what was
sent. Listings show only the tools it may call. A caller that may call every tool is
still told what is missing, with close matches.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing

from conduit.core.errors import Forbidden, NotFound
from conduit.daemon.auth import hash_token
from conduit.daemon.mcp_stdio import stdio_principal
from tests.conftest import MASTER_TOKEN, WAIT_S, RawClient
from tests.e2e.helpers import wait_upstreams
from tests.e2e.mcp_helpers import ECHO, NO_SANDBOXES

TOKEN = "cdt_tool-access-agent-0123456789abcdef"
AGENT = {
    "name": "agent",
    "sha256": hash_token(TOKEN),
    "scopes": ["tools"],
    "allowed_tools": ["echo.echo"],
}
NO_PEER = {"peer_credentials": False, "token": MASTER_TOKEN, "clients": [AGENT]}
# (exists but is not allowed, does not exist): by path, by id, one letter off the
# allowed tool, and a built-in execute tool this token lacks the scope for.
PAIRS = [
    ("echo.add", "echo.sub"),
    ("echo__add", "echo__sub"),
    ("echo.fail", "echo.echo2"),
    ("execute_python", "execute_cobol"),
]
# The methods that name one tool, with what else each needs.
NAMING = {
    "tools/call": {"arguments": {"a": 1, "b": 2}},
    "tools/call value": {"arguments": {}, "shape": "value"},
    "tools/schema": {},
    "tools/validate": {"arguments": {}},
}


def _named(answer: Any, name: str) -> str:
    """An answer as JSON with `name` written as NAME: what is left must not differ."""
    return json.dumps(answer, sort_keys=True).replace(name, "NAME")


async def _ask(client: RawClient, method: str, name: str, **auth: Any) -> Any:
    wire_method, _, _ = method.partition(" ")
    if wire_method != "tools/call" and name.startswith("execute_"):
        return None  # built-in tools are called, never described
    reply = await client.request(wire_method, {"name": name, **NAMING[method]}, **auth)
    return reply.get("error", reply.get("result"))


def _assert_one_answer(answers: dict[tuple[str, str], Any]) -> None:
    for (method, name), error in answers.items():
        if error is None:
            continue
        assert error == {
            "code": Forbidden.code,
            "message": f"forbidden: tool {name} is not allowed here; add it to "
            "allowed_tools, within what your token allows",
            "data": {"tool": name},
        }, (method, name)
    for forbidden, missing in PAIRS:
        for method in NAMING:
            hidden, absent = answers[method, forbidden], answers[method, missing]
            assert _named(hidden, forbidden) == _named(absent, missing), (method, forbidden)


@pytest.fixture
async def agent_daemon(start_daemon: Callable[..., Any]) -> Any:
    server, info = await start_daemon(upstreams=[ECHO], auth=NO_PEER, executors=NO_SANDBOXES)
    await wait_upstreams(server, "echo")
    return server, info


async def test_a_restricted_token_gets_one_answer_on_the_socket(
    agent_daemon: Any, connect: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, info = agent_daemon
    # Looking for close matches is work a missing tool would cost and a forbidden one
    # would not: a restricted caller's refusals never do it.
    suggested: list[str] = []
    monkeypatch.setattr(server.tools.catalogue, "_suggest", lambda name, _: suggested.append(name))
    client = await connect(info)
    await client.call("auth/login", {"token": TOKEN})
    names = [name for pair in PAIRS for name in pair]
    answers = {(m, n): await _ask(client, m, n) for m in NAMING for n in names}
    _assert_one_answer(answers)
    assert suggested == []
    # What it may call still works.
    echoed = await client.call("tools/call", {"name": "echo.echo", "arguments": {"text": "hi"}})
    assert echoed["content"][0]["text"] == "hi"


async def test_a_sandbox_gets_the_same_answer(agent_daemon: Any) -> None:
    server, _ = agent_daemon
    session = server.auth.mint_session("ex_probe", (("*",), ("echo.echo",)))
    sandbox = RawClient(await trio.open_unix_socket(server.callback_address.unix_path))
    auth = {"auth": {"bearerToken": session}}
    try:
        names = [name for pair in PAIRS for name in pair]
        methods = ["tools/call", "tools/call value"]
        answers = {(m, n): await _ask(sandbox, m, n, **auth) for m in methods for n in names}
    finally:
        await sandbox.aclose()
    for method in ("tools/schema", "tools/validate"):  # not for sandboxes: not compared
        answers.update({(method, name): None for name in names})
    _assert_one_answer(answers)


async def test_the_mcp_front_narrowed_to_a_client_gets_one_answer(agent_daemon: Any) -> None:
    server, _ = agent_daemon
    ours, theirs = trio.testing.memory_stream_pair()
    client = RawClient(ours)
    principal = stdio_principal(server, "agent")
    with trio.fail_after(WAIT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                partial(server.serve_stream, theirs, transport="stdio", principal=principal)
            )
            answers = {}
            for name in [name for pair in PAIRS for name in pair]:
                reply = await client.request("tools/call", {"name": name, "arguments": {}})
                answers["tools/call", name] = reply["error"]
            listed = await client.call("tools/list")
            await client.aclose()
    for method in ("tools/call value", "tools/schema", "tools/validate"):
        answers.update({(method, name): None for _, name in answers.copy()})
    _assert_one_answer(answers)
    assert [tool["name"] for tool in listed["tools"]] == ["echo__echo"]


async def logged_in(running: Any, connect: Any, token: str) -> Any:
    """A client of the running daemon, logged in with `token`."""
    _, info = running
    client = await connect(info)
    await client.call("auth/login", {"token": token})
    return client


async def test_listings_show_a_restricted_token_only_what_it_may_call(
    agent_daemon: Any, connect: Any
) -> None:
    client = await logged_in(agent_daemon, connect, TOKEN)
    listed = await client.call("tools/list")
    assert [tool["name"] for tool in listed["tools"]] == ["echo__echo"]
    packages = (await client.call("tools/packages"))["packages"]
    assert [(package["namespace"], list(package["tools"])) for package in packages] == [
        ("echo", ["echo"])
    ]
    for language in ("typescript", "python"):
        sdk = await client.call("sdk/get", {"language": language})
        assert sdk["tools"] == 1
        assert "echo" in sdk["declarations"]
        for hidden in ("add", "fail", "slow", "crash"):
            assert f"{hidden}(" not in sdk["declarations"], (language, hidden)


async def test_a_caller_that_may_call_every_tool_is_told_what_is_missing(
    agent_daemon: Any, connect: Any
) -> None:
    client = await logged_in(agent_daemon, connect, MASTER_TOKEN)
    missing = (await client.request("tools/call", {"name": "echo.echo2"}))["error"]
    assert missing["code"] == NotFound.code
    assert "did you mean 'echo.echo'" in missing["message"]
    added = await client.call("tools/call", {"name": "echo.add", "arguments": {"a": 1, "b": 2}})
    assert added["structuredContent"] == {"sum": 3}


async def test_upstreams_show_a_restricted_token_only_what_it_may_call(
    agent_daemon: Any, connect: Any
) -> None:
    client = await logged_in(agent_daemon, connect, TOKEN)
    upstreams = (await client.call("upstreams/list"))["upstreams"]
    # Told how many tools `echo` has, it learns that tools it may not call exist.
    assert [(upstream["name"], upstream["tools"]) for upstream in upstreams] == [("echo", 1)]
