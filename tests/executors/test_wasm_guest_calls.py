"""Calls a wasm-js program starts and collects later: its event loop runs meanwhile.

The executor-level tests run the real SpiderMonkey component with a bridge of their own;
tests/e2e/test_wasm_js_tools.py holds the same programs to Deno's answers on real MCP
upstreams.
"""

from __future__ import annotations

import json
import math
from typing import Any

import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from conduit.core.errors import InvalidParams
from conduit.executors.base import Job, Limits, Outcome, Status
from conduit.executors.wasm_guest_calls import (
    CALLS_OUT_MAX,
    GuestCalls,
    LeftCalls,
    StartedCall,
    WaitRequest,
    answers_text,
)
from conduit.executors.wasm_js import WasmJsExecutor
from tests.executors.conftest import open_wasm_session
from tests.sandboxes import WAIT_S, NoBridge


class GatedBridge(NoBridge):
    """Answers each tool call with its `n` argument once `open` is set, counting how
    many calls are in flight at once."""

    def __init__(self) -> None:
        self.open = trio.Event()
        self.in_flight = 0
        self.most_in_flight = 0
        self.calls = 0

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        self.calls += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.in_flight >= CALLS_OUT_MAX:
                self.open.set()
            await self.open.wait()
            return {"value": params["arguments"].get("n")}
        finally:
            self.in_flight -= 1


class SlowBridge(NoBridge):
    """Answers `tools.t.slow({s})` after `s` seconds, anything else at once; keeps the
    names of the calls that finished."""

    def __init__(self) -> None:
        self.finished: list[str] = []

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        arguments = params["arguments"]
        await trio.sleep(arguments.get("s", 0))
        self.finished.append(arguments.get("name", params["name"]))
        return {"value": arguments.get("name", params["name"])}


async def run(executor: WasmJsExecutor, code: str, bridge: Any, **limits: Any) -> Outcome:
    with trio.fail_after(WAIT_S):
        return await executor.run(Job("ex_js", "javascript", code, Limits(**limits)), bridge)


async def test_calls_run_at_once_up_to_the_cap_and_all_are_answered(
    wasm_js: WasmJsExecutor,
) -> None:
    """Past CALLS_OUT_MAX, calls wait in the guest, in order, and none is lost."""
    count = CALLS_OUT_MAX + 44
    code = f"await Promise.all(Array.from({{ length: {count} }}, (_, n) => tools.t.x({{ n }})))"
    bridge = GatedBridge()
    outcome = await run(wasm_js, code, bridge, tool_calls=count)
    assert outcome.status is Status.OK, outcome
    assert outcome.result == list(range(count))
    assert bridge.most_in_flight == CALLS_OUT_MAX
    assert bridge.calls == outcome.tool_calls == count


async def test_timers_fire_while_a_call_is_out(wasm_js: WasmJsExecutor) -> None:
    code = """
const seen = [];
const ticking = setInterval(() => seen.push("tick"), 10);
const raced = await Promise.race([
  tools.t.slow({ s: 5, name: "slow" }),
  new Promise((resolve) => setTimeout(() => resolve("timer"), 100)),
]);
clearInterval(ticking);
return { raced, ticked: seen.length > 2 };
"""
    outcome = await run(wasm_js, code, SlowBridge())
    assert outcome.status is Status.OK, outcome
    assert outcome.result == {"raced": "timer", "ticked": True}


async def test_answers_come_back_as_calls_finish(wasm_js: WasmJsExecutor) -> None:
    code = """
const order = [];
await Promise.all([
  tools.t.slow({ s: 0.3, name: "slow" }).then((name) => order.push(name)),
  tools.t.fast({ name: "fast" }).then((name) => order.push(name)),
]);
order
"""
    outcome = await run(wasm_js, code, SlowBridge())
    assert outcome.result == ["fast", "slow"], outcome


async def test_a_call_left_out_goes_on_after_the_run(wasm_js: WasmJsExecutor) -> None:
    """As on Deno: a call the program started and never awaited is made, even when the
    run answers before it was sent."""
    bridge = SlowBridge()
    code = 'tools.t.slow({ s: 0.2, name: "left" });\n"answered"'
    outcome = await run(wasm_js, code, bridge)
    assert (outcome.status, outcome.result, outcome.tool_calls) == (Status.OK, "answered", 1)
    assert bridge.finished == []
    with trio.fail_after(WAIT_S):
        while bridge.finished != ["left"]:
            await trio.sleep(0.02)


