"""The program's timers on wasm-js (shims/wasm_js/timers.js), real component."""

from __future__ import annotations

from typing import Any

import trio

from conduit.executors.base import Job, Limits, Outcome, Status
from conduit.executors.wasm_js import WasmJsExecutor
from tests.sandboxes import WAIT_S, NoBridge

# A seeded generator, so that a failure can be replayed.
RANDOM = """
let seed = inputs.seed;
const random = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
"""


async def run(executor: WasmJsExecutor, code: str, **inputs: Any) -> Outcome:
    with trio.fail_after(WAIT_S):
        return await executor.run(
            Job("ex_js", "javascript", code, Limits(), inputs=inputs), NoBridge()
        )


async def test_timers_due_at_once_fire_by_due_time_then_by_making(
    wasm_js: WasmJsExecutor,
) -> None:
    # Delays 10 ms apart: a timer made later with a shorter delay falls due first, and
    # timers of one delay fall due in the order they were made. Each timer's due time is
    # read as it is made, since a loaded machine can spread the making over milliseconds:
    # the clock just before and just after, as the program may be preempted between.
    code = (
        RANDOM
        + """
const fired = [];
const made = [];
for (let i = 0; i < 300; i++) {
  const delay = 10 * Math.floor(random() * 4);
  const before = performance.now();
  setTimeout(() => fired.push(i), delay);
  made.push([delay, before + delay, performance.now() + delay]);
}
const end = Date.now() + 60;
while (Date.now() < end) {}
await new Promise((resolve) => setTimeout(resolve, 20));
return { fired, made };
"""
    )
    outcome = await run(wasm_js, code, seed=7)
    assert outcome.status is Status.OK, outcome.error
    fired, made = outcome.result["fired"], outcome.result["made"]
    assert sorted(fired) == list(range(300))
    assert {delay for delay, _, _ in made} == {0, 10, 20, 30}
    for place, first in enumerate(fired):
        for then in fired[place + 1 :]:
            (first_delay, first_earliest, _), (then_delay, _, then_latest) = made[first], made[then]
            if first_delay == then_delay:
                assert first < then, (first, then)  # one delay: in the order made
            else:  # the clock read beside the timer's own: allow it a millisecond
                assert first_earliest < then_latest + 1, (made[first], made[then])


async def test_cleared_timers_never_fire_however_many(wasm_js: WasmJsExecutor) -> None:
    code = (
        RANDOM
        + """
const fired = new Set();
const ids = [];
for (let i = 0; i < 1000; i++) ids.push(setTimeout(() => fired.add(i), 1 + random() * 10));
for (let i = 0; i < 1000; i += 3) clearTimeout(ids[i]);
await new Promise((resolve) => setTimeout(resolve, 30));
return [fired.size, [...fired].some((i) => i % 3 === 0)];
"""
    )
    outcome = await run(wasm_js, code, seed=3)
    assert outcome.result == [666, False], outcome


async def test_an_interval_repeats_until_cleared_from_its_own_callback(
    wasm_js: WasmJsExecutor,
) -> None:
    code = """
let ticks = 0;
await new Promise((resolve) => {
  const interval = setInterval(() => {
    if (++ticks === 5) { clearInterval(interval); setTimeout(resolve, 20); }
  }, 1);
});
ticks
"""
    outcome = await run(wasm_js, code)
    assert outcome.result == 5, outcome


async def test_timers_hold_when_the_program_replaces_what_they_use(
    wasm_js: WasmJsExecutor,
) -> None:
    code = """
Map.prototype.get = Map.prototype.set = Map.prototype.delete = () => { throw new Error("no"); };
for (const index of ["0", "1", "2"]) {
  Object.defineProperty(Object.prototype, index, { set() { throw new Error("no"); } });
}
Math.max = () => -1;
Object.create = () => ({});
let order = "";
const cleared = setTimeout(() => { order += "cleared,"; }, 1);
setTimeout(() => { order += "second"; }, 2);
setTimeout(() => { order += "first,"; }, 1);
clearTimeout(cleared);
await new Promise((resolve) => setTimeout(resolve, 10));
order
"""
    outcome = await run(wasm_js, code)
    assert outcome.result == "first,second", outcome.error
