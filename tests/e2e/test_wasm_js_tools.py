"""JavaScript on wasm-js calling real MCP upstreams, held to the TypeScript SDK's contract.

Each program runs on wasm-js and on Deno in the same daemon; the answers must match.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from conduit.core.errors import Forbidden
from tests.conftest import RawClient
from tests.e2e.helpers import wait_upstreams
from tests.e2e.test_tools import ECHO, shared, shared_daemon, tooled  # noqa: F401 (fixtures)

ON_BOTH = [
    # Tool calls and their values.
    """
const said = await tools.echo.echo({ text: "hi" });
const sum = await tools.echo.add({ a: 2, b: 3 });
const now = await tools.time.get_current_time({ timezone: "UTC" });
return { said, sum, tz: now.timezone };
""",
    # ToolError: a tool's own failure, and a tool that does not exist.
    """
const caught = [];
for (const attempt of [
  () => tools.echo.fail({ message: "nope" }),
  () => tools.echo.no_such_tool({}),
]) {
  try { await attempt(); } catch (e) {
    const { code, tool, message } = e;
    caught.push({ isToolError: e instanceof ToolError, name: e.name, code, tool, message });
  }
}
caught
""",
    # Discovery.
    """
const found = await tools.$discover();
found.filter((t) => t.path.startsWith("echo.")).map((t) => [t.id, t.path]).sort()
""",
    # Concurrent calls come back matched.
    "await Promise.all([0, 1, 2, 3].map((i) => tools.echo.add({ a: i, b: 100 })))",
    # The event loop runs while calls are out: calls at once answer as they finish, a
    # timer wins a race against a slow tool, an interval ticks, an abort fires.
    """
const order = [];
await Promise.all([
  tools.echo.slow({ seconds: 0.3 }).then(() => order.push("slow")),
  tools.echo.echo({ text: "fast" }).then((text) => order.push(text)),
]);
order
""",
    """
const late = new Promise((_, reject) => setTimeout(() => reject(new Error("too slow")), 50));
await Promise.race([tools.echo.slow({ seconds: 5 }), late]).catch((e) => e.message)
""",
    """
let ticks = 0;
const ticking = setInterval(() => ticks++, 10);
await tools.echo.slow({ seconds: 0.3 });
clearInterval(ticking);
ticks > 2
""",
    """
const signal = AbortSignal.timeout(50);
const aborted = new Promise((resolve) => { signal.onabort = () => resolve("aborted"); });
await Promise.race([tools.echo.slow({ seconds: 5 }), aborted])
""",
    # A call's promise, once it has succeeded (or is handled), is a plain promise.
    """
const call = tools.echo.echo({ text: "tool" });
const order = [];
call.then(() => order.push("then"));
await call;
order.push("await");
const first = await Promise.race([call, Promise.resolve("native")]);
[first, Promise.resolve(call) === call, call.constructor === Promise, order]
""",
    # A `toJSON` planted on Object.prototype changes no call (nor hangs one).
    """
Object.prototype.toJSON = function () {
  return this.method === "tools/call" ? { method: "auth/whoami", params: {} } : this;
};
await tools.echo.echo({ text: "x" })
""",
    # Failures handled however a program handles them: none is left unhandled.
    """
const failing = tools.echo.fail({ message: "handled" });
failing.catch(() => {});
const settled = await Promise.allSettled([tools.echo.fail({ message: "settled" })]);
let caught;
try { await Promise.all([tools.echo.echo({ text: "a" }), tools.echo.fail({ message: "all" })]); }
catch (e) { caught = e.message; }
const later = tools.echo.fail({ message: "later" }).then(() => "no", (e) => e.message);
[settled[0].reason.message, caught, await later]
""",
    # What the program plants on prototypes never reaches the answers' reader: a
    # throwing `error` getter, replaced Map methods, a throwing setter as an error is
    # made (that call fails with it; the next is answered).
    """
