"""Generated input against a real daemon: lines on its sockets, every method's params,
and whatever an executor could hand back.

Hypothesis drives a blocking client from a worker thread while the daemon serves in the
test's Trio loop. After every generated line comes a `ping` with an id of its own, and
every reply up to that ping's must be strict JSON (valid UTF-8, no NaN, no lone
surrogate) carrying an id the client sent or null. A crash fails the ping, a hang fails
the read's timeout, and a non-JSON reply fails the decoding.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import queue
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.core.errors import RpcError
from conduit.daemon.methods import method_table
from conduit.executors.base import ErrorInfo, ExecutorInfo, Job, Outcome, Status, ToolBridge
from conduit.executors.registry import ExecutorRegistry
from tests.conftest import MASTER_TOKEN
from tests.fuzz.strategies import (
    hostile_json,
    hostile_lines,
    hostile_numbers,
    hostile_text,
    json_escaped,
    run_counts,
)
from tests.fuzz.test_fuzz_wire import QUIET, strict_json

# A hostile line never gets more than this to be answered: far past any honest reply.
REPLY_TIMEOUT_S = 30
# Every method a daemon serves, as a fresh table lists them.
METHODS = method_table()
NO_DENO = {"executors": {"deno": {"enabled": False}, "pyodide": {"enabled": False}}}


class LineClient:
    """A blocking NDJSON client, as a script or `nc` would be."""

    def __init__(self, connect: Callable[[], socket.socket]) -> None:
        self._connect = connect
        self._sock = connect()
        self._buffer = b""
        self._ids = itertools.count()

    def close(self) -> None:
        self._sock.close()

    def exchange(self, line: bytes) -> list[Any]:
        """Send `line` then a ping; every reply up to the ping's, strictly decoded.

        A connection the daemon closed (it may, for some lines) is opened again, and the
        daemon must answer the ping on the new one.
        """
        ident = f"ping-{next(self._ids)}"
        ping = json.dumps({"jsonrpc": "2.0", "id": ident, "method": "ping"}).encode()
        try:
            self._sock.sendall(line + b"\n" + ping + b"\n")
            return self._until(ident)
        except (ConnectionError, EOFError):
            self._sock.close()
            self._sock, self._buffer = self._connect(), b""
            self._sock.sendall(ping + b"\n")
            return self._until(ident)

    def read_until(self, ident: str | int) -> list[Any]:
        """Every reply up to the one to `ident`, a request already sent."""
        return self._until(ident)

    def _until(self, ident: str | int) -> list[Any]:
        replies = []
        while True:
            reply = strict_json(self._line())
            replies.append(reply)
            found = [reply] if isinstance(reply, dict) else reply
            assert isinstance(found, list), reply
            for message in found:
                assert isinstance(message, dict), message
                assert message.get("jsonrpc") == "2.0", message
                assert ("result" in message) != ("error" in message) or "method" in message
                if "error" in message:
                    assert isinstance(message["error"]["code"], int), message
                    assert isinstance(message["error"]["message"], str), message
            if any(m.get("id") == ident for m in found):
                return replies

    def _line(self) -> bytes:
        while b"\n" not in self._buffer:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise EOFError("the daemon closed the connection")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line


def unix_client(path: str) -> Callable[[], socket.socket]:
    def connect() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(REPLY_TIMEOUT_S)
        sock.connect(path)
        return sock

    return connect


def tcp_client(address: tuple[str, int]) -> Callable[[], socket.socket]:
    def connect() -> socket.socket:
        return socket.create_connection(address, timeout=REPLY_TIMEOUT_S)

    return connect


@pytest.fixture
async def served(start_daemon: Callable[..., Any]) -> Any:
    _, info = await start_daemon(server={"tcp": "127.0.0.1:0"}, **NO_DENO)
    return info


def request_line(method: str, params: Any, ident: Any, token: str | None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": ident, "method": method}
    if params is not None:
        message["params"] = params
    if token is not None:
        message["auth"] = {"bearerToken": token}
    return json_escaped(message)


def params_for(name: str) -> st.SearchStrategy[Any]:
    """Params shaped like the method's own model (its field names, hostile values),
    or anything at all."""
    fields = sorted(METHODS[name].params.model_fields)
    keyed = st.dictionaries(
        st.sampled_from(fields) if fields else hostile_text, hostile_json, max_size=4
    )
    execute_like = st.fixed_dictionaries(
        {
            "language": st.sampled_from(["python", "javascript", "typescript", "x"]),
            "code": st.one_of(hostile_text, st.sampled_from(["1+1", "return 1", "raise x"])),
        },
        optional={"limits": st.dictionaries(st.sampled_from(["timeout_ms"]), hostile_numbers)},
    )
    options = [keyed, hostile_json]
    if name == "execute":
        options.append(execute_like)
    return st.one_of(*options)


@st.composite
def method_calls(draw: st.DrawFn) -> bytes:
    name = draw(st.one_of(st.sampled_from(METHODS.names()), hostile_text))
    params = draw(params_for(name)) if name in METHODS else draw(hostile_json)
    ident = draw(st.one_of(st.integers(), hostile_text, hostile_numbers, st.none()))
    token = draw(st.one_of(st.none(), st.just(MASTER_TOKEN), hostile_text))
    return request_line(name, params, ident, token)


async def fuzz_both_sockets(served: Any, lines: st.SearchStrategy[bytes], examples: int) -> None:
    """Send generated lines on the Unix socket and on unauthenticated TCP, each example
    on one of the two; then the daemon must still serve."""
    clients = [
        LineClient(unix_client(served.unix_path)),
        LineClient(tcp_client(served.tcp_address)),
    ]

    @settings(max_examples=examples, **QUIET)
    @given(st.sampled_from(range(len(clients))), lines)
    def prop(which: int, line: bytes) -> None:
        clients[which].exchange(line)

    try:
        await trio.to_thread.run_sync(prop)
    finally:
        for client in clients:
            client.close()
    await assert_still_serving(served)


@pytest.mark.parametrize("examples", run_counts(5_000))
async def test_no_line_on_either_socket_gets_a_bad_reply_or_stops_the_daemon(
    served: Any, examples: int
) -> None:
    await fuzz_both_sockets(served, hostile_lines, examples)


@pytest.mark.parametrize("examples", run_counts(5_000))
async def test_no_params_to_any_method_get_a_bad_reply_or_stop_the_daemon(
    served: Any, examples: int
) -> None:
    await fuzz_both_sockets(served, method_calls(), examples)


async def assert_still_serving(served: Any) -> None:
    def ping() -> list[Any]:
        client = LineClient(unix_client(served.unix_path))
        try:
            return client.exchange(b'{"id":0,"method":"daemon/status"}')
        finally:
            client.close()

    replies = await trio.to_thread.run_sync(ping)
    assert "result" in replies[0], replies


# -- what an executor hands back ---------------------------------------------------


class ScriptedExecutor:
    """Hands back whatever outcome the test queued, after making the sandbox calls the
    test queued: the daemon's side of an execution, with a program's worst answers.

    Not a runtime: this fuzzes the code around executors (records, events, audit,
    replies), which must treat whatever any executor returns as hostile.
    """

    name = "scripted"
    languages = frozenset({"python"})
    unavailable_reason = None

    def __init__(self) -> None:
        self.plans: queue.SimpleQueue[tuple[list[tuple[str, Any]], Outcome]] = queue.SimpleQueue()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep_forever()

    async def run(self, job: Job, bridge: ToolBridge) -> Outcome:
        calls, outcome = self.plans.get_nowait()
        for method, params in calls:
            with contextlib.suppress(RpcError):
                await bridge.request(method, params)
        return outcome

    def info(self) -> ExecutorInfo:
        return ExecutorInfo(self.name, tuple(self.languages), True)


def outcomes() -> st.SearchStrategy[Outcome]:
    errors = st.one_of(st.none(), st.builds(ErrorInfo, hostile_text, hostile_text, hostile_text))
    return st.builds(
        Outcome,
        status=st.sampled_from(list(Status)),
        result=hostile_json,
        stdout=hostile_text,
        stderr=hostile_text,
        exit_code=st.one_of(st.none(), st.integers(-(2**40), 2**40)),
        error=errors,
        truncated_stdout=st.booleans(),
        truncated_stderr=st.booleans(),
        tool_calls=st.integers(0, 10**6),
        memory_peak_bytes=st.one_of(st.none(), st.integers(0, 2**64)),
    )


sandbox_calls = st.lists(
    st.tuples(
        st.one_of(
            st.sampled_from(["tools/call", "tools/list", "sdk/get", "execute"]), hostile_text
        ),
        st.one_of(
            st.fixed_dictionaries({"name": hostile_text, "arguments": hostile_json}),
            st.dictionaries(hostile_text, hostile_json, max_size=3),
        ),
    ),
    max_size=2,
)


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedExecutor]:
    executor = ScriptedExecutor()

    def registry(config: Any, callback: Any) -> ExecutorRegistry:
        return ExecutorRegistry([executor], {"python": executor.name})

    monkeypatch.setattr("conduit.daemon.server.build_registry", registry)
    return executor


@pytest.mark.parametrize("examples", run_counts(2_000))
async def test_no_outcome_an_executor_returns_gets_a_bad_reply_or_stops_the_daemon(
    scripted: ScriptedExecutor, start_daemon: Callable[..., Any], examples: int
) -> None:
    _, info = await start_daemon()
    execute = request_line("execute", {"language": "python", "code": "x"}, 1, None)
    listing = request_line("executions/list", {"limit": 5}, 2, None)

    def run() -> None:
        client = LineClient(unix_client(info.unix_path))

        @settings(max_examples=examples, **QUIET)
        @given(sandbox_calls, outcomes())
        def prop(calls: list[tuple[str, Any]], outcome: Outcome) -> None:
            scripted.plans.put((calls, outcome))
            replies = client.exchange(execute)
            if not any(r.get("id") == 1 for r in replies):
                # The answer waits for its audit record's commit: the ping may come first.
                replies = client.read_until(1)
            answer = next(r for r in replies if r.get("id") == 1)
            assert answer["result"]["status"] == str(outcome.status), answer
            client.exchange(listing)

        try:
            prop()
        finally:
            client.close()

    await trio.to_thread.run_sync(run)
    await assert_still_serving(info)
