"""`events/subscribe`: the daemon's events as notifications, scoped, never slowing it."""

from __future__ import annotations

import os
from typing import Any

import pytest
import trio

from conduit.core.errors import Forbidden, InvalidParams, NotFound, UpstreamError
from conduit.core.events import SUBSCRIPTION_DROPPED
from conduit.daemon.auth import hash_token, new_token
from conduit.daemon.events import PRINCIPAL_EVENTS, EventType
from tests.conftest import WAIT_S, RawClient
from tests.e2e.helpers import wait_upstreams
from tests.e2e.test_tools import ECHO

NO_DENO = {"executors": {"deno": {"enabled": False}}}
AGENT_TOKEN = new_token()
AGENT = {
    "name": "agent",
    "sha256": hash_token(AGENT_TOKEN),
    "scopes": ["execute", "executions", "tools"],
}


async def run_js(client: RawClient, code: str, **params: Any) -> dict[str, Any]:
    """An execution on wasm-js (fast, and needs no Deno), answered before any event."""
    return await client.call("execute", {"language": "javascript", "code": code, **params})


async def next_event(client: RawClient) -> dict[str, Any]:
    message = await client.recv()
    assert message.get("method") == "event", message
    return message["params"]


async def login_agent(connect: Any, info: Any) -> RawClient:
    agent = await connect(info)
    await agent.call("auth/login", {"token": AGENT_TOKEN})
    return agent


async def test_executions_are_told_from_start_to_end(start_daemon: Any, connect: Any) -> None:
    _, info = await start_daemon(**NO_DENO)
    watcher = await connect(info)
    answer = await watcher.call("events/subscribe")
    assert answer["subscription"].startswith("sub_")
    assert answer["types"] == sorted(EventType)  # the master may see every type
    runner = await connect(info)
    programs = [
        ("1 + 1", {}, "execution.finished", "ok"),
        ("throw new Error('no')", {}, "execution.failed", "error"),
        ("while (true) {}", {"limits": {"timeout_ms": 300}}, "execution.timed_out", "timeout"),
        (
            "console.log('x'.repeat(100))",
            {"limits": {"output_bytes": 10}},
            "limit.exceeded",
            "output_limit",
        ),
    ]
    for code, params, ended_as, status in programs:
        result = await run_js(runner, code, **params)
        started = await next_event(watcher)
        ended = await next_event(watcher)
        assert started["subscription"] == ended["subscription"] == answer["subscription"]
        assert started["type"] == "execution.started"
        assert started["execution_id"] == ended["execution_id"] == result["execution_id"]
        assert started["executor"] == "wasm-js"
        assert (ended["type"], ended["status"]) == (ended_as, status)
        assert ended["principal"] == started["principal"] == f"uid:{os.getuid()}"
    assert ended["limit"] == "output"


async def test_types_choose_what_is_sent(start_daemon: Any, connect: Any) -> None:
    _, info = await start_daemon(**NO_DENO)
    watcher = await connect(info)
    answer = await watcher.call("events/subscribe", {"types": ["execution.finished"]})
    assert answer["types"] == ["execution.finished"]
    result = await run_js(await connect(info), "2")
    # The execution's started event was not asked for: the first event is its end.
    finished = await next_event(watcher)
    assert (finished["type"], finished["execution_id"]) == (
        "execution.finished",
        result["execution_id"],
    )


async def test_an_unknown_type_is_named_with_the_valid_ones(client: RawClient) -> None:
    reply = await client.request("events/subscribe", {"types": ["execution.finished", "nope"]})
    error = reply["error"]
    assert error["code"] == InvalidParams.code
    assert "'nope'" in error["message"]
    assert "execution.finished" in error["message"] and "upstream.down" in error["message"]
    assert error["data"]["field"] == "types"
    assert error["data"]["valid"] == list(EventType)


async def test_others_see_only_their_own_events(start_daemon: Any, connect: Any) -> None:
    _, info = await start_daemon(auth={"clients": [AGENT]}, **NO_DENO)
    watcher = await login_agent(connect, info)
    answer = await watcher.call("events/subscribe")
    assert answer["types"] == sorted(PRINCIPAL_EVENTS)
    agent = await login_agent(connect, info)
    refused = await agent.request("events/subscribe", {"types": ["upstream.down"]})
    assert refused["error"]["code"] == Forbidden.code
    assert "admin scope" in refused["error"]["message"]
    violation = await next_event(watcher)  # asking for what it may not see
    assert violation["type"] == "policy.violation"
    assert (violation["principal"], violation["method"]) == ("agent", "events/subscribe")
    master = await connect(info)
    await run_js(master, "'not yours'")
    mine = await run_js(agent, "'yours'")
    # Had the master's execution been visible, its events would have come first.
    started = await next_event(watcher)
    assert (started["type"], started["execution_id"]) == ("execution.started", mine["execution_id"])
    assert started["principal"] == "agent"
    assert (await next_event(watcher))["type"] == "execution.finished"
    denied = await agent.request("daemon/status")
    assert denied["error"]["code"] == Forbidden.code
    violation = await next_event(watcher)
    assert (violation["type"], violation["method"]) == ("policy.violation", "daemon/status")
    assert violation["rule"] == "access.scope"
    assert "'admin' scope" in violation["reason"]