async def test_a_timeout_while_calls_are_out_stops_the_program(wasm_js: WasmJsExecutor) -> None:
    code = "await Promise.all([tools.t.slow({ s: 60 }), tools.t.slow({ s: 60 })]);\n'never'"
    outcome = await run(wasm_js, code, SlowBridge(), timeout_ms=300)
    assert outcome.status is Status.TIMEOUT, outcome
    again = await run(wasm_js, "await tools.t.fast({ name: 'next' })", SlowBridge())
    assert (again.status, again.result) == (Status.OK, "next")


async def test_the_calls_of_a_stopped_program_are_cancelled(wasm_js: WasmJsExecutor) -> None:
    bridge = SlowBridge()
    code = """
tools.t.slow({ s: 0.5, name: "cancelled" });
await new Promise((resolve) => setTimeout(resolve, 1)); // sent: the loop was idle
while (true) {}
"""
    outcome = await run(wasm_js, code, bridge, timeout_ms=200)
    assert (outcome.status, outcome.tool_calls) == (Status.TIMEOUT, 1)
    await trio.sleep(1)
    assert bridge.finished == []


async def test_a_call_awaited_alone_is_cancelled_with_its_program(wasm_js: WasmJsExecutor) -> None:
    """The usual case, one call awaited with nothing else to run, waits in the host's
    waiting task itself: a stop ends the call too."""
    bridge = SlowBridge()
    code = 'await tools.t.slow({ s: 0.5, name: "cancelled" });\n"never"'
    outcome = await run(wasm_js, code, bridge, timeout_ms=200)
    assert (outcome.status, outcome.tool_calls) == (Status.TIMEOUT, 1)
    await trio.sleep(1)
    assert bridge.finished == []


async def test_calls_sent_as_the_run_answers_stay_within_its_tool_calls(
    wasm_js: WasmJsExecutor,
) -> None:
    """A program that starts more calls than it may make and answers at once is not
    stopped over the limit after it answered: the calls past it are not made."""
    bridge = SlowBridge()
    code = 'for (let i = 0; i < 300; i++) tools.t.fast({ name: "left" });\n"answered"'
    outcome = await run(wasm_js, code, bridge, tool_calls=40)
    assert (outcome.status, outcome.result, outcome.tool_calls) == (Status.OK, "answered", 40)
    with trio.fail_after(WAIT_S):
        while len(bridge.finished) < 40:
            await trio.sleep(0.02)
    await trio.sleep(0.1)
    assert len(bridge.finished) == 40


async def test_a_planted_to_json_cannot_change_what_is_called(wasm_js: WasmJsExecutor) -> None:
    class Recording(NoBridge):
        def __init__(self) -> None:
            self.methods: list[str] = []

        async def request(self, method: str, params: dict[str, Any]) -> Any:
            self.methods.append(method)
            return {"value": params["name"]}

    bridge = Recording()
    code = """
Object.prototype.toJSON = function () {
  return this.method === "tools/call" ? { method: "auth/whoami", params: {} } : this;
};
await tools.t.x({})
"""
    outcome = await run(wasm_js, code, bridge)
    assert (outcome.result, bridge.methods) == ("t.x", ["tools/call"]), outcome.error


async def test_errors_reject_only_their_own_call(wasm_js: WasmJsExecutor) -> None:
    class Refusing(NoBridge):
        async def request(self, method: str, params: dict[str, Any]) -> Any:
            if params["arguments"]["n"] % 2:
                raise InvalidParams("invalid params: odd", {"tool": params["name"]})
            return {"value": params["arguments"]["n"]}

    code = """
const settled = await Promise.allSettled([0, 1, 2].map((n) => tools.t.x({ n })));
settled.map((s) => s.status === "fulfilled" ? s.value : [s.reason.name, s.reason.code])
"""
    outcome = await run(wasm_js, code, Refusing())
    assert outcome.result == [0, ["ToolError", InvalidParams.code], 2], outcome


async def test_a_session_step_leaving_a_call_out_does_not_trouble_the_next(
    wasm_js: WasmJsExecutor,
) -> None:
    session = await open_wasm_session(wasm_js)
    try:
        bridge = SlowBridge()
        with trio.fail_after(WAIT_S):
            first = await session.run(
                Job("ex_1", "javascript", 'tools.t.slow({ s: 0.3, name: "left" }); 1', Limits()),
                bridge,
            )
            second = await session.run(
                Job("ex_2", "javascript", 'await tools.t.fast({ name: "next" })', Limits()),
                bridge,
            )
        assert (first.result, second.status, second.result) == (1, Status.OK, "next")
    finally:
        await session.aclose()


# -- the host's side, alone ------------------------------------------------------------


