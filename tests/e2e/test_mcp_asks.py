"""An upstream tool asking the MCP client that called it: sampling and elicitation.

The upstream is the conformance suite's test tools (`mcp_conformance_server`), whose
`test_sampling` and `test_elicitation*` send `sampling/createMessage` and
`elicitation/create` mid-call and answer with what they were told. Conduit passes each
request to the client whose call made it, over HTTP (on the call's SSE stream, the
answer POSTed back) and over the socket `conduit mcp` serves, and refuses plainly where
there is nobody to ask.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
import trio
from mcp.client.session import ClientRequestContext
from mcp.shared.exceptions import MCPError

from conduit.core.errors import UpstreamError
from conduit.daemon.server import ServingInfo
from tests.conftest import WAIT_S, RawClient, link_wasm_cache
from tests.e2e.helpers import daemon_in_a_thread
from tests.e2e.mcp_helpers import CONFORMANCE_TOOLS
from tests.e2e.test_mcp_http import INIT, _headers, mcp_url, sdk_client
from tests.served import Served

SAID = "a completion from the client's model"


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, wasm_cache: Path
) -> Iterator[Served[ServingInfo]]:
    state = tmp_path_factory.mktemp("mcp-asks") / "state"
    link_wasm_cache(state, wasm_cache)
    settings = {
        "executors.deno.enabled": False,
        "executors.wasm_js.enabled": False,
        "upstreams": [CONFORMANCE_TOOLS],
        "mcp_http.listen": "127.0.0.1:0",
    }
    with daemon_in_a_thread(state, settings, upstreams=("conformance",)) as daemon:
        yield daemon


@pytest.fixture
def url(served: Served[ServingInfo]) -> str:
    return mcp_url(served)


class Answers:
    """The client's side: what it was asked, and what it says."""

    def __init__(self) -> None:
        self.asked: list[Any] = []

    async def sampling(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult:
        self.asked.append(params)
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(text=SAID), model="test-model"
        )

    async def elicitation(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        self.asked.append(params)
        if "decline" in params.message:
            return types.ErrorData(code=-1, message="the user closed the dialog")
        return types.ElicitResult(action="accept", content={"username": "ada", "email": "a@b.c"})


def _text(result: types.CallToolResult) -> str:
    [content] = result.content
    assert isinstance(content, types.TextContent)
    return content.text


async def test_sampling_and_elicitation_reach_the_client_and_its_answers_the_upstream(
    url: str,
) -> None:
    answers = Answers()
    options = {"sampling_callback": answers.sampling, "elicitation_callback": answers.elicitation}
    async with sdk_client(url, **options) as client:
        sampled = await client.call_tool("test_sampling", {"prompt": "Name a colour"})
        elicited = await client.call_tool("test_elicitation", {"message": "Who are you?"})
    assert _text(sampled) == f"LLM response: {SAID}"
    assert _text(elicited) == (
        "User response: action=accept, content={'username': 'ada', 'email': 'a@b.c'}"
    )
    sampling, elicitation = answers.asked
    assert sampling.messages[0].content.text == "Name a colour"
    assert sampling.max_tokens == 100
    assert elicitation.message == "Who are you?"
    assert elicitation.requested_schema["required"] == ["username", "email"]


async def test_the_clients_refusal_reaches_the_upstream(url: str) -> None:
    async with sdk_client(url, elicitation_callback=Answers().elicitation) as client:
        with pytest.raises(MCPError) as failed:
            await client.call_tool("test_elicitation", {"message": "please decline"})
    assert "the user closed the dialog" in failed.value.message


async def test_a_client_is_asked_only_what_it_declared_it_answers(url: str) -> None:
    answers = Answers()
    async with sdk_client(url, sampling_callback=answers.sampling) as client:
        with pytest.raises(MCPError) as failed:
            await client.call_tool("test_elicitation", {"message": "Who are you?"})
        assert "does not answer elicitation/create" in failed.value.message
        # The same session goes on.
        assert _text(await client.call_tool("test_sampling", {"prompt": "again"})).endswith(SAID)
    assert len(answers.asked) == 1


async def test_a_program_calling_an_asking_tool_is_refused_plainly(
    served: Served[ServingInfo],
) -> None:
    """Nobody to ask from inside a sandbox: the tool's error, not a hang."""
    program = "tools.conformance.test_sampling(prompt='hello')"
    stream = await trio.open_unix_socket(served.value.unix_path)
    client = RawClient(stream)
    try:
        result = await client.call("execute", {"language": "python", "code": program})
    finally:
        await client.aclose()
    assert result["status"] == "error"
    assert "no client to pass sampling/createMessage to" in json.dumps(result["error"])


async def test_over_the_socket_the_question_and_answer_share_the_connection(
    served: Served[ServingInfo],
) -> None:
    """What `conduit mcp` serves on stdio: one connection carries both directions, and
    answers that answer nothing are dropped."""
    client = RawClient(await trio.open_unix_socket(served.value.unix_path))
    try:
        init = {**INIT, "params": {**INIT["params"], "capabilities": {"sampling": {}}}}
        await client.send(init)
        assert "result" in await client.recv()
        call = {"name": "test_sampling", "arguments": {"prompt": "over the socket"}}
        await client.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call})
        asked = await client.recv()
        assert asked["method"] == "sampling/createMessage"
        assert asked["params"]["messages"][0]["content"]["text"] == "over the socket"
        for stray in ("conduit-999", 2, None):
            await client.send({"jsonrpc": "2.0", "id": stray, "result": {"no": "one"}})
        said = {"role": "assistant", "content": {"type": "text", "text": SAID}, "model": "m"}
        await client.send({"jsonrpc": "2.0", "id": asked["id"], "result": said})
        answer = await client.recv()
        assert answer["id"] == 2, answer
        assert answer["result"]["content"][0]["text"] == f"LLM response: {SAID}"
        await client.send({"jsonrpc": "2.0", "id": 3, "method": "ping"})
        assert await client.recv() == {"jsonrpc": "2.0", "id": 3, "result": {}}
    finally:
        await client.aclose()