async def test_sandboxes_may_not_subscribe_and_their_owner_hears_of_it(
    start_daemon: Any, connect: Any
) -> None:
    server, info = await start_daemon(**NO_DENO)
    watcher = await connect(info)
    await watcher.call("events/subscribe", {"types": ["policy.violation"]})
    # Calls a sandbox makes come through a bridge like this one, under its session.
    refused = pytest.raises(Forbidden, match="session token cannot call events/subscribe")
    with server.open_bridge("ex_0123456789abcdef", (("*",),)) as bridge, refused:
        await bridge.request("events/subscribe", {})
    violation = await next_event(watcher)
    assert (violation["method"], violation["rule"]) == ("events/subscribe", "access.method")
    assert violation["execution_id"] == "ex_0123456789abcdef"
    assert violation["principal"] == "session:ex_0123456789abcdef"


async def test_a_program_calling_a_tool_outside_its_allowlist_is_a_violation(
    start_daemon: Any, connect: Any
) -> None:
    server, info = await start_daemon(upstreams=[ECHO], **NO_DENO)
    await wait_upstreams(server, "echo")
    watcher = await connect(info)
    await watcher.call("events/subscribe", {"types": ["policy.violation", "tool.called"]})
    code = (
        "let refused;\n"
        "try { await tools.echo.add({a: 1, b: 2}); } catch (e) { refused = e.code; }\n"
        "[await tools.echo.echo({text: 'hi'}), refused]"
    )
    result = await run_js(await connect(info), code, allowed_tools=["echo.echo"])
    assert result["result"] == ["hi", Forbidden.code], result
    # The refused call is on the record as a call, and as the violation it was.
    refused_call = await next_event(watcher)
    assert (refused_call["type"], refused_call["tool"]) == ("tool.called", "echo.add")
    assert (refused_call["outcome"], refused_call["upstream"]) == ("forbidden", None)
    violation, called = await next_event(watcher), await next_event(watcher)
    assert violation["type"] == "policy.violation"
    assert (violation["method"], violation["tool"]) == ("tools/call", "echo.add")
    assert violation["rule"] == "access.tools"
    assert violation["execution_id"] == result["execution_id"]
    assert called["type"] == "tool.called"
    assert (called["tool"], called["outcome"]) == ("echo__echo", "ok")
    assert called["execution_id"] == result["execution_id"]


async def test_unsubscribe_stops_the_events(start_daemon: Any, connect: Any) -> None:
    _, info = await start_daemon(**NO_DENO)
    client = await connect(info)
    answer = await client.call("events/subscribe")
    gone = await client.call("events/unsubscribe", {"subscription": answer["subscription"]})
    assert gone == {"unsubscribed": answer["subscription"]}
    # Events of this execution would have come before its reply.
    ident = 99
    params = {"language": "javascript", "code": "3"}
    await client.send({"jsonrpc": "2.0", "id": ident, "method": "execute", "params": params})
    assert (await client.recv())["id"] == ident
    again = await client.request("events/unsubscribe", {"subscription": answer["subscription"]})
    assert again["error"]["code"] == NotFound.code


async def test_a_subscription_ends_with_its_connection(start_daemon: Any, connect: Any) -> None:
    server, info = await start_daemon(**NO_DENO)
    client = await connect(info)
    await client.call("events/subscribe")
    assert server.events.subscribers == 1
    await client.stream.send_eof()  # type: ignore[attr-defined]
    await client.expect_closed()
    assert server.events.subscribers == 0


