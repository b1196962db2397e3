"""Attacks on the relaying of upstreams' questions (sampling, elicitation) to MCP clients.

Each test is one attack, from a hostile MCP client or a hostile upstream, against a
real daemon. Attacks the daemon withstands are plain tests that lock that in; attacks
that succeed are `xfail(strict=True)` tests asserting what the daemon *should* do.

Two upstreams: the conformance suite's tools (`test_sampling`, …) and `hostile`, a
stdio server written here (`HOSTILE`) whose tools ask their client many times at once,
after their call has ended, with odd methods and params, and report exactly what
Conduit answered them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

from conduit.core.errors import Overloaded
from conduit.daemon.client_asks import MAX_WAITING
from conduit.daemon.server import Daemon, ServingInfo
from conduit.gateway import asks
from tests.conftest import WAIT_S, RawClient, link_wasm_cache
from tests.e2e.helpers import daemon_object_in_a_thread
from tests.e2e.mcp_helpers import CONFORMANCE_TOOLS
from tests.e2e.test_mcp_http import INIT, _headers
from tests.fixtures.mcp_asking_server import command as asking_server
from tests.served import Served

# Every upstream call's deadline (`gateway.call_timeout_s`; an upstream's own
# `call_timeout_s` is not what bounds an MCP call): short, so a client that never
# answers costs a test seconds, not the default 30.
CALL_TIMEOUT_S = 3.0
# How long a question waits in the tests that let one go unanswered.
ASK_TIMEOUT_S = 1.0
SAID = {"role": "assistant", "content": {"type": "text", "text": "ok"}, "model": "m"}
# Every test's own bound.
TEST_S = 30


@dataclass
class Running:
    info: ServingInfo
    daemon: Daemon
    served: Served[Any]

    @property
    def url(self) -> str:
        address = self.info.mcp_http_address
        assert address is not None
        return f"http://127.0.0.1:{address[1]}/mcp"

    async def inside(self, function: Any) -> Any:
        """`function(daemon)` run in the daemon's own thread."""
        return await self.served.call_sync(function, self.daemon)


@contextmanager
def _running(root: Path, wasm_cache: Path, *, programs: bool = True) -> Iterator[Running]:
    """A daemon with the three upstreams and MCP over HTTP; with `programs`, wasm-python."""
    state = root / "state"
    link_wasm_cache(state, wasm_cache)
    hostile = {
        "name": "hostile",
        "transport": "stdio",
        "command": asking_server()[0],
        "args": asking_server()[1:],
        "bare_names": True,
        "handshake": "initialize",
        "ask_clients": True,
    }
    # The same server, not let ask: it is told no client can answer.
    quiet = {**hostile, "name": "quiet", "bare_names": False, "ask_clients": False}
    settings = {
        "executors.deno.enabled": False,
        "executors.wasm_js.enabled": False,
        "executors.wasm_python.enabled": programs,
        "server.max_in_flight_per_connection": 4,
        "gateway.call_timeout_s": CALL_TIMEOUT_S,
        "upstreams": [CONFORMANCE_TOOLS, hostile, quiet],
        "mcp_http.listen": "127.0.0.1:0",
    }
    upstreams = ("conformance", "hostile", "quiet")
    with daemon_object_in_a_thread(state, settings, upstreams=upstreams) as served:
        info, daemon = served.value
        yield Running(info, daemon, served)


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory, wasm_cache: Path) -> Iterator[Running]:
    """Shared by the attacks that leave every upstream able to ask."""
    with _running(tmp_path_factory.mktemp("asks-attacks"), wasm_cache) as daemon:
        yield daemon