Object.defineProperty(Object.prototype, "error", { get() { throw new Error("getter"); } });
Object.defineProperty(Object.prototype, "result", { get() { throw new Error("getter"); } });
Map.prototype.get = () => { throw new Error("get"); };
Map.prototype.set = () => { throw new Error("set"); };
const said = await tools.echo.echo({ text: "hi" });
const both = await Promise.all([
  tools.echo.echo({ text: "a" }),
  tools.echo.slow({ seconds: 0.05 }),
]);
Object.defineProperty(Error.prototype, "code", { set() { throw new Error("setter"); } });
const failed = await tools.echo.fail({ message: "no" }).then(() => "made", (e) => e.message);
[said, both[0], failed, await tools.echo.echo({ text: "after" })]
""",
]


async def run(client: Any, code: str, executor: str, **params: Any) -> dict[str, Any]:
    request = {"language": "javascript", "executor": executor, "code": code, **params}
    return await client.call("execute", request)


@pytest.mark.parametrize("code", ON_BOTH)
async def test_programs_get_the_same_answers_as_on_deno(shared: RawClient, code: str) -> None:  # noqa: F811
    client = shared
    on_wasm = await run(client, code, "wasm-js")
    on_deno = await run(client, code, "deno")
    assert on_wasm["status"] == "ok", on_wasm
    assert on_wasm["executor"] == "wasm-js"
    assert on_wasm["result"] == on_deno["result"]
    assert on_wasm["tool_calls"] == on_deno["tool_calls"]


async def test_javascript_defaults_to_wasm_js_and_calls_tools(shared: RawClient) -> None:  # noqa: F811
    client = shared
    code = "const r = await tools.echo.add({ a: 40, b: 2 });\nr.sum"
    result = await client.call("execute", {"language": "javascript", "code": code})
    assert (result["executor"], result["result"], result["tool_calls"]) == ("wasm-js", 42, 1)


async def test_tool_errors_carry_the_daemon_codes(shared: RawClient) -> None:  # noqa: F811
    client = shared
    result = await run(client, ON_BOTH[1], "wasm-js")
    failed, missing = result["result"]
    assert failed["code"] == -32007 and failed["tool"] == "echo__fail"
    assert missing["code"] == Forbidden.code and missing["name"] == "ToolError"


async def test_the_allowlist_binds_the_program(shared: RawClient) -> None:  # noqa: F811
    client = shared
    code = """
const listed = (await tools.$discover()).map((t) => t.path);
let refused;
try { await tools.time.get_current_time({ timezone: "UTC" }); } catch (e) { refused = e.code; }
return { listed, echoed: await tools.echo.echo({ text: "ok" }), refused };
"""
    result = await run(client, code, "wasm-js", allowed_tools=["echo.echo"])
    assert result["result"] == {"listed": ["echo.echo"], "echoed": "ok", "refused": Forbidden.code}


async def test_the_tool_call_limit_stops_the_program_and_keeps_its_output(
    shared: RawClient,  # noqa: F811
) -> None:
    client = shared
    code = "for (let i = 0; ; i++) { console.log(i); await tools.echo.echo({ text: 'x' }); }"
    result = await run(client, code, "wasm-js", limits={"tool_calls": 3})
    assert result["status"] == "tool_limit", result
    assert result["stdout"].startswith("0\n1\n2\n3\n")
    assert result["error"]["type"] == "ToolLimit"


@pytest.mark.parametrize("executor", ["wasm-js", "deno"])
async def test_a_program_catching_the_tool_limit_is_stopped_with_no_result(
    shared: RawClient,  # noqa: F811
    executor: str,
) -> None:
    code = """
const out = [];
for (let i = 0; i < 5; i++) {
  try { await tools.echo.echo({ text: "x" }); out.push("ok"); } catch (e) { out.push(e.message); }
}
out
"""
    for _ in range(3):
        result = await run(shared, code, executor, limits={"tool_calls": 2})
        assert (result["status"], result["result"]) == ("tool_limit", None), result


async def test_a_program_waiting_on_a_slow_tool_is_stopped_at_its_timeout(
    tooled: Any,  # noqa: F811
) -> None:
    """The tool call in flight is cancelled with the execution, not left to finish:
    no thread stays behind waiting for the upstream's 10 s."""
    server, _, client = await tooled()
    started = trio.current_time()
    code = "console.log('waiting');\nawait tools.echo.slow({ seconds: 10 });"
    # Time enough for a loaded machine to reach the call, far short of its 10 s.
    result = await run(client, code, "wasm-js", limits={"timeout_ms": 1500})
    assert result["status"] == "timeout", result
    assert result["stdout"] == "waiting\n"
    assert trio.current_time() - started < 5
    executor = server.registry.pick("javascript", "wasm-js")
    with trio.fail_after(5):
        while executor.info().pool["lingering_threads"] != 0:
            await trio.sleep(0.05)  # the count changes in a worker thread
    again = await run(client, "await tools.echo.echo({ text: 'after' })", "wasm-js")
    assert (again["status"], again["result"]) == ("ok", "after")