async def test_a_slow_subscriber_is_dropped_and_told_and_slows_nobody(
    start_daemon: Any, connect: Any
) -> None:
    server, info = await start_daemon(
        auth={"clients": [AGENT]}, events={"subscriber_buffer": 8}, **NO_DENO
    )
    slow = await connect(info)
    answer = await slow.call("events/subscribe")
    # `slow` reads nothing from here on. Another client makes events as fast as it
    # can: each refused call is a policy violation the master's subscription sees.
    agent = await login_agent(connect, info)
    batch = [{"jsonrpc": "2.0", "id": i, "method": "daemon/status"} for i in range(1000)]
    with trio.fail_after(WAIT_S):
        while server.events.subscribers:
            await agent.send(batch)
            replies = await agent.recv()
            assert {reply["error"]["code"] for reply in replies} == {Forbidden.code}
    # The daemon goes on serving others as usual while `slow` still reads nothing.
    others = await connect(info)
    with trio.fail_after(WAIT_S):
        for n in range(5):
            assert (await run_js(others, f"{n} * 2"))["result"] == n * 2
    # What `slow` finally reads ends with one notice that it was dropped.
    received = []
    with trio.fail_after(WAIT_S):
        while not received or received[-1].get("type") != SUBSCRIPTION_DROPPED:
            received.append(await next_event(slow))
    notice = received[-1]
    assert notice["subscription"] == answer["subscription"]
    assert "more than 8 events were waiting" in notice["reason"]
    assert {event["type"] for event in received[:-1]} == {"policy.violation"}
    # Its connection still works, and no more events come.
    assert (await slow.request("ping"))["result"] == {}


async def test_upstreams_going_down_and_up_are_told_to_the_master(
    start_daemon: Any, connect: Any
) -> None:
    server, info = await start_daemon(upstreams=[ECHO], **NO_DENO)
    await wait_upstreams(server, "echo")
    watcher = await connect(info)
    await watcher.call("events/subscribe", {"types": ["upstream.up", "upstream.down"]})
    caller = await connect(info)
    crashed = await caller.request("tools/call", {"name": "echo.crash"})
    assert crashed["error"]["code"] == UpstreamError.code
    down = await next_event(watcher)
    assert (down["type"], down["upstream"], down["transport"]) == ("upstream.down", "echo", "stdio")
    assert down["state"] == "backing_off"
    assert down["error"]
    up = await next_event(watcher)  # the keeper restarts it after a short back-off
    assert (up["type"], up["upstream"], up["state"]) == ("upstream.up", "echo", "ready")
    assert up["restarts"] >= 1
    assert up["error"] is None
    assert up["tools"] > 0


async def test_a_call_a_program_left_going_on_is_told_to_its_owner(
    start_daemon: Any, connect: Any
) -> None:
    """It ends after its execution: the event still goes to who started the program
    (it went to the dead session's name, which nobody can subscribe as)."""
    server, info = await start_daemon(auth={"clients": [AGENT]}, upstreams=[ECHO], **NO_DENO)
    await wait_upstreams(server, "echo")
    watcher = await login_agent(connect, info)
    await watcher.call("events/subscribe", {"types": ["execution.finished", "tool.called"]})
    agent = await login_agent(connect, info)
    result = await run_js(agent, "tools.echo.slow({ seconds: 0.2 });\n'answered'")
    assert result["result"] == "answered", result
    with trio.fail_after(WAIT_S):
        finished, called = await next_event(watcher), await next_event(watcher)
    assert finished["type"] == "execution.finished"
    assert (called["type"], called["tool"], called["outcome"]) == (
        "tool.called",
        "echo__slow",
        "ok",
    )
    assert called["execution_id"] == result["execution_id"]


@pytest.mark.parametrize("executor", ["wasm-js", "deno"])
async def test_a_call_left_by_a_program_that_failed_is_cancelled(
    start_daemon: Any, connect: Any, executor: str
) -> None:
    """Only a program that answered leaves its calls going on: one that failed has them
    cancelled, on deno as on wasm-js (its worker's connection is let go on with calls
    of programs that answered, `left_requests`)."""
    deno = {} if executor == "deno" else NO_DENO
    server, info = await start_daemon(auth={"clients": [AGENT]}, upstreams=[ECHO], **deno)
    await wait_upstreams(server, "echo")
    watcher = await login_agent(connect, info)
    await watcher.call("events/subscribe", {"types": ["tool.called"]})
    agent = await login_agent(connect, info)
    code = "tools.echo.slow({ seconds: 20 });\nawait new Promise((r) => setTimeout(r, 200));\n"
    result = await run_js(agent, code + "throw new Error('no');", executor=executor)
    assert (result["status"], result["executor"]) == ("error", executor), result
    with trio.fail_after(10):  # well before the call's 20 s
        called = await next_event(watcher)
    assert (called["tool"], called["execution_id"]) == ("echo__slow", result["execution_id"])
    assert called["outcome"] != "ok" and called["duration_ms"] < 10_000, called
