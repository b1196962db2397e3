"""Calls a wasm-js program starts and collects later: its event loop runs meanwhile.

The executor-level tests run the real SpiderMonkey component with a bridge of their own;
tests/e2e/test_wasm_js_tools.py holds the same programs to Deno's answers on real MCP
upstreams.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from conduit.core.errors import InvalidParams
from conduit.core.left_calls import LeftCalls
from conduit.executors.base import Job, Limits, Outcome, Status
from conduit.executors.wasm_guest_calls import (
    CALLS_OUT_MAX,
    GuestCalls,
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
    names of the calls that finished, and of those cancelled."""

    def __init__(self) -> None:
        self.finished: list[str] = []
        self.cancelled: list[str] = []

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        arguments = params["arguments"]
        name = arguments.get("name", params["name"])
        try:
            await trio.sleep(arguments.get("s", 0))
        except trio.Cancelled:
            self.cancelled.append(name)
            raise
        self.finished.append(name)
        return {"value": name}


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
    # Counted in ticks, not milliseconds: a loaded machine may run the guest too late
    # for a 10 ms interval to tick often within any set time.
    code = """
let ticks = 0;
const raced = await Promise.race([
  tools.t.slow({ s: 5, name: "slow" }),
  new Promise((resolve) => {
    const ticking = setInterval(() => {
      if (++ticks === 3) { clearInterval(ticking); resolve("timer"); }
    }, 10);
  }),
]);
return { raced, ticks };
"""
    outcome = await run(wasm_js, code, SlowBridge())
    assert outcome.status is Status.OK, outcome
    assert outcome.result == {"raced": "timer", "ticks": 3}


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


async def test_long_arguments_arrive_whole_and_leave_nothing_behind(
    wasm_js: WasmJsExecutor,
) -> None:
    """Long arguments go on stdout, not through the bindings, which never freed their
    copy: 256 KiB a call ran 128 MB out in ~130 calls (and took ~140 ms each)."""

    class Measuring(NoBridge):
        def __init__(self) -> None:
            self.sizes: list[int] = []

        async def request(self, method: str, params: dict[str, Any]) -> Any:
            self.sizes.append(len(params["arguments"]["text"]))
            return {"value": params["arguments"]["text"][-2:]}

    code = """
console.log("before");
const first = await tools.t.echo({ text: "x".repeat(1000) + "é✓" });
const text = "x".repeat(256 * 1024);
for (let n = 0; n < 200; n++) await tools.t.echo({ text });
console.log("after");
first
"""
    bridge = Measuring()
    outcome = await run(wasm_js, code, bridge, memory_mb=128, tool_calls=201)
    assert (outcome.status, outcome.result) == (Status.OK, "é✓"), outcome
    assert bridge.sizes == [1002] + [256 * 1024] * 200
    assert outcome.stdout == "before\nafter\n"  # the piped arguments are not output


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
        calls = GuestCalls(request, nursery, left, "alice")
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


async def test_a_callers_left_call_makes_room_by_cancelling_the_largest_holders() -> None:
    gate = trio.Event()
    made: list[str] = []

    async def request(method: str, params: dict[str, Any]) -> Any:
        await gate.wait()
        made.append(params["n"])
        return params["n"]

    left = LeftCalls(limit=2)
    async with trio.open_nursery() as nursery:
        alice = GuestCalls(request, nursery, left, "alice")
        bob = GuestCalls(request, nursery, left, "bob")
        for calls, names in ((alice, ["a0", "a1"]), (bob, ["b0"])):
            for ticket, name in enumerate(names):
                calls.start(StartedCall(ticket, "m", {"n": name}))
            await calls.begun()
            calls.leave()
        assert (left.count, left.held("alice"), left.held("bob")) == (2, (1, 0), (1, 0))
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
    # One of alice's gave bob its room (the one counted first: its task began first).
    assert len(made) == 2 and "b0" in made
    assert left.count == 0


def test_each_call_started_has_the_size_of_its_arguments_in_bytes() -> None:
    """A call alone in its wait is charged the wait's bytes; calls sharing one are
    measured each, so that a large call is never charged a small share (calls done
    at once, `tools/list` say, would take the rest away with them)."""
    small = {"ticket": 1, "call": {"method": "m", "params": {"a": "x"}}}
    wide = "\U0001f600" * 1000  # 4 bytes each in UTF-8
    big = {"ticket": 3, "call": {"method": "m", "params": {"a": wide}}}
    text = json.dumps({"start": [big]}, ensure_ascii=False)
    (alone,) = WaitRequest.parse({"start": [big]}, text).start
    assert alone.size == len(text.encode()) > 4000
    shared = WaitRequest.parse({"start": [small] * 255 + [big]}, "short").start
    assert [call.size for call in shared[-2:]] == [len('{"a":"x"}'), 4000 + len('{"a":""}')]


# -- calls of a program that ends without answering well ------------------------------

SENT_THEN = """
tools.t.slow({ s: 60, name: "cancelled" });
await new Promise((resolve) => setTimeout(resolve, 1)); // sent: the loop was idle
"""


