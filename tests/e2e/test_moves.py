"""A program routed to wasm-js that computes for long moves to deno, unless something of
it was seen outside its sandbox: real Deno, the real SpiderMonkey component and a real
MCP upstream in one daemon (`wasm_moves`, docs/executors.md).

The heavy programs here take well over the 50 ms of CPU time the move waits for on
wasm-js, whatever else the machine is doing: CPU time, not wall time, is what is
counted. They would take over half a second there: the watch is looked at on a tick,
which a full collection of the test process's heap delays (it holds every thread of the
process, a tenth of a second or more), and a program that ended within such a stall
would stay where it began. So the test process's heap is frozen while they run, as
`conduit serve` freezes its own at start-up (`_frozen_heap`).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from conduit.daemon.records import code_digest
from conduit.daemon.server import ServingInfo
from conduit.executors.wasm_js import GUEST_ONLY_GLOBALS
from tests.conftest import RawClient
from tests.e2e.test_events import next_event
from tests.e2e.test_streaming import collect, joined
from tests.e2e.test_tools import shared, shared_daemon  # noqa: F401 (fixtures)
from tests.served import Served


@pytest.fixture(scope="module", autouse=True)
def _frozen_heap() -> Iterator[None]:
    """What the test process gathered before these tests (an xdist worker's thousands)
    is left out of its collections while they run, as the daemon's start-up heap is in
    `conduit serve`: walking it all stalled the daemon's threads past a whole program."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


FIB = "function fib(n: number): number { return n < 2 ? n : fib(n - 1) + fib(n - 2); }\n"

HEAVY = {
    "a recursion, in TypeScript": ("typescript", FIB + "fib(29)", 514229),
    "word counts over a large input, printed": (
        "javascript",
        "console.log('counting');\n"
        "const counts = new Map();\n"
        "for (let i = 0; i < 1000000; i++) {\n"
        "  const word = 'w' + (i % 5000);\n"
        "  counts.set(word, (counts.get(word) ?? 0) + 1);\n"
        "}\n"
        "console.log('counted');\n"
        "[counts.size, counts.get('w7')]",
        [5000, 200],
    ),
}

STAYS = {
    "a tool call made first": (
        "typescript",
        "const said = await tools.echo.echo({ text: 'hi' });\n" + FIB + "[said, fib(27)]",
        ["hi", 196418],
    ),
    "the guest's own fs": (
        "javascript",
        "fs.writeFileSync('out/n.txt', '27');\n"
        + FIB.replace(": number", "")
        + "fib(Number(fs.readFileSync('out/n.txt', 'utf8')))",
        196418,
    ),
    "a global only the guest has": (
        "javascript",
        FIB.replace(": number", "")
        + "const n = fib(27);\n"
        + "try { (function deeper() { deeper(); })(); } catch (e) {\n"
        + "  if (!(e instanceof InternalError)) throw e;\n"
        + "}\n"
        + "n",
        196418,
    ),
}


async def execute(client: RawClient, language: str, code: str, **params: Any) -> dict[str, Any]:
    request = {"language": language, "code": code, "limits": {"timeout_ms": 60_000}, **params}
    result: dict[str, Any] = await client.call("execute", request)
    return result


async def answered_on(
    client: RawClient, case: tuple[str, str, Any], answered_by: str, **params: Any
) -> dict[str, Any]:
    """The result of running `case` (language, code, value), checked: `ok`, its value,
    from `answered_by`."""
    language, code, value = case
    result = await execute(client, language, code, **params)
    assert (result["status"], result["executor"], result["result"]) == ("ok", answered_by, value)
    return result


WHERE = {**dict.fromkeys(HEAVY, "deno"), **dict.fromkeys(STAYS, "wasm-js")}


@pytest.mark.parametrize("name", WHERE)
async def test_a_program_moves_to_deno_unless_something_of_it_was_seen(
    shared: RawClient,  # noqa: F811
    name: str,
) -> None:
    case, where = {**HEAVY, **STAYS}[name], WHERE[name]
    routed = await answered_on(shared, case, where)
    named = await answered_on(shared, case, where, executor=where)
    # Its output once, its calls once: nothing of a run that was given up.
    assert (routed["stdout"], routed["stderr"]) == (named["stdout"], named["stderr"])
    assert routed["tool_calls"] == named["tool_calls"] == case[1].count("tools.")


async def event_of(watcher: RawClient, code: str) -> dict[str, Any]:
    """The next event `watcher` is sent about a run of `code` (not another test's)."""
    while (event := await next_event(watcher))["code_sha256"] != code_digest(code):
        pass
    return event


async def test_a_move_is_told_and_the_running_row_names_where_it_runs(
    shared_daemon: Served[ServingInfo],  # noqa: F811
    connect: Any,
) -> None:
    """`execution.moved` as it happens; `executions/list` then lists the program running
    on deno, not on wasm-js where it began (it computes, moves, then sleeps there until
    it is cancelled, however long the store takes to write its row)."""
    watcher, runner, lister = [await connect(shared_daemon.value) for _ in range(3)]
    await watcher.call("events/subscribe", {"types": ["execution.started", "execution.moved"]})
    code = FIB + "fib(29);\nawait new Promise((r) => setTimeout(r, 50_000));\n'slept'"
    results: list[dict[str, Any]] = []

    async def run() -> None:
        results.append(await execute(runner, "typescript", code))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        with trio.fail_after(30):
            started, moved = [await event_of(watcher, code) for _ in range(2)]
        assert (started["type"], started["executor"]) == ("execution.started", "wasm-js")
        told = {**started, "type": "execution.moved", "executor": "deno", "from": "wasm-js"}
        assert moved == {**told, "ts": moved["ts"]}
        with trio.fail_after(30):
            while True:  # the running row is written within the store's batch delay
                query = {"code_sha256": code_digest(code)}
                [row] = (await lister.call("executions/list", query))["executions"]
                if row["executor"] == "deno":
                    break
                await trio.sleep(0.02)
        assert row["status"] == "running"
        await lister.call("executions/cancel", {"execution_id": moved["execution_id"]})
    assert (results[0]["status"], results[0]["executor"]) == ("cancelled", "deno")


async def test_the_names_that_keep_a_program_are_the_globals_deno_lacks(
    shared: RawClient,  # noqa: F811
) -> None:
    """A program naming a global only the guest has would fail on deno: the list is both
    runtimes' difference, no more, no less (a SpiderMonkey upgrade fails here)."""
    code = (
        "let o = globalThis; const names = new Set();\n"
        "while (o) { for (const n of Object.getOwnPropertyNames(o)) names.add(n); "
        "o = Object.getPrototypeOf(o) }\n[...names]"
    )
    on_deno = await execute(shared, "javascript", code, executor="deno")
    on_wasm_js = await execute(shared, "javascript", code, executor="wasm-js")
    assert set(on_wasm_js["result"]) - set(on_deno["result"]) == GUEST_ONLY_GLOBALS


async def test_a_recursion_deeper_than_deno_allows_answers_where_it_began(
    shared: RawClient,  # noqa: F811
) -> None:
    """wasm-js's stack holds ~51,000 calls, deno's ~13,000: a program that computed past
    the move and then recursed 20,000 deep overflowed on deno, where it would have
    answered. Unseen, it runs again where it began."""
    depth = "function depth(n: number): number { return n && 1 + depth(n - 1); }\n"
    code = FIB + depth + "fib(29);\ndepth(20000)"
    result = await execute(shared, "typescript", code)
    assert (result["status"], result["executor"], result["result"]) == ("ok", "wasm-js", 20000)
    called = code.replace("depth(20000)", "await tools.echo.echo({ text: 'hi' });\ndepth(20000)")
    told = await execute(shared, "typescript", called)
    # Seen outside (a tool call made on deno): it ends as it ended there.
    assert (told["status"], told["executor"], told["tool_calls"]) == ("error", "deno", 1), told
    assert told["error"]["type"] == "RangeError"
    # Streamed, having streamed nothing: unseen all the same.
    quiet = {"language": "typescript", "code": code, "stream": True}
    await shared.send({"jsonrpc": "2.0", "id": 1, "method": "execute", "params": quiet})
    pieces, reply = await collect(shared, 1)
    assert pieces == []
    assert (reply["result"]["status"], reply["result"]["executor"]) == ("ok", "wasm-js")
    talking = {**quiet, "code": code.replace("depth(20000)", "console.log('deep');\ndepth(20000)")}
    await shared.send({"jsonrpc": "2.0", "id": 2, "method": "execute", "params": talking})
    pieces, reply = await collect(shared, 2)
    assert joined(pieces, "stdout") == "deep\n"  # streamed from deno: it ends there
    assert (reply["result"]["status"], reply["result"]["executor"]) == ("error", "deno")


async def test_a_named_executor_runs_the_program_to_its_end(shared: RawClient) -> None:  # noqa: F811
    await answered_on(shared, HEAVY["a recursion, in TypeScript"], "wasm-js", executor="wasm-js")


async def test_light_or_waiting_programs_stay_on_wasm_js(shared: RawClient) -> None:  # noqa: F811
    light = await execute(
        shared, "typescript", "let n: number = 0;\nfor (let i = 0; i < 1e4; i++) n += i;\nn"
    )
    assert (light["executor"], light["result"]) == ("wasm-js", 49995000)
    # A second of waiting takes next to no CPU time.
    waiting = "await new Promise((r) => setTimeout(r, 1000));\n'waited'"
    waited = await execute(shared, "javascript", waiting)
    assert (waited["executor"], waited["result"]) == ("wasm-js", "waited")


async def test_a_moved_program_keeps_its_timeout(shared: RawClient) -> None:  # noqa: F811
    spun = await shared.call(
        "execute",
        {"language": "javascript", "code": "for (;;) {}", "limits": {"timeout_ms": 1500}},
    )
    assert (spun["status"], spun["executor"]) == ("timeout", "deno"), spun
    assert "within 1500 ms" in spun["error"]["message"]


async def test_a_streamed_program_moves_only_while_it_has_streamed_nothing(
    shared: RawClient,  # noqa: F811
) -> None:
    _, code, value = HEAVY["a recursion, in TypeScript"]
    quiet = {"language": "typescript", "code": code + ";\nconsole.log('done')", "stream": True}
    await shared.send({"jsonrpc": "2.0", "id": 1, "method": "execute", "params": quiet})
    pieces, reply = await collect(shared, 1)
    result = reply["result"]
    assert (result["status"], result["executor"]) == ("ok", "deno"), result
    assert joined(pieces, "stdout") == result["stdout"] == "done\n"  # streamed once
    talking = {**quiet, "code": "console.log('start');\n" + code}
    await shared.send({"jsonrpc": "2.0", "id": 2, "method": "execute", "params": talking})
    pieces, reply = await collect(shared, 2)
    result = reply["result"]
    assert (result["status"], result["executor"], result["result"]) == ("ok", "wasm-js", value)
    assert joined(pieces, "stdout") == result["stdout"] == "start\n"
