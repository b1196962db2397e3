"""Guest waits end by the execution's deadline, on the host (`wasm_clock`), and what
is left behind anyway stays within the lingering budget (`wasm_lingering`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.core.errors import Overloaded
from conduit.executors import wasm_clock
from conduit.executors.base import Job, Limits, Outcome, Status
from conduit.executors.wasm_lingering import LingerBudget
from conduit.executors.wasm_python import WasmPythonExecutor
from tests.sandboxes import WAIT_S, NoBridge

RAW_SLEEP = "import sys\nsys.modules['python_program']._SLEEP(30)"
# Well short of the 30 s waits above: a guest back by then was stopped at its deadline.
BACK_WITHIN_S = 10


async def run(executor: Any, code: str, language: str = "python", **limits: Any) -> Outcome:
    with trio.fail_after(WAIT_S):
        return await executor.run(Job("ex", language, code, Limits(**limits)), NoBridge())


async def wait_for_lingering(executor: Any, count: int, within_s: float = WAIT_S) -> None:
    with trio.fail_after(within_s):
        while executor.info().pool["lingering_threads"] != count:
            await trio.sleep(0.05)  # the count changes in a runner thread


async def test_python_has_its_waits_bounded_on_the_host(wasm: Any, wasm_js: Any) -> None:
    assert wasm.info().pool["bounded_waits"] is True
    # JavaScript reaches no raw wait: its guest bounds every timer (the test below).
    assert wasm_js.info().pool["bounded_waits"] is False


async def test_an_unbounded_python_sleep_ends_at_the_deadline(wasm: Any) -> None:
    outcome = await run(wasm, "print('zz')\n" + RAW_SLEEP, timeout_ms=1000)
    assert outcome.status is Status.TIMEOUT, outcome
    assert outcome.stdout == "zz\n"
    # The guest came back at the deadline, not after its 30 s sleep: nothing is left
    # behind (on a loaded machine it may take longer than the grace to get there).
    await wait_for_lingering(wasm, 0, within_s=BACK_WITHIN_S)


async def test_a_javascript_timer_past_the_deadline_leaves_nothing(wasm_js: Any) -> None:
    code = "await new Promise((resolve) => setTimeout(resolve, 30000))"
    outcome = await run(wasm_js, code, "javascript", timeout_ms=300)
    assert outcome.status is Status.TIMEOUT, outcome
    await wait_for_lingering(wasm_js, 0, within_s=BACK_WITHIN_S)


@pytest.mark.parametrize(
    "wait",
    [
        "time.sleep(0.05)",
        "sys.modules['python_program']._SLEEP(0.05)",
        "select.select([], [], [], 0.05)",
    ],
)
async def test_a_wait_within_the_deadline_is_not_shortened(wasm: Any, wait: str) -> None:
    code = f"import select, sys, time\nt = time.monotonic()\n{wait}\ntime.monotonic() - t"
    outcome = await run(wasm, code, timeout_ms=5000)
    assert outcome.status is Status.OK, outcome
    assert outcome.result >= 0.05


async def test_the_guest_clock_counts_from_its_own_store(wasm: Any) -> None:
    # Not the host's uptime: a program learns nothing of how long the daemon has run.
    outcome = await run(wasm, "import time\ntime.monotonic()")
    assert 0 <= outcome.result < WAIT_S


async def test_without_the_clock_helper_the_executor_still_runs(
    nursery: trio.Nursery, wasm_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wasm_clock, "HELPER_WAT", "(component (import))")
    executor = WasmPythonExecutor(cache_dir=wasm_cache)
    await nursery.start(executor.serve)
    with trio.fail_after(WAIT_S):
        assert await executor.wait_ready(), executor.info().reason
    assert executor.info().pool["bounded_waits"] is False
    assert (await run(executor, "1 + 1")).result == 2
    # Wasmtime's own clock: the sleep outlives its execution, which is reported at its
    # deadline all the same; the runner finishes alone, counted by the budget.
    executor._lingering = LingerBudget(max_threads=1)
    code = "import sys\nsys.modules['python_program']._SLEEP(2)"
    assert (await run(executor, code, timeout_ms=100)).status is Status.TIMEOUT
    assert executor.info().pool["lingering_threads"] == 1
    assert executor.info().pool["lingering_memory_mb"] == Limits().memory_mb
    # At the cap, a new execution is refused at once, saying why.
    with pytest.raises(Overloaded, match="try again"):
        await run(executor, "1 + 1")
    await wait_for_lingering(executor, 0)
    assert (await run(executor, "6 * 7")).result == 42
    assert executor.info().pool["lingering_memory_mb"] == 0
