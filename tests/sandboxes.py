"""Shared by executor and sandbox tests: a bridge that must not be called, how long to
wait, how an attack is run and judged, and the limits resource attacks are given."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.executors.base import Executor, Job, Limits, Outcome, Status
from conduit.executors.pyodide import PyodideExecutor

__all__ = [
    "FLOODS_OUTPUT",
    "LOAD_WAIT_S",
    "RUNS_OUT_OF_MEMORY",
    "TIMES_OUT",
    "WAIT_S",
    "Attacks",
    "NoBridge",
    "each_attack",
    "error_text",
    "start_pyodide",
]

# Generous: real Deno on a loaded two-core machine.
WAIT_S = 30
# Loading Pyodide takes seconds, more on a loaded two-core machine.
LOAD_WAIT_S = 120

# A resource attack's limit and the status it must end with. Small enough to stop a
# runaway quickly, large enough for the runtime itself to start within them.
TIMES_OUT = ({"timeout_ms": 300}, Status.TIMEOUT)
RUNS_OUT_OF_MEMORY = ({"memory_mb": 48}, Status.MEMORY_LIMIT)
FLOODS_OUTPUT = ({"output_bytes": 50_000}, Status.OUTPUT_LIMIT)


class NoBridge:
    """Programs here make no tool calls; the executor must not need the bridge."""

    session_token = "unused"
    callback = None

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        raise AssertionError("the Deno executor does not call the bridge yet")


def error_text(outcome: Outcome) -> str:
    """`Type: message` of the outcome's error; fails the test if there is none."""
    assert outcome.error is not None, outcome
    return f"{outcome.error.type}: {outcome.error.message}"


@dataclass(frozen=True)
class Attacks:
    """How one language's attacks are run: `harmless` is a program whose result is 2."""

    language: str
    harmless: str
    wait_s: float = WAIT_S
    # Whether `refused` runs `harmless` after each attack. Where a fresh interpreter
    # is dear (Pyodide), each attack's own refusal shows that the one before it left
    # the executor working, and a module ends with `still_works` for the last.
    check_after_each: bool = True

    async def run(self, executor: Executor, code: str, **limits: Any) -> Outcome:
        """The outcome of `code` as a job with `limits`; fails after `wait_s`."""
        with trio.fail_after(self.wait_s):
            job = Job("ex_attack", self.language, code, Limits(**limits))
            return await executor.run(job, NoBridge())

    async def refused(self, executor: Executor, code: str, **limits: Any) -> Outcome:
        """Run an attack; assert it failed, and that a harmless program runs after it."""
        outcome = await self.run(executor, code, **limits)
        assert outcome.status is not Status.OK, outcome
        if self.check_after_each:
            await self.still_works(executor)
        return outcome

    async def still_works(self, executor: Executor) -> None:
        """Assert that a harmless program runs and answers 2."""
        after = await self.run(executor, self.harmless)
        assert (after.status, after.result) == (Status.OK, 2), after

    async def refused_with(self, executor: Executor, code: str, refusal: str) -> Outcome:
        """`refused()`, asserting also that the program ended in an error saying `refusal`."""
        outcome = await self.refused(executor, code)
        assert outcome.status is Status.ERROR, outcome
        assert refusal in error_text(outcome)
        return outcome


def each_attack(rows: list[tuple[str, str, str]]) -> pytest.MarkDecorator:
    """Parametrize a test by `code` and `refusal` over rows of (id, code, refusal)."""
    return pytest.mark.parametrize(
        ("code", "refusal"), [row[1:] for row in rows], ids=[row[0] for row in rows]
    )


async def wait_for(condition: Callable[[], bool]) -> None:
    """Poll `condition` until true (a pool refilling, a process ending), within WAIT_S."""
    with trio.fail_after(WAIT_S):
        while not condition():
            await trio.sleep(0.01)


async def start_pyodide(
    nursery: trio.Nursery,
    cache_dir: Path,
    install_dir: Path,
    *,
    max_sessions: int = 4,
    max_processes: int = 8,
) -> PyodideExecutor:
    """A Pyodide executor with one worker, served in `nursery`, once it is ready."""
    executor = PyodideExecutor(
        cache_dir=cache_dir,
        install_dir=install_dir,
        pool_size=1,
        max_sessions=max_sessions,
        max_processes=max_processes,
    )
    await nursery.start(executor.serve)
    with trio.fail_after(LOAD_WAIT_S):
        assert await executor.wait_ready(), executor.info().reason
    return executor