@pytest.mark.parametrize(
    ("ending", "status"),
    [
        ("const hog = []; for (;;) hog.push(new Array(1e6).fill(1.5));", Status.MEMORY_LIMIT),
        ('throw new Error("out of memory");', Status.MEMORY_LIMIT),
        ('throw new Error("failed");', Status.ERROR),
        (
            'setTimeout(() => { throw new Error("timer"); }, 1); await new Promise(() => {});',
            Status.ERROR,
        ),
    ],
    ids=["memory", "says out of memory", "throws", "uncaught in a callback"],
)
async def test_the_calls_of_a_program_that_failed_are_cancelled(
    wasm_js: WasmJsExecutor, ending: str, status: Status
) -> None:
    """Only a program that answered leaves its calls going on, as on Deno, where a
    worker that fails is ended with its calls."""
    bridge = SlowBridge()
    # Little memory to fill, and time enough to fill it on a machine busy with more
    # than this test.
    outcome = await run(wasm_js, SENT_THEN + ending, bridge, timeout_ms=25_000, memory_mb=64)
    assert (outcome.status, outcome.tool_calls) == (status, 1), outcome
    with trio.fail_after(WAIT_S):
        while bridge.cancelled != ["cancelled"]:
            await trio.sleep(0.02)


async def test_a_program_answering_past_its_deadline_leaves_no_call_behind(
    wasm_js: WasmJsExecutor,
) -> None:
    """Answered between its deadline and the tick that would have stopped it: a
    timeout, whose calls are cancelled like any stopped program's. Where that moment
    falls is not ours to choose: the program answers at offsets a tenth of a
    millisecond apart around its deadline, and each run's calls must match its status."""
    bridge = SlowBridge()
    answered = []
    for run_number in range(50):
        code = f"""
const t0 = performance.now();
while (performance.now() < t0 + 50 - 6 + {run_number / 10}) {{}}
tools.t.slow({{ s: 0.3, name: "{run_number}" }});
"late"
"""
        outcome = await run(wasm_js, code, bridge, timeout_ms=50)
        assert outcome.status in (Status.OK, Status.TIMEOUT), outcome
        if outcome.status is Status.OK:
            answered.append(str(run_number))
    await trio.sleep(0.5)
    assert sorted(bridge.finished) == sorted(answered)


async def test_a_getter_planted_on_object_prototype_cannot_break_the_calls(
    wasm_js: WasmJsExecutor,
) -> None:
    """The host's answers are read by their own properties: a program's getter for
    `error` or `result` never runs inside the guest's poll, nor a setter as a tool's
    error is made anywhere but in that call's own failure."""
    code = """
Object.defineProperty(Object.prototype, "error", { get() { throw new Error("boom"); } });
Object.defineProperty(Object.prototype, "result", { get() { throw new Error("boom"); } });
const fast = await tools.t.fast({ name: "fast" });
const both = await Promise.all([tools.t.fast({ name: "a" }), tools.t.slow({ s: 0.05, name: "b" })]);
Object.defineProperty(Error.prototype, "code", { set() { throw new Error("set"); } });
const failed = await tools.t.fail({}).catch((error) => error.message);
tools.t.fast({ name: "left" });
[fast, both, failed]
"""

    class Failing(SlowBridge):
        async def request(self, method: str, params: dict[str, Any]) -> Any:
            if params["name"] == "t.fail":
                raise InvalidParams("invalid params: no", {"tool": "t.fail"})
            return await super().request(method, params)

    outcome = await run(wasm_js, code, Failing())
    assert outcome.status is Status.OK, outcome
    assert outcome.result == ["fast", ["a", "b"], "set"]
    assert "guest.js" not in outcome.stderr


async def test_a_program_stopped_after_it_answered_leaves_no_call_behind(
    wasm_js: WasmJsExecutor,
) -> None:
    """The daemon stops a program over its tool calls as the call past the limit comes
    in; the guest may answer before the stop lands, and the daemon reports the limit
    all the same: its calls are cancelled as any stopped program's."""
    job = Job(
        "ex_js",
        "javascript",
        """
for (let i = 0; i < 4; i++) tools.t.slow({ s: 60, name: `n${i}` }).catch(() => {});
await new Promise((resolve) => setTimeout(resolve, 0));
"answered"
""",
        Limits(),
    )

    class Limiting(SlowBridge):
        async def request(self, method: str, params: dict[str, Any]) -> Any:
            if params["arguments"]["name"] == "n3":
                job.stop.set()
                raise InvalidParams("over the limit")
            return await super().request(method, params)

    bridge = Limiting()
    with trio.fail_after(WAIT_S):
        await wasm_js.run(job, bridge)
        while sorted(bridge.cancelled) != ["n0", "n1", "n2"]:
            await trio.sleep(0.02)


async def test_a_wait_the_host_cannot_read_fails_only_its_own_calls(
    wasm_js: WasmJsExecutor,
) -> None:
    """A call whose arguments the host refuses to read (an integer of 5,000 digits)
    fails with the calls sent beside it; one made earlier is still answered."""
    code = """
const first = tools.t.slow({ s: 0.2, name: "first" });
await new Promise((resolve) => setTimeout(resolve, 0)); // sent on its own
const refused = await tools.t.fast({ n: JSON.rawJSON("9".repeat(5000)) })
  .then(() => "made", (error) => error.code);
[await first, refused]
"""
    outcome = await run(wasm_js, code, SlowBridge())
    assert outcome.status is Status.OK, outcome
    assert outcome.result == ["first", -32700]
