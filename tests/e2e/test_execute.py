"""Executions end to end: a real daemon, a real socket, real Deno."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from conduit.core.errors import (
    ExecutorUnavailable,
    InvalidParams,
    LimitTimeout,
    NotFound,
    Overloaded,
    RateLimited,
)
from conduit.daemon.server import Daemon
from tests.e2e.helpers import execute


async def test_result_output_and_shape(client: Any) -> None:
    result = await execute(client, "console.log('hi'); console.error('warn'); return {a: [1, 2]}")
    assert result["status"] == "ok"
    assert result["result"] == {"a": [1, 2]}
    assert result["stdout"] == "hi\n"
    assert result["stderr"] == "warn\n"
    assert result["exit_code"] == 0
    assert result["error"] is None
    assert result["truncated"] == {"stdout": False, "stderr": False}
    assert result["executor"] == "wasm-js"  # TypeScript whose types erase: no Deno needed
    assert result["execution_id"].startswith("ex_")
    assert set(result) == {
        "execution_id", "status", "result", "stdout", "stderr", "exit_code", "error",
        "truncated", "tool_calls", "duration_ms", "queue_ms", "executor", "memory_peak_bytes",
        "session_id", "session_reset", "files",
    }  # fmt: skip


async def test_final_expression_inputs_and_typescript(client: Any) -> None:
    code = "interface P { n: number }\nconst p: P = inputs as P;\np.n * 2"
    result = await execute(client, code, inputs={"n": 21})
    assert result["result"] == 42


async def test_javascript_and_markdown_fence(client: Any) -> None:
    fenced = "```js\nconst xs = [1, 2, 3];\nxs.map((x) => x * 2)\n```"
    result = await client.call("execute", {"language": "js", "code": fenced})
    assert result["result"] == [2, 4, 6]


async def test_thrown_error_is_a_result_with_user_line_numbers(client: Any) -> None:
    result = await execute(client, "console.log('before');\nthrow new TypeError('boom');")
    assert result["status"] == "error"
    assert result["stdout"] == "before\n"
    assert result["error"]["type"] == "TypeError"
    assert result["error"]["message"] == "boom"
    assert ":2:" in result["error"]["traceback"]


async def test_timeout_keeps_partial_output(client: Any) -> None:
    code = "console.log('started'); while (true) {}"
    result = await execute(client, code, limits={"timeout_ms": 500})
    assert result["status"] == "timeout"
    assert result["stdout"] == "started\n"
    assert 400 <= result["duration_ms"] < 10_000


async def test_params_errors_name_the_field(client: Any) -> None:
    cases = [
        ({"language": "cobol", "code": "1"}, "language"),
        ({"language": "typescript"}, "code"),
        ({"language": "typescript", "code": "   \n"}, "code"),
        (
            {"language": "typescript", "code": "1", "limits": {"timeout_ms": 10**9}},
            "limits.timeout_ms",
        ),
        (
            {"language": "typescript", "code": "1", "limits": {"timeout_ms": -1}},
            "limits.timeout_ms",
        ),
        ({"language": "typescript", "code": "1", "executor": "nope"}, "executor"),
        ({"language": "typescript", "code": "1", "colour": "red"}, "colour"),
    ]
    for params, field in cases:
        reply = await client.request("execute", params)
        assert reply["error"]["code"] == InvalidParams.code, params
        assert reply["error"]["data"]["field"] == field, reply
        assert field in reply["error"]["message"]


async def test_oversize_code_is_refused(start_daemon: Any, connect: Any) -> None:
    _, info = await start_daemon(limits={"max_code_bytes": 1000})
    client = await connect(info)
    reply = await client.request("execute", {"language": "typescript", "code": "1;" * 1000})
    assert reply["error"]["code"] == InvalidParams.code
    assert "2000 bytes; the limit is 1000" in reply["error"]["message"]


async def test_python_without_its_executor_is_unavailable_with_a_reason(
    start_daemon: Any, connect: Any
) -> None:
    _, info = await start_daemon(executors={"wasm_python": {"enabled": False}})
    client = await connect(info)
    reply = await client.request("execute", {"language": "python", "code": "1"})
    assert reply["error"]["code"] == ExecutorUnavailable.code
    assert "wasm-python" in reply["error"]["message"]


async def test_cancel_by_request_id_answers_cancelled(
    client: Any, connect: Any, daemon: Any
) -> None:
    await client.send(
        {"jsonrpc": "2.0", "id": "long", "method": "execute",
         "params": {"language": "typescript", "code": "console.log('working');\nwhile (true) {}"}}
    )  # fmt: skip
    # Long enough running for its first line to have been printed.
    await _wait_running(daemon[0], 1, min_ms=300)
    cancelled = await client.request("executions/cancel", {"request_id": "long"})
    replies = [cancelled, await client.recv()]
    by_id = {reply["id"]: reply for reply in replies}
    assert by_id[cancelled["id"]]["result"]["cancelled"] is True
    assert by_id["long"]["result"]["status"] == "cancelled"
    assert by_id["long"]["result"]["stdout"] == "working\n"  # partial output is kept
    assert by_id["long"]["result"]["error"]["type"] == "Cancelled"
    missing = await client.request("executions/cancel", {"execution_id": "ex_nope"})
    assert missing["error"]["code"] == NotFound.code


async def test_a_client_whose_calls_fill_its_slots_can_still_cancel_them(
    start_daemon: Any, connect: Any
) -> None:
    """MCP's `notifications/cancelled` is read past `max_in_flight_per_connection`
    running calls, and stops a call still waiting for a slot before it runs."""
    server, info = await start_daemon(server={"max_in_flight_per_connection": 2})
    client = await connect(info)

    async def endless(ident: Any) -> None:
        await client.send(
            {"jsonrpc": "2.0", "id": ident, "method": "execute",
             "params": {"language": "javascript", "code": "while (true) {}"}}
        )  # fmt: skip

    async def cancel(ident: Any) -> None:
        params = {"requestId": ident}
        await client.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params})

    for ident in ("a", "b", 7):
        await endless(ident)
    await _wait_running(server, 2)
    for ident in (True, 7.0, "7", "a"):  # those that only look like 7 name nothing
        await cancel(ident)
    assert (await client.recv())["result"]["status"] == "cancelled"  # "a"
    await _wait_running(server, 2)  # "b", and 7 in the slot "a" left
    await endless("late")
    await cancel("late")
    late = await client.recv()
    assert late["id"] == "late" and "request cancelled" in late["error"]["message"]
    for ident in ("b", 7):
        await cancel(ident)
    replies = {reply["id"]: reply for reply in [await client.recv(), await client.recv()]}
    assert {replies[i]["result"]["status"] for i in ("b", 7)} == {"cancelled"}
    assert (await client.call("ping")) == {}


async def _wait_running(server: Any, count: int, min_ms: float = 0) -> None:
    """Until `count` executions have been running for at least `min_ms`."""
    with trio.fail_after(20):
        while sum(e["running_ms"] >= min_ms for e in server.executions.running()) < count:
            await trio.sleep(0.01)


async def test_full_queue_answers_overloaded_with_the_request_id(
    start_daemon: Any, connect: Any
) -> None:
    server, info = await start_daemon(limits={"max_concurrent_executions": 1, "queue_size": 0})
    busy, other = await connect(info), await connect(info)
    await busy.send(
        {"id": 1, "method": "execute", "params": {"language": "ts", "code": "while (true) {}"}}
    )
    await _wait_running(server, 1)
    reply = await other.request("execute", {"language": "typescript", "code": "1"})
    assert reply["id"] == 1 and reply["error"]["code"] == Overloaded.code
    assert "retry later" in reply["error"]["message"]
    server.executions.cancel_all()
    assert (await busy.recv())["result"]["status"] == "cancelled"


async def test_rate_limit_applies_per_principal(start_daemon: Any, connect: Any) -> None:
    _, info = await start_daemon(limits={"executions_per_minute": 1, "burst": 1})
    client = await connect(info)
    assert (await execute(client, "1"))["status"] == "ok"
    reply = await client.request("execute", {"language": "typescript", "code": "1"})
    assert reply["error"]["code"] == RateLimited.code
    assert reply["error"]["data"]["retry_after_s"] > 0


async def test_builtin_execution_tools_over_mcp(client: Any) -> None:
    listed = await client.call("tools/list")
    names = [tool["name"] for tool in listed["tools"]]
    assert names == ["execute_python", "execute_typescript", "execute_javascript"]
    schema = listed["tools"][1]["inputSchema"]
    assert schema["required"] == ["code"] and "language" not in schema["properties"]
    ok = await client.call(
        "tools/call", {"name": "execute_typescript", "arguments": {"code": "2 + 3"}}
    )
    assert ok["isError"] is False
    assert ok["structuredContent"]["result"] == 5
    failed = await client.call(
        "tools/call", {"name": "execute_typescript", "arguments": {"code": "throw new Error('x')"}}
    )
    assert failed["isError"] is True
    missing = await client.request("tools/call", {"name": "nope", "arguments": {}})
    assert missing["error"]["code"] == NotFound.code


@pytest.mark.parametrize("alias", ["mcp.executeTypeScript", "mcp_execute_typescript"])
async def test_seed_aliases_answer_the_seed_shape(client: Any, alias: str) -> None:
    result = await client.call(alias, {"code": "console.log('x'); 1"})
    assert result == {"stdout": "x\n", "stderr": "", "exitCode": 0}
    reply = await client.request(
        alias, {"code": "console.log('p'); while(true){}", "limits": {"timeoutMs": 300}}
    )
    assert reply["error"]["code"] == LimitTimeout.code
    assert reply["error"]["data"]["stdout"] == "p\n"


async def test_executors_list_reports_deno_and_its_pool(client: Any) -> None:
    listed = await client.call("executors/list")
    deno = next(e for e in listed["executors"] if e["name"] == "deno")
    assert deno["available"] is True
    assert deno["version"].startswith("2.")
    assert deno["pool"] is not None
    python = next(e for e in listed["executors"] if e["name"] == "wasm-python")
    assert python["available"] is True and python["version"].startswith("CPython 3.14")
    assert listed["defaults"]["typescript"] == "wasm-js"


async def test_nc_style_session(client: Any) -> None:
    """What a person types: typos, bad JSON, a batch, a notification, then real work."""
    await client.send_line('{"id":1,"method":"pnig"}')
    assert "did you mean 'ping'" in (await client.recv())["error"]["message"]
    await client.send_line("{id:2}")
    assert (await client.recv())["error"]["code"] == -32700
    await client.send_line('{"method":"ping"}')  # a notification: nothing comes back
    await client.send_line('[{"id":3,"method":"ping"},{"id":4,"method":"auth/whoami"}]')
    batch = await client.recv()
    assert sorted(item["id"] for item in batch) == [3, 4]
    await client.send_line('{"id":5,"method":"execute","params":{"language":"ts","code":"6*7"}}')
    assert (await client.recv())["result"]["result"] == 42


async def test_a_program_may_declare_its_own_inputs(client: Any) -> None:
    result = await execute(client, "const inputs = [1, 2];\ninputs.length", inputs={"x": 1})
    assert result["status"] == "ok", result
    assert result["result"] == 2


async def test_the_first_request_waits_for_an_executor_still_loading(
    nursery: trio.Nursery, make_config: Any, connect: Any
) -> None:
    """Under socket activation the first request is what starts the daemon: it must
    get its result, not "being built", while the component loads from its cache."""
    config = make_config()
    daemon = Daemon(config)
    info = await nursery.start(daemon.serve)  # not waiting for the executors
    client = await connect(info)
    listed = await client.call("executors/list")
    loading = next(e for e in listed["executors"] if e["name"] == "wasm-python")
    result = await client.call("execute", {"language": "python", "code": "6 * 7"})
    assert (result["status"], result["result"]) == ("ok", 42), result
    if not loading["available"]:  # it was still loading: the wait is in queue_ms
        assert result["queue_ms"] > 0, result