@pytest.mark.parametrize("executor", ["wasm-js", "deno"])
async def test_a_call_the_program_did_not_await_is_made(tooled: Any, executor: str) -> None:  # noqa: F811
    """A program that starts a call and answers at once (a forgotten `await`): the call
    is made on both, as the next program sees."""
    _, _, client = await tooled()
    left = await run(client, 'tools.echo.add_tool({ name: "added" });\n"answered"', executor)
    assert (left["status"], left["result"], left["tool_calls"]) == ("ok", "answered", 1)
    listed = "(await tools.$discover()).some((tool) => tool.path === 'echo.added')"
    with trio.fail_after(10):
        while not (await run(client, listed, executor))["result"]:
            await trio.sleep(0.05)


async def test_calls_made_at_once_reach_the_upstream_in_the_order_made(
    start_daemon: Any, connect: Any
) -> None:
    """`Promise.all` of calls with side effects: the upstream sees them in program order,
    every time (a create before its update), on both."""
    counting = {**ECHO, "args": [*ECHO["args"], "--arrival"]}
    server, info = await start_daemon(upstreams=[counting])
    await wait_upstreams(server, "echo")
    client = await connect(info)
    code = """
const seen = await Promise.all(Array.from({ length: 12 }, () => tools.echo.arrival({})));
const first = seen[0].before;
seen.map((answer) => answer.before - first)
"""
    for executor in ["wasm-js", "deno"] * 3:
        outcome = await run(client, code, executor)
        assert (outcome["status"], outcome["result"]) == ("ok", list(range(12))), outcome


# Calls started last and never awaited.
FIRE_AND_FORGET = """
for (let i = 0; i < {count}; i++) tools.echo.{call};
"sent"
"""


async def test_calls_a_program_never_awaited_are_all_made_on_both(
    start_daemon: Any, connect: Any
) -> None:
    """Thirty calls started last and never awaited: every one is made, on wasm-js and on
    deno (whose worker exits as it answers: the daemon read only a few of them before
    the execution's session ended, and refused the rest)."""
    counting = {**ECHO, "args": [*ECHO["args"], "--arrival"]}
    server, info = await start_daemon(upstreams=[counting])
    await wait_upstreams(server, "echo")
    client = await connect(info)
    for executor in ["wasm-js", "deno"]:
        outcome = await run(client, FIRE_AND_FORGET.format(count=30, call="arrival({})"), executor)
        assert (outcome["status"], outcome["result"], outcome["tool_calls"]) == (
            "ok",
            "sent",
            30,
        ), outcome
    # And they reach the server: calls before this one, each time it asks.
    made = "(await tools.echo.arrival({})).before"
    with trio.fail_after(10):
        for asked in range(1000):
            if (await run(client, made, "wasm-js"))["result"] == 60 + asked:
                break
            await trio.sleep(0.02)


async def test_calls_a_deno_program_left_running_take_the_daemons_room(
    start_daemon: Any, connect: Any
) -> None:
    """Once its worker has exited, a deno program's calls still running are counted in
    the room for calls left behind, as soon as the worker is gone (they went uncounted
    until one of them ended and its answer could not be written)."""
    server, info = await start_daemon(upstreams=[ECHO])
    await wait_upstreams(server, "echo")
    client = await connect(info)
    code = FIRE_AND_FORGET.format(count=10, call="slow({ seconds: 20 })")
    outcome = await run(client, code, "deno")
    assert (outcome["status"], outcome["tool_calls"]) == ("ok", 10), outcome
    with trio.fail_after(10):  # well before the calls' 20 s
        while server.left_calls.count < 10:
            await trio.sleep(0.02)
    assert server.left_calls.held("") == (0, 0)  # charged to the client, not to nobody


@pytest.mark.parametrize("executor", ["wasm-js", "deno"])
async def test_calls_left_past_the_tool_limit_are_dropped_not_a_stop(
    shared: RawClient,  # noqa: F811
    executor: str,
) -> None:
    """A program that answers having started more calls than `limits.tool_calls` allows:
    those within the limit are made, the rest dropped, and its answer stands."""
    code = FIRE_AND_FORGET.format(count=30, call="echo({ text: 'x' })")
    outcome = await run(shared, code, executor, limits={"tool_calls": 10})
    assert (outcome["status"], outcome["result"], outcome["tool_calls"]) == (
        "ok",
        "sent",
        10,
    ), outcome


