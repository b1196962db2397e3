"""Both Wasmtime executors on wasmtime-py's public API alone (`_wasmtime_private` off,
as with another wasmtime version or `CONDUIT_PUBLIC_APIS_ONLY`): programs run, call
tools, meet their limits, and a stopped guest stops, rather than running on to its
timeout (the test would then wait for it in vain)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.executors import _wasmtime
from conduit.executors import _wasmtime_private as private
from conduit.executors.base import Job, Limits, Outcome, Status
from conduit.executors.wasm import WasmExecutor
from conduit.executors.wasm_js import WasmJsExecutor
from conduit.executors.wasm_python import WasmPythonExecutor
from tests.sandboxes import WAIT_S

# Long enough that only a stop can end these programs within the test.
NEVER_S = 600
NEVER_MS = NEVER_S * 1000


class EchoBridge:
    """Answers every tool call with its own arguments (in the "value" shape the
    sandboxes ask for)."""

    session_token = "unused"
    callback = None

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        return {"value": {"echoed": params.get("arguments")}}


# Per language: its executor, and the programs each behaviour runs.
PROGRAMS: dict[str, dict[str, str]] = {
    "python": {
        "answer": "print('out')\n40 + 2",
        "tool": "tools.echo.say(text='hi')",
        "spin": "print('spin')\nwhile True: pass",
        "memory": "x = []\nwhile True: x.append(bytearray(1 << 20))",
        "flood": "while True: print('x' * 1000)",
    },
    "javascript": {
        "answer": "console.log('out');\n40 + 2",
        "tool": "const said = await tools.echo.say({ text: 'hi' });\nsaid",
        "spin": "console.log('spin');\nwhile (true) {}",
        "memory": "const a = [];\nwhile (true) a.push(new Array(1e6).fill(1));",
        "flood": "while (true) console.log('x'.repeat(1000));",
    },
}
EXECUTORS: dict[str, Callable[..., WasmExecutor]] = {
    "python": WasmPythonExecutor,
    "javascript": WasmJsExecutor,
}


@pytest.fixture(params=sorted(EXECUTORS))
async def executor(
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    nursery: trio.Nursery,
    wasm_cache: Path,
) -> WasmExecutor:
    """A ready executor made and served with the private paths off."""
    monkeypatch.setattr(private, "AVAILABLE", False)
    assert not _wasmtime.stops_by_callback()
    made = EXECUTORS[request.param](cache_dir=wasm_cache)
    await nursery.start(made.serve)
    with trio.fail_after(WAIT_S):
        assert await made.wait_ready(), made.info().reason
    return made


def language(executor: WasmExecutor) -> str:
    return next(iter(executor.languages & set(PROGRAMS)))


async def execute(executor: WasmExecutor, job: Job) -> Outcome:
    with trio.fail_after(WAIT_S):
        return await executor.run(job, EchoBridge())


def job(executor: WasmExecutor, behaviour: str, **limits: Any) -> Job:
    code = PROGRAMS[language(executor)][behaviour]
    return Job(f"ex_{behaviour}", language(executor), code, Limits(**limits))


async def wait_guests_stopped(executor: WasmExecutor) -> None:
    """Until no guest outlives its execution: fails (after WAIT_S) if a stopped guest
    runs on, as it would to its NEVER_S timeout if nothing reached it."""
    with trio.fail_after(WAIT_S):
        while executor.info().pool["lingering_threads"]:
            await trio.sleep(0.05)


@pytest.mark.slow
async def test_programs_run_and_meet_their_limits(executor: WasmExecutor) -> None:
    answer = await execute(executor, job(executor, "answer"))
    assert (answer.status, answer.result, answer.stdout) == (Status.OK, 42, "out\n"), answer

    tool = await execute(executor, job(executor, "tool"))
    assert (tool.status, tool.result, tool.tool_calls) == (Status.OK, {"echoed": {"text": "hi"}}, 1)

    spin = await execute(executor, job(executor, "spin", timeout_ms=500))
    assert (spin.status, spin.stdout) == (Status.TIMEOUT, "spin\n"), spin

    memory = await execute(executor, job(executor, "memory", memory_mb=64))
    assert memory.status is Status.MEMORY_LIMIT, memory

    flood = await execute(
        executor, job(executor, "flood", timeout_ms=NEVER_MS, output_bytes=50_000)
    )
    assert flood.status is Status.OUTPUT_LIMIT, flood
    await wait_guests_stopped(executor)

    after = await execute(executor, job(executor, "answer"))
    assert after.result == 42, after


@pytest.mark.slow
async def test_a_stopped_or_cancelled_guest_stops(executor: WasmExecutor) -> None:
    stopped = job(executor, "spin", timeout_ms=NEVER_MS)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop_once_running, executor, stopped)
        outcome = await execute(executor, stopped)
    assert outcome.status is Status.CANCELLED, outcome
    await wait_guests_stopped(executor)

    with trio.move_on_after(WAIT_S) as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(execute, executor, job(executor, "spin", timeout_ms=NEVER_MS))
            await _wait_running(executor)
            scope.cancel()
    assert scope.cancelled_caught
    await wait_guests_stopped(executor)
    assert executor.info().pool["running_guests"] == 0

    after = await execute(executor, job(executor, "answer"))
    assert after.result == 42, after


async def _wait_running(executor: WasmExecutor) -> None:
    with trio.fail_after(WAIT_S):
        while not executor.info().pool["running_guests"]:
            await trio.sleep(0.01)


async def _stop_once_running(executor: WasmExecutor, job: Job) -> None:
    await _wait_running(executor)
    job.stop.set()