@pytest.fixture
def short_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Questions wait `ASK_TIMEOUT_S`, not minutes (the daemon's thread reads it)."""
    monkeypatch.setattr(asks, "ASK_TIMEOUT_S", ASK_TIMEOUT_S)


@pytest.fixture
def fresh(tmp_path: Path, wasm_cache: Path) -> Iterator[Running]:
    """A daemon of its own, for attacks that leave an upstream changed."""
    with _running(tmp_path, wasm_cache, programs=False) as daemon:
        yield daemon


# ---- clients ---------------------------------------------------------------------------


async def _session(
    http: httpx2.AsyncClient, url: str, capabilities: dict[str, Any] | None = None
) -> dict[str, str]:
    caps = {"sampling": {}, "elicitation": {}} if capabilities is None else capabilities
    init = {**INIT, "params": {**INIT["params"], "capabilities": caps}}
    opened = await http.post(url, json=init, headers=_headers())
    assert opened.status_code == 200, opened.text
    headers = _headers(**{"Mcp-Session-Id": opened.headers["mcp-session-id"]})
    notified = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await http.post(url, json=notified, headers=headers)).status_code == 202
    return headers


def _call(ident: Any, name: str, arguments: dict[str, Any] | None = None, **params: Any) -> Any:
    return {
        "jsonrpc": "2.0",
        "id": ident,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments or {}, **params},
    }


class Events:
    """An SSE answer's events, one by one."""

    def __init__(self, response: httpx2.Response) -> None:
        self._lines = response.aiter_lines()

    async def next(self) -> dict[str, Any] | None:
        """The next event, or None once the stream has ended."""
        async for line in self._lines:
            if line.startswith("data: "):
                return json.loads(line[len("data: ") :])
        return None