async def _session(http: httpx2.AsyncClient, url: str) -> dict[str, str]:
    init = {**INIT, "params": {**INIT["params"], "capabilities": {"sampling": {}}}}
    opened = await http.post(url, json=init, headers=_headers())
    headers = _headers(**{"Mcp-Session-Id": opened.headers["mcp-session-id"]})
    notified = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await http.post(url, json=notified, headers=headers)).status_code == 202
    return headers


async def test_over_http_a_call_is_json_unless_it_asks_then_sse(url: str) -> None:
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        headers = await _session(http, url)
        plain = {"name": "test_simple_text", "arguments": {}}
        answered = await http.post(
            url,
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": plain},
            headers=headers,
        )
        assert answered.headers["content-type"] == "application/json"
        asking = {"name": "test_sampling", "arguments": {"prompt": "over http"}}
        request = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": asking}
        async with http.stream("POST", url, json=request, headers=headers) as streamed:
            assert streamed.headers["content-type"] == "text/event-stream"
            events = streamed.aiter_lines()
            asked = await _next_event(events)
            assert asked["method"] == "sampling/createMessage"
            # Answers with ids it never sent, or from another session, answer nothing.
            other = await _session(http, url)
            for ident, where in ((asked["id"], other), ("conduit-999", headers)):
                stray = {"jsonrpc": "2.0", "id": ident, "result": {"role": "assistant"}}
                assert (await http.post(url, json=stray, headers=where)).status_code == 202
            said = {"role": "assistant", "content": {"type": "text", "text": SAID}, "model": "m"}
            reply = {"jsonrpc": "2.0", "id": asked["id"], "result": said}
            assert (await http.post(url, json=reply, headers=headers)).status_code == 202
            answer = await _next_event(events)
    assert answer["id"] == 2
    assert answer["result"]["content"][0]["text"] == f"LLM response: {SAID}"


async def test_an_answer_that_is_not_a_result_fails_the_call_not_the_upstream(url: str) -> None:
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        headers = await _session(http, url)
        answers = ({"result": {"role": 7}}, {"result": []}, {"error": {"code": "x"}})
        for ident, answer in enumerate(answers):
            asking = {"name": "test_sampling", "arguments": {"prompt": "garbage"}}
            request = {"jsonrpc": "2.0", "id": ident, "method": "tools/call", "params": asking}
            async with http.stream("POST", url, json=request, headers=headers) as streamed:
                events = streamed.aiter_lines()
                asked = await _next_event(events)
                reply = {"jsonrpc": "2.0", "id": asked["id"], **answer}
                assert (await http.post(url, json=reply, headers=headers)).status_code == 202
                failed = await _next_event(events)
            assert failed["error"]["code"] == UpstreamError.code, failed
        # The upstream is still there for the next call.
        plain = {"jsonrpc": "2.0", "id": 9, "method": "tools/call"}
        plain["params"] = {"name": "test_simple_text", "arguments": {}}
        assert (await http.post(url, json=plain, headers=headers)).json()["result"]["content"]


async def _next_event(lines: Any) -> dict[str, Any]:
    with trio.fail_after(WAIT_S):
        async for line in lines:
            if line.startswith("data: "):
                return json.loads(line[len("data: ") :])
    raise AssertionError("the stream ended")
