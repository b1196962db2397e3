"""The wasm-python executor's instruction budget (`fuel`), alone and through a daemon.

An engine that counts fuel compiles code differently, so these tests use their own copy
of the session's components (`fuel_components`): what a fuel-counting engine compiles
(once, by the first test, unless the doctor's test made it already) stays out of the
shared cache the other tests expect to hit.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.executors.base import Job, Limits, Outcome, Status
from conduit.executors.wasm_python import WasmPythonExecutor
from tests.sandboxes import LOAD_WAIT_S, WAIT_S, NoBridge

# A fuel-counting engine compiles the component afresh.
pytestmark = pytest.mark.slow

# A trivial program uses ~1 M units and an endless loop burns this in ~10 ms: small
# enough to stop the loop long before any wall timeout, generous for real work.
FUEL = 50_000_000
# Far below one trivial program's needs.
TINY_FUEL = 1_000
# Long enough that a program stopped before it was stopped by fuel, not by time.
TIMEOUT_MS = 20_000
BUDGET_MESSAGE = "the program used up its instruction budget"


@pytest.fixture(scope="module")
def fuel_cache(fuel_components: Callable[[], AbstractContextManager[Path]]) -> Path:
    """The session's components for fuel-counting engines to compile into."""
    with fuel_components() as cache:
        return cache


async def fueled(nursery: trio.Nursery, cache: Path, fuel: int) -> WasmPythonExecutor:
    executor = WasmPythonExecutor(cache_dir=cache, fuel=fuel)
    await nursery.start(executor.serve)
    # A fuel-counting engine compiles the component afresh: tens of seconds when busy.
    with trio.fail_after(LOAD_WAIT_S):
        assert await executor.wait_ready(), executor.info().reason
    return executor


async def run(executor: WasmPythonExecutor, code: str) -> Outcome:
    with trio.fail_after(WAIT_S):
        job = Job("ex_fuel", "python", code, Limits(timeout_ms=TIMEOUT_MS))
        return await executor.run(job, NoBridge())


async def test_fuel_stops_an_endless_loop_long_before_the_wall_timeout(
    nursery: trio.Nursery, fuel_cache: Path
) -> None:
    executor = await fueled(nursery, fuel_cache, FUEL)
    started = trio.current_time()
    outcome = await run(executor, "print('spin')\nwhile True: pass")
    assert trio.current_time() - started < 5  # not the 20 s wall timeout
    assert outcome.status is Status.TIMEOUT, outcome
    assert outcome.error is not None
    assert outcome.error.type == "Timeout"
    assert outcome.error.message == BUDGET_MESSAGE
    assert outcome.stdout == "spin\n"
    # Every execution gets the whole budget again: the loop spent only its own.
    for _ in range(3):
        done = await run(executor, "sum(range(1000))")
        assert done.status is Status.OK, done
        assert done.result == 499500


async def test_a_tiny_budget_stops_even_a_trivial_program(
    nursery: trio.Nursery, fuel_cache: Path
) -> None:
    executor = await fueled(nursery, fuel_cache, TINY_FUEL)
    outcome = await run(executor, "1")
    assert outcome.status is Status.TIMEOUT, outcome
    assert outcome.error is not None and outcome.error.message == BUDGET_MESSAGE


async def test_the_config_key_reaches_the_executor_through_the_daemon(
    start_daemon: Callable[..., Any], connect: Any, fuel_cache: Path, tmp_path: Path
) -> None:
    state = tmp_path / "fuel-state"
    state.mkdir()
    (state / "wasm").symlink_to(fuel_cache, target_is_directory=True)
    _, info = await start_daemon(
        server={"state_dir": str(state)}, executors={"wasm_python": {"fuel": FUEL}}
    )
    client = await connect(info)
    looped = await client.call(
        "execute",
        {"language": "python", "code": "while True: pass", "limits": {"timeout_ms": TIMEOUT_MS}},
    )
    assert looped["status"] == "timeout", looped
    assert looped["error"]["message"] == BUDGET_MESSAGE
    assert looped["duration_ms"] < 5000
    assert looped["executor"] == "wasm-python"
    done = await client.call("execute", {"language": "python", "code": "6 * 7"})
    assert done["status"] == "ok", done
    assert done["result"] == 42