async def test_large_calls_made_at_once_on_deno_each_arrive_whole(
    shared: RawClient,  # noqa: F811
) -> None:
    """Messages larger than the worker's socket takes at once, sent together: none is cut
    into another (each takes several writes, which interleaved, and the program hung)."""
    code = """
const sent = ["a", "b", "c"].map((letter) => letter.repeat(2e6));
const back = await Promise.all(sent.map((text) => tools.echo.echo({ text })));
back.map((text, i) => text === sent[i])
"""
    outcome = await run(shared, code, "deno", limits={"timeout_ms": 20_000})
    assert (outcome["status"], outcome["result"]) == ("ok", [True, True, True]), outcome


async def test_a_call_longer_than_the_daemon_reads_fails_at_once_on_deno(
    shared: RawClient,  # noqa: F811
) -> None:
    """A call over `server.max_message_bytes` (8 MiB): the worker's SDK refuses it with a
    ToolError, where the daemon's refusal, a reply naming no call, left it waiting until
    the program's timeout."""
    code = """
let caught = null;
try {
  await tools.echo.echo({ text: "x".repeat(9 * 1024 * 1024) });
} catch (e) {
  caught = [e.name, e.code, e.message.includes("server.max_message_bytes")];
}
caught
"""
    outcome = await run(shared, code, "deno", limits={"timeout_ms": 20_000})
    assert (outcome["status"], outcome["result"], outcome["tool_calls"]) == (
        "ok",
        ["ToolError", -32600, True],
        0,
    ), outcome


async def test_a_call_the_daemon_cannot_read_fails_at_once_on_both(
    shared: RawClient,  # noqa: F811
) -> None:
    """An argument past Python's digit limit (`JSON.rawJSON`), or nested deeper than the
    daemon reads: the call fails with a ToolError (on deno both waited for the
    program's timeout, the daemon's parse error naming no request). wasm-js's
    `JSON.stringify` refuses the nesting itself, with its own error."""
    code = """
let deep = [];
for (let i = 0; i < 3000; i++) deep = [deep];
const caught = [];
for (const a of [JSON.rawJSON("9".repeat(5000)), deep]) {
  try {
    await tools.echo.add({ a, b: 1 });
    caught.push(null);
  } catch (e) {
    caught.push([e.name, e.code ?? null]);
  }
}
caught
"""
    for executor, deep in [("deno", ["ToolError", -32700]), ("wasm-js", ["RangeError", None])]:
        outcome = await run(shared, code, executor, limits={"timeout_ms": 20_000})
        assert outcome["status"] == "ok", outcome
        assert outcome["result"] == [["ToolError", -32700], deep], outcome


async def test_a_failing_call_nothing_handles_ends_the_run_as_on_deno(
    shared: RawClient,  # noqa: F811
) -> None:
    """An unhandled rejection: the program is stopped with the tool's error."""
    code = (
        'tools.echo.fail({ message: "nobody listens" });\n'
        "await new Promise((resolve) => setTimeout(resolve, 300));\n'finished'"
    )
    on_wasm = await run(shared, code, "wasm-js")
    on_deno = await run(shared, code, "deno")
    assert on_wasm["status"] == on_deno["status"] == "error", (on_wasm, on_deno)
    wanted = {"type": "ToolError", "message": "nobody listens"}
    assert {key: on_wasm["error"][key] for key in wanted} == wanted
    assert {key: on_deno["error"][key] for key in wanted} == wanted


async def test_a_call_failure_answered_with_the_awaited_call_still_ends_the_run(
    shared: RawClient,  # noqa: F811
) -> None:
    """The failure and the awaited answer come back together (both calls are done while
    the program busies itself): the program answers in that same turn, and the failure
    nothing handled is still the run's."""
    code = """
tools.echo.fail({ message: "nobody awaits me" });
const echoed = tools.echo.echo({ text: "y" });
await new Promise((resolve) => setTimeout(resolve, 0)); // both sent
const end = Date.now() + 200;
while (Date.now() < end) {}
await echoed;
"done"
"""
    outcome = await run(shared, code, "wasm-js")
    assert outcome["status"] == "error", outcome
    assert (outcome["error"]["type"], outcome["error"]["message"]) == (
        "ToolError",
        "nobody awaits me",
    )