@asynccontextmanager
async def _streamed(
    http: httpx2.AsyncClient, url: str, message: Any, headers: dict[str, str]
) -> AsyncIterator[Events]:
    async with http.stream("POST", url, json=message, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"] == "text/event-stream"
        yield Events(response)


async def _answer(
    http: httpx2.AsyncClient, url: str, headers: dict[str, str], asked: Any, **answer: Any
) -> None:
    # Escaped as JSON may carry them: lone surrogates included.
    reply = json.dumps({"jsonrpc": "2.0", "id": asked["id"], **answer}).encode()
    assert (await http.post(url, content=reply, headers=headers)).status_code == 202


async def _asked_once(running: Running, **answer: Any) -> dict[str, Any]:
    """The hostile `ask_once` called over HTTP and its question given `answer` (a
    `result` or an `error`): the call's final event."""
    with trio.fail_after(TEST_S):
        async with httpx2.AsyncClient(timeout=WAIT_S) as http:
            headers = await _session(http, running.url)
            async with _streamed(http, running.url, _call(1, "ask_once"), headers) as events:
                asked = await events.next()
                assert asked is not None
                await _answer(http, running.url, headers, asked, **answer)
                final = await events.next()
    assert final is not None
    return final


def _told(reply: dict[str, Any]) -> Any:
    """What a hostile tool's result says (its one text, as JSON)."""
    assert "result" in reply, reply
    [content] = reply["result"]["content"]
    return json.loads(content["text"])


async def _socket_client(running: Running, capabilities: dict[str, Any]) -> RawClient:
    assert running.info.unix_path is not None
    client = RawClient(await trio.open_unix_socket(running.info.unix_path))
    init = {**INIT, "params": {**INIT["params"], "capabilities": capabilities}}
    await client.send(init)
    assert "result" in await client.recv()
    return client


def _waiting(daemon: Daemon) -> dict[str, int]:
    """Questions still waiting: in MCP sessions' tables, and in keepers' scopes."""
    sessions = sum(len(session._asks) for session in daemon.mcp_sessions.sessions())
    keepers = 0
    for entry in daemon.tools.catalogue._entries.values():
        asks = getattr(_keeper(entry.upstream), "_asks", None)
        keepers += len(asks) if asks is not None else 0
    return {"sessions": sessions, "keepers": keepers}


def _keeper(upstream: Any) -> Any:
    while hasattr(upstream, "_inner"):
        upstream = upstream._inner
    return upstream


async def _until_nothing_waits(running: Running) -> None:
    with trio.fail_after(WAIT_S):
        while (waiting := await running.inside(_waiting)) != {"sessions": 0, "keepers": 0}:
            await trio.sleep(0.05)
    assert waiting == {"sessions": 0, "keepers": 0}


async def _still_asks(running: Running) -> None:
    """A fresh client is still asked, and its answer reaches the conformance upstream."""
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        headers = await _session(http, running.url)
        message = _call(900, "test_sampling", {"prompt": "still there?"})
        async with _streamed(http, running.url, message, headers) as events:
            asked = await events.next()
            assert asked is not None and asked["method"] == "sampling/createMessage", asked
            await _answer(http, running.url, headers, asked, result=SAID)
            answer = await events.next()
    assert answer is not None and answer["result"]["content"][0]["text"] == "LLM response: ok"


# ---- a flood of questions, and answers that answer nothing ----------------------------


async def test_an_upstream_asking_many_at_once_gets_only_max_waiting_through(
    running: Running,
) -> None:
    """20 questions at once from one call: the first `MAX_WAITING` reach the client, the
    rest are refused at once (`Overloaded`) rather than queued behind a silent client."""
    with trio.fail_after(TEST_S):
        async with httpx2.AsyncClient(timeout=WAIT_S) as http:
            headers = await _session(http, running.url)
            message = _call(1, "ask_many", {"n": 20})
            async with _streamed(http, running.url, message, headers) as events:
                asked = [await events.next() for _ in range(MAX_WAITING)]
                assert all(q is not None and "method" in q for q in asked), asked
                # Give the rest time to arrive: they are refused, not queued.
                await trio.sleep(0.5)
                assert (await running.inside(_waiting))["sessions"] == MAX_WAITING
                for question in asked:
                    await _answer(http, running.url, headers, question, result=SAID)
                final = await events.next()
    assert final is not None
    outcomes = _told(final)
    assert [o for o in outcomes if "ok" in o] == [{"ok": SAID}] * MAX_WAITING
    refused = [o["error"] for o in outcomes if "error" in o]
    assert len(refused) == 20 - MAX_WAITING
    assert {e["code"] for e in refused} == {Overloaded.code}
    await _until_nothing_waits(running)
    await _still_asks(running)


async def test_answers_from_another_connection_or_to_nothing_are_dropped(
    running: Running,
) -> None:
    """Over the socket: another connection answering with the question's id, ids of
    every JSON type, a flood of answers to questions never asked, and a second answer
    to one already answered all answer nothing; the real answer still does."""
    with trio.fail_after(TEST_S):
        asker = await _socket_client(running, {"sampling": {}})
        other = await _socket_client(running, {"sampling": {}})
        try:
            await asker.send(_call(2, "test_sampling", {"prompt": "asker's own"}))
            asked = await asker.recv()
            assert asked["method"] == "sampling/createMessage"
            wrong = {**SAID, "content": {"type": "text", "text": "from the other client"}}
            await other.send({"jsonrpc": "2.0", "id": asked["id"], "result": wrong})
            for ident in ([asked["id"]], {"id": asked["id"]}, 1.5, True, "conduit-0", "x" * 9999):
                await asker.send({"jsonrpc": "2.0", "id": ident, "result": wrong})
            for number in range(10_000, 12_000):  # never asked
                await asker.send_line(b'{"jsonrpc":"2.0","id":"conduit-%d","error":{}}' % number)
            await asker.send({"jsonrpc": "2.0", "id": 3, "method": "ping"})
            assert await asker.recv() == {"jsonrpc": "2.0", "id": 3, "result": {}}
            await other.send({"jsonrpc": "2.0", "id": 4, "method": "ping"})
            assert await other.recv() == {"jsonrpc": "2.0", "id": 4, "result": {}}
            await asker.send({"jsonrpc": "2.0", "id": asked["id"], "result": SAID})
            answer = await asker.recv()
            assert answer["id"] == 2
            assert answer["result"]["content"][0]["text"] == "LLM response: ok"
            # Answered already: a second answer is dropped, not an error.
            await asker.send({"jsonrpc": "2.0", "id": asked["id"], "result": wrong})
            await asker.send({"jsonrpc": "2.0", "id": 5, "method": "ping"})
            assert await asker.recv() == {"jsonrpc": "2.0", "id": 5, "result": {}}
        finally:
            await asker.aclose()
            await other.aclose()
    await _until_nothing_waits(running)


# ---- answers the upstream cannot use ----------------------------------------------------


@pytest.mark.parametrize(
    ("error", "told"),
    [
        ({"code": True, "message": "a bool"}, {"code": -32603, "message": "a bool"}),
        ({"code": 1.5, "message": "a float"}, {"code": -32603, "message": "a float"}),
        ({"code": "-32000", "message": "a str"}, {"code": -32603, "message": "a str"}),
        ({"code": -(2**31), "message": "int32"}, {"code": -(2**31), "message": "int32"}),
        ({"code": 7, "message": "\ud800 lone"}, {"code": 7, "message": "\ufffd lone"}),
        ({"code": 7, "message": "m" * 5000}, {"code": 7, "message": "m" * 1024}),
        ({"code": 7, "message": ["not", "text"]}, {"code": 7, "message": "['not', 'text']"}),
        ({}, {"code": -32603, "message": ""}),
    ],
)
async def test_odd_error_objects_reach_the_upstream_as_plain_errors(
    running: Running, error: dict[str, Any], told: dict[str, Any]
) -> None:
    final = await _asked_once(running, error=error)
    assert _told(final) == {"error": told}
    await _until_nothing_waits(running)


@pytest.mark.parametrize("result", ["not an object", None, [SAID]])
async def test_an_answer_without_a_result_object_is_an_error_to_the_upstream(
    running: Running, result: Any
) -> None:
    final = await _asked_once(running, result=result)
    told = _told(final)["error"]
    assert told["code"] == -32603
    assert "neither a result object nor an error" in told["message"]


async def test_a_deeply_nested_answer_fails_the_question_not_the_upstream(
    running: Running,
) -> None:
    """Nesting the daemon reads but the SDK will not write back (depth 600) becomes an
    error for the upstream's question; nesting past the daemon's parser (990) is refused
    with 400 and the question still waits for a real answer."""

    def deep(ident: str, depth: int) -> bytes:
        # Written by hand: json.dumps itself recurses too deep for the test.
        nested = "[" * depth + '"bottom"' + "]" * depth
        content = '{"type":"text","text":"x","_meta":{"deep":' + nested + "}}"
        result = '{"role":"assistant","model":"m","content":' + content + "}"
        return ('{"jsonrpc":"2.0","id":' + json.dumps(ident) + ',"result":' + result + "}").encode()

    with trio.fail_after(TEST_S):
        async with httpx2.AsyncClient(timeout=WAIT_S) as http:
            headers = await _session(http, running.url)
            async with _streamed(http, running.url, _call(1, "ask_once"), headers) as events:
                asked = await events.next()
                assert asked is not None
                posted = await http.post(
                    running.url, content=deep(asked["id"], 600), headers=headers
                )
                assert posted.status_code == 202
                final = await events.next()
            assert final is not None
            assert "error" in _told(final), final
            async with _streamed(http, running.url, _call(2, "ask_once"), headers) as events:
                asked = await events.next()
                assert asked is not None
                posted = await http.post(
                    running.url, content=deep(asked["id"], 990), headers=headers
                )
                assert posted.status_code == 400
                assert posted.json()["error"]["code"] == -32700
                await _answer(http, running.url, headers, asked, result=SAID)
                final = await events.next()
            assert final is not None and _told(final) == {"ok": SAID}
    await _until_nothing_waits(running)
    await _still_asks(running)


# ---- clients that do not answer ---------------------------------------------------------


async def test_a_client_that_never_answers_is_given_up_in_time(
    running: Running, short_asks: None
) -> None:
    """The question ends at its own deadline (the call's stands still meanwhile) and the
    upstream is told; the question is forgotten everywhere, an answer sent after that
    answers nothing, and the upstream can still ask the next caller."""
    with trio.fail_after(TEST_S):
        async with httpx2.AsyncClient(timeout=WAIT_S) as http:
            headers = await _session(http, running.url)
            async with _streamed(http, running.url, _call(1, "ask_once"), headers) as events:
                asked = await events.next()
                assert asked is not None and asked["method"] == "sampling/createMessage"
                assert await running.inside(_waiting) == {"sessions": 1, "keepers": 1}
                started = trio.current_time()
                final = await events.next()
                waited = trio.current_time() - started
                assert await events.next() is None
            assert final is not None
            assert "no answer came" in _told(final)["error"]["message"], final
            assert waited < ASK_TIMEOUT_S + 2
            assert await running.inside(_waiting) == {"sessions": 0, "keepers": 0}
            await _answer(http, running.url, headers, asked, result=SAID)
            # The session goes on.
            plain = await http.post(running.url, json=_call(2, "test_simple_text"), headers=headers)
            assert plain.headers["content-type"] == "application/json"
            assert plain.json()["result"]["content"][0]["text"] == "test_simple_text answered"
    await _still_asks(running)


async def test_deleting_the_session_mid_question_ends_the_stream_and_the_question(
    fresh: Running,
) -> None:
    with trio.fail_after(TEST_S):
        async with httpx2.AsyncClient(timeout=WAIT_S) as http:
            headers = await _session(http, fresh.url)
            async with _streamed(http, fresh.url, _call(1, "ask_once"), headers) as events:
                asked = await events.next()
                assert asked is not None
                assert (await http.delete(fresh.url, headers=headers)).status_code == 200
                assert await events.next() is None
            await _until_nothing_waits(fresh)
            # Answering into the ended session: 404, nothing else.
            reply = {"jsonrpc": "2.0", "id": asked["id"], "result": SAID}
            assert (await http.post(fresh.url, json=reply, headers=headers)).status_code == 404


async def test_a_socket_client_gone_mid_question_frees_it_at_once(running: Running) -> None:
    """EOF on the socket (or `conduit mcp`'s stdin): requests in flight are still
    answered, but no answer to a question can come any more, so it ends at once."""
    with trio.fail_after(CALL_TIMEOUT_S):
        client = await _socket_client(running, {"sampling": {}})
        await client.send(_call(2, "test_sampling", {"prompt": "then gone"}))
        assert (await client.recv())["method"] == "sampling/createMessage"
        await client.stream.send_eof()  # type: ignore[attr-defined]
        reply = await client.recv()
        await client.aclose()
    assert reply["id"] == 2 and "no longer read" in reply["error"]["message"], reply
    await _until_nothing_waits(running)
    await _still_asks(running)


# ---- what must not change for clients that answer ---------------------------------------


async def test_plain_calls_from_an_answering_client_are_still_json(running: Running) -> None:
    with trio.fail_after(TEST_S):
        async with httpx2.AsyncClient(timeout=WAIT_S) as http:
            headers = await _session(http, running.url)
            calls = [
                _call(1, "test_simple_text"),
                _call(2, "slow", {"s": 0.1}),
                _call(3, "execute_python", {"code": "6 * 7"}),
                {"jsonrpc": "2.0", "id": 4, "method": "tools/list"},
            ]
            for message in calls:
                answered = await http.post(running.url, json=message, headers=headers)
                assert answered.status_code == 200
                assert answered.headers["content-type"] == "application/json", message
                assert "result" in answered.json(), answered.text


async def test_progress_and_logs_still_stream_to_an_answering_client(running: Running) -> None:
    """A progress token, or a log level, makes the call SSE from the start, as before;
    a question then rides the same stream."""
    with trio.fail_after(TEST_S):
        async with httpx2.AsyncClient(timeout=WAIT_S) as http:
            headers = await _session(http, running.url)
            meta = {"_meta": {"progressToken": "p1"}}
            message = _call(1, "test_tool_with_progress", **meta)
            async with _streamed(http, running.url, message, headers) as events:
                seen = [await events.next() for _ in range(4)]
            assert [e["method"] for e in seen[:3] if e] == ["notifications/progress"] * 3
            assert seen[3] is not None and seen[3]["id"] == 1 and "result" in seen[3]

            level = {"jsonrpc": "2.0", "id": 2, "method": "logging/setLevel"}
            level["params"] = {"level": "info"}
            assert (await http.post(running.url, json=level, headers=headers)).status_code == 200
            async with _streamed(
                http, running.url, _call(3, "test_tool_with_logging"), headers
            ) as events:
                logged = [await events.next() for _ in range(4)]
            assert [e["method"] for e in logged[:3] if e] == ["notifications/message"] * 3
            assert logged[3] is not None and logged[3]["id"] == 3

            message = _call(4, "test_sampling", {"prompt": "in a stream"})
            async with _streamed(http, running.url, message, headers) as events:
                asked = await events.next()
                assert asked is not None and asked["method"] == "sampling/createMessage"
                await _answer(http, running.url, headers, asked, result=SAID)
                final = await events.next()
            assert final is not None and final["result"]["content"][0]["text"] == "LLM response: ok"


async def test_a_client_that_takes_only_json_is_not_asked(running: Running) -> None:
    with trio.fail_after(TEST_S):
        async with httpx2.AsyncClient(timeout=WAIT_S) as http:
            headers = {**await _session(http, running.url), "Accept": "application/json"}
            answered = await http.post(running.url, json=_call(1, "ask_once"), headers=headers)
    assert answered.headers["content-type"] == "application/json"
    told = _told(answered.json())["error"]
    assert "answered as an SSE stream" in told["message"]


# ---- findings: attacks that succeed ------------------------------------------------------


_HANG_UP = pytest.mark.xfail(
    strict=True,
    reason="FINDING (kept, documented): a client hanging up while its question waits "
    "cancels the call, which marks the upstream's connection abandoned "
    "(`SessionKeeper._observing`, as for log messages): no call on it is solo again, so "
    "every later question from that upstream is refused until it reconnects",
)


@pytest.mark.parametrize("how", ["timeout", pytest.param("hang-up", marks=_HANG_UP)])
async def test_one_question_given_up_does_not_silence_the_upstream_for_everyone(
    fresh: Running, short_asks: None, how: str
) -> None:
    with trio.fail_after(TEST_S):
        async with httpx2.AsyncClient(timeout=WAIT_S) as http:
            hostile = await _session(http, fresh.url)
            async with _streamed(http, fresh.url, _call(1, "ask_once"), hostile) as events:
                assert await events.next() is not None
                if how == "timeout":  # a person slower than the deadline, or nobody
                    assert await events.next() is not None
            await _until_nothing_waits(fresh)
            victim = await _session(http, fresh.url)
            message = _call(2, "ask_once")
            async with http.stream("POST", fresh.url, json=message, headers=victim) as response:
                if response.headers["content-type"] == "application/json":
                    told = json.loads(await response.aread())
                    assert "result" not in told or "no client to pass" not in str(told), told
                asked = await Events(response).next()
                assert asked is not None and asked["method"] == "sampling/createMessage"


async def test_a_tool_that_adapts_to_its_client_falls_back_for_those_that_cannot_answer(
    running: Running,
) -> None:
    with trio.fail_after(TEST_S):
        async with httpx2.AsyncClient(timeout=WAIT_S) as http:
            plain = await _session(http, running.url, {})
            answered = await http.post(running.url, json=_call(1, "quiet__adaptive"), headers=plain)
        assert running.info.unix_path is not None
        client = RawClient(await trio.open_unix_socket(running.info.unix_path))
        try:
            program = "tools.quiet.adaptive()"
            ran = await client.call("execute", {"language": "python", "code": program})
        finally:
            await client.aclose()
    assert ran["result"] == "fallback: the client cannot sample", ran
    assert _told(answered.json()) == "fallback: the client cannot sample"


@pytest.mark.xfail(
    strict=True,
    reason="FINDING: a question the upstream asks after its call was answered goes to "
    "whichever client's call is solo then: another client is shown the first call's "
    "question and its answer goes back to work that is not its own",
)
async def test_a_question_asked_after_its_call_ended_reaches_no_other_client(
    fresh: Running,
) -> None:
    secret = {"messages": [{"role": "user", "content": {"type": "text", "text": "A's data"}}]}
    secret["maxTokens"] = 5
    with trio.fail_after(TEST_S):
        async with httpx2.AsyncClient(timeout=WAIT_S) as http:
            first = await _session(http, fresh.url)
            scheduled = _call(1, "ask_later", {"delay": 0.5, "params": secret})
            assert _told((await http.post(fresh.url, json=scheduled, headers=first)).json())
            second = await _session(http, fresh.url)
            shown: list[Any] = []
            message = _call(2, "slow", {"s": 1.5})
            async with http.stream("POST", fresh.url, json=message, headers=second) as response:
                events = Events(response)
                while (event := await events.next()) is not None and "method" in event:
                    shown.append(event["params"])
                    await _answer(http, fresh.url, second, event, result=SAID)
                    if response.headers["content-type"] != "text/event-stream":
                        break
    assert shown == [], f"another client was asked: {shown}"


async def test_a_request_waiting_for_a_slot_does_not_hold_the_clients_answer_back(
    fresh: Running,
) -> None:
    with trio.fail_after(TEST_S):
        client = await _socket_client(fresh, {"sampling": {}})
        try:
            await client.send(_call(2, "test_sampling", {"prompt": "x"}))
            asked = await client.recv()
            for ident in (3, 4, 5):  # with the call above: the 4 slots of the fixture
                await client.send(_call(ident, "slow", {"s": 1.5}))
            await trio.sleep(0.2)
            await client.send({"jsonrpc": "2.0", "id": 6, "method": "ping"})
            answered_at = trio.current_time()
            await client.send({"jsonrpc": "2.0", "id": asked["id"], "result": SAID})
            while (reply := await client.recv()).get("id") != 2:
                pass
            took = trio.current_time() - answered_at
        finally:
            await client.aclose()
    assert reply["result"]["content"][0]["text"] == "LLM response: ok"
    assert took < 1.0, f"the answer was taken {took:.1f} s after it was sent"


@pytest.mark.parametrize(
    ("method", "params"),
    [
        (
            "elicitation/create",
            {
                "mode": "url",
                "message": "Sign in to continue",
                "url": "https://attacker.example/login",
                "elicitationId": "e1",
            },
        ),
        (
            "sampling/createMessage",
            {
                "messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}],
                "maxTokens": 5,
                "tools": [{"name": "run", "inputSchema": {"type": "object"}}],
            },
        ),
    ],
    ids=["url-elicitation", "sampling-with-tools"],
)
async def test_a_client_is_not_asked_in_a_mode_it_did_not_declare(
    running: Running, method: str, params: dict[str, Any]
) -> None:
    capabilities = {"elicitation": {"form": {}}, "sampling": {}}
    shown: list[Any] = []
    with trio.fail_after(TEST_S):
        async with httpx2.AsyncClient(timeout=WAIT_S) as http:
            headers = await _session(http, running.url, capabilities)
            message = _call(1, "ask_once", {"method": method, "params": params})
            async with http.stream("POST", running.url, json=message, headers=headers) as response:
                events = Events(response)
                event = await events.next()
                if event is not None and "method" in event:
                    shown.append(event)
                    refusal = {"code": -1, "message": "not what I declared"}
                    await _answer(http, running.url, headers, event, error=refusal)
                    # Read to the end: a client that hangs up would give the call up.
                    assert await events.next() is not None
    assert shown == [], f"the client was asked: {shown}"


async def test_an_error_code_beyond_json_rpc_integers_is_not_passed_on(running: Running) -> None:
    with trio.fail_after(TEST_S):
        async with httpx2.AsyncClient(timeout=WAIT_S) as http:
            headers = await _session(http, running.url)
            async with _streamed(http, running.url, _call(1, "ask_once"), headers) as events:
                asked = await events.next()
                assert asked is not None
                reply = {"jsonrpc": "2.0", "id": asked["id"]}
                reply["error"] = {"code": 10**4000, "message": "huge"}
                body = json.dumps(reply).encode()
                assert (
                    await http.post(running.url, content=body, headers=headers)
                ).status_code == 202
                final = await events.next()
    assert final is not None
    code = _told(final)["error"]["code"]
    assert -(2**31) <= code < 2**31, f"the upstream was sent a {len(str(code))}-digit code"


async def test_an_answer_inside_a_batch_answers_the_question(running: Running) -> None:
    with trio.fail_after(TEST_S):
        client = await _socket_client(running, {"sampling": {}})
        try:
            await client.send(_call(2, "test_sampling", {"prompt": "batched"}))
            asked = await client.recv()
            await client.send([{"jsonrpc": "2.0", "id": asked["id"], "result": SAID}])
            first = await client.recv()  # no reply to the batch: it held only an answer
        finally:
            await client.aclose()
    assert isinstance(first, dict) and first.get("id") == 2, first