def test_a_wait_is_read_with_its_calls_and_time() -> None:
    params = {
        "start": [{"ticket": 7, "call": {"method": "tools/call", "params": {"name": "a.b"}}}],
        "timeout_ms": 250,
    }
    wait = WaitRequest.parse(params)
    assert wait.start == (StartedCall(7, "tools/call", {"name": "a.b"}),)
    assert wait.timeout_s == 0.25
    assert WaitRequest.parse({"timeout_ms": None}) == WaitRequest((), math.inf)
    # A number past any execution's time (one no float holds, too) waits without limit.
    assert WaitRequest.parse({"timeout_ms": 10**400}).timeout_s == math.inf


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
CALL = st.fixed_dictionaries({"method": JSON, "params": JSON})
STARTED = st.fixed_dictionaries({"ticket": JSON | st.integers(), "call": JSON | CALL})
WAITS = st.fixed_dictionaries({"start": st.lists(STARTED | JSON, max_size=3), "timeout_ms": JSON})


@given(WAITS | JSON)
def test_any_wait_is_read_or_refused_with_value_error(params: Any) -> None:
    """What a guest sends is hostile: it is read, or refused with a reason (which the
    guest gets as invalid params), and nothing else."""
    try:
        wait = WaitRequest.parse(json.loads(json.dumps(params)))
    except ValueError as exc:
        assert str(exc), "a refusal says why"  # noqa: PT017
        return
    assert isinstance(params, dict) and wait.timeout_s >= 0
    for call in wait.start:
        assert 0 <= call.ticket <= 2**53 and isinstance(call.method, str)


async def test_past_the_cap_a_call_is_answered_with_an_error() -> None:
    gate = trio.Event()

    async def request(method: str, params: dict[str, Any]) -> Any:
        await gate.wait()
        return params["n"]

    async with trio.open_nursery() as nursery:
        calls = GuestCalls(request, nursery)
        for ticket in range(CALLS_OUT_MAX + 1):
            calls.start(StartedCall(ticket, "m", {"n": ticket}))
        refused = json.loads(answers_text(calls.collect_nowait() or []))["result"]
        assert [ticket for ticket, _ in refused] == [CALLS_OUT_MAX]
        assert "too many calls out" in refused[0][1]["error"]["message"]
        await calls.begun()
        gate.set()
        answered: list[Any] = []
        with trio.fail_after(WAIT_S):
            while len(answered) < CALLS_OUT_MAX:
                answered += json.loads(answers_text(await calls.collect(math.inf)))["result"]
        assert sorted(answer["result"] for _, answer in answered) == list(range(CALLS_OUT_MAX))


async def test_a_call_failing_in_the_host_is_an_internal_error_not_a_crash() -> None:
    async def request(method: str, params: dict[str, Any]) -> Any:
        raise RuntimeError("broken")

    async with trio.open_nursery() as nursery:
        calls = GuestCalls(request, nursery)
        calls.start(StartedCall(1, "m", {}))
        with trio.fail_after(WAIT_S):
            ((ticket, answer),) = json.loads(answers_text(await calls.collect(math.inf)))["result"]
    assert (ticket, answer["error"]["code"]) == (1, -32603)


async def test_with_no_nursery_a_call_is_refused_at_once() -> None:
    async def request(method: str, params: dict[str, Any]) -> Any:
        raise AssertionError("never called")

    calls = GuestCalls(request, None)
    calls.start(StartedCall(3, "m", {}))
    ((ticket, answer),) = json.loads(answers_text(calls.collect_nowait() or []))["result"]
    assert ticket == 3 and "stopping" in answer["error"]["message"]


def test_answers_cross_as_json_whatever_the_results_hold() -> None:
    """Results are encoded in the guest's thread; a lone surrogate (legal JSON) still
    makes valid UTF-8 for the guest, and an error answer goes as it is."""
    text = answers_text([(1, True, {"value": "\ud800 x"}), (2, False, '{"error":{"code":1}}')])
    text.encode("utf-8")
    assert json.loads(text)["result"][1] == [2, {"error": {"code": 1}}]
    assert json.loads(text)["result"][0][0] == 1


async def test_calls_left_behind_go_on_only_within_the_executors_room() -> None:
    gate = trio.Event()

    async def request(method: str, params: dict[str, Any]) -> Any:
        await gate.wait()
        return params["n"]

    left = LeftCalls(limit=2)
    async with trio.open_nursery() as nursery:
        calls = GuestCalls(request, nursery, left)
        for ticket in range(3):
            calls.start(StartedCall(ticket, "m", {"n": ticket}))
        await calls.begun()
        calls.leave()
        assert left.count == 2
        calls.start(StartedCall(9, "m", {"n": 9}))  # after the answer: never made
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
    assert left.count == 0
    answered = [ticket for ticket, ok, _ in calls.collect_nowait() or [] if ok]
    assert len(answered) == 2 and 9 not in answered  # the third was cancelled
