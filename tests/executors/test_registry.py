"""Choosing an executor: defaults, names, the fallback while a default is unavailable or
lacks what a program uses, and the wait for one still starting.

Unit tests of the registry's choice alone: the executors here are stand-ins that only
report availability (every executor itself is tested with its real runtime elsewhere).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import trio

from conduit.core.errors import ExecutorUnavailable, InvalidParams
from conduit.executors.base import ExecutorInfo
from conduit.executors.registry import ExecutorRegistry
from conduit.executors.syntax_memo import SyntaxMemo
from conduit.executors.wasm_js import WasmJsExecutor
from tests.parses import count_parses


@dataclass
class StandIn:
    name: str
    languages: frozenset[str]
    available: bool = True
    reason: str | None = field(default=None)
    lacks: Callable[[str, SyntaxMemo, str], str | None] | None = None
    partly: frozenset[str] = frozenset()

    @property
    def unavailable_reason(self) -> str | None:
        return None if self.available else (self.reason or "being built")

    def info(self) -> ExecutorInfo:
        reason = self.unavailable_reason
        return ExecutorInfo(self.name, tuple(self.languages), reason is None, reason=reason)


def registry(*, wasm_js_available: bool) -> tuple[ExecutorRegistry, StandIn, StandIn]:
    deno = StandIn("deno", frozenset({"javascript", "typescript"}))
    wasm_js = StandIn("wasm-js", frozenset({"javascript"}), available=wasm_js_available)
    chosen = ExecutorRegistry([deno, wasm_js], {"javascript": "wasm-js", "typescript": "deno"})  # type: ignore[list-item]
    return chosen, deno, wasm_js


def test_the_default_runs_its_language() -> None:
    chosen, _, wasm_js = registry(wasm_js_available=True)
    assert chosen.pick("javascript") is wasm_js


def test_an_unavailable_default_gives_way_to_another_executor_for_the_language() -> None:
    chosen, deno, wasm_js = registry(wasm_js_available=False)
    assert chosen.pick("javascript") is deno
    wasm_js.available = True  # its component is built: the default is back
    assert chosen.pick("javascript") is wasm_js


def test_a_named_executor_is_never_substituted() -> None:
    chosen, _, _ = registry(wasm_js_available=False)
    with pytest.raises(ExecutorUnavailable, match="being built"):
        chosen.pick("javascript", "wasm-js")


def test_no_fallback_when_nothing_else_runs_the_language() -> None:
    python = StandIn("wasm-python", frozenset({"python"}), available=False)
    chosen = ExecutorRegistry([python], {"python": "wasm-python"})  # type: ignore[list-item]
    with pytest.raises(ExecutorUnavailable):
        chosen.pick("python")


def test_an_executor_that_does_not_run_the_language_is_refused() -> None:
    chosen, _, _ = registry(wasm_js_available=True)
    with pytest.raises(InvalidParams, match="not typescript"):
        chosen.pick("typescript", "wasm-js")


@dataclass
class Preparing(StandIn):
    """A stand-in that becomes ready (or fails) when told, as a loading component does."""

    settled: trio.Event = field(default_factory=trio.Event)

    async def wait_ready(self) -> bool:
        await self.settled.wait()
        return self.available

    async def ready_after(self, seconds: float) -> None:
        await trio.sleep(seconds)
        self.available = True
        self.settled.set()


async def test_a_starting_executor_is_waited_for_not_refused(
    autojump_clock: trio.abc.Clock,
) -> None:
    python = Preparing("wasm-python", frozenset({"python"}), available=False)
    chosen = ExecutorRegistry([python], {"python": "wasm-python"})  # type: ignore[list-item]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(python.ready_after, 1)
        assert await chosen.pick_ready("python", within_s=5) is python
        assert trio.current_time() == 1


async def test_one_that_fails_while_starting_is_refused_with_its_reason(
    autojump_clock: trio.abc.Clock,
) -> None:
    python = Preparing("wasm-python", frozenset({"python"}), available=False, reason="no npm")
    chosen = ExecutorRegistry([python], {"python": "wasm-python"})  # type: ignore[list-item]
    python.settled.set()  # settled, and not available: failed
    with pytest.raises(ExecutorUnavailable, match="no npm"):
        await chosen.pick_ready("python", within_s=60)
    assert trio.current_time() == 0  # refused at once, not after the wait


async def test_one_not_ready_in_time_is_refused_as_still_starting(
    autojump_clock: trio.abc.Clock,
) -> None:
    python = Preparing("wasm-python", frozenset({"python"}), available=False)
    chosen = ExecutorRegistry([python], {"python": "wasm-python"})  # type: ignore[list-item]
    with pytest.raises(ExecutorUnavailable) as refused:
        await chosen.pick_ready("python", within_s=7)
    assert trio.current_time() == 7
    assert refused.value.message == (
        "executor 'wasm-python' is still starting and was not ready within 7 s; retry in "
        "a few seconds (`conduit doctor` shows what it is doing)"
    )
    assert refused.value.data == {
        "executor": "wasm-python",
        "state": "starting",
        "reason": "being built",
    }


async def test_each_refusal_says_which_it_is() -> None:
    failed = Preparing("wasm-python", frozenset({"python"}), available=False, reason="no npm")
    failed.settled.set()
    chosen = ExecutorRegistry([failed], {"python": "wasm-python"})  # type: ignore[list-item]
    with pytest.raises(ExecutorUnavailable) as broken:
        await chosen.pick_ready("python", within_s=5)
    assert broken.value.data["state"] == "failed"
    assert "unavailable: no npm; `conduit doctor` says what to fix" in broken.value.message
    with pytest.raises(ExecutorUnavailable) as disabled:
        await chosen.pick_ready("python", "pyodide", within_s=5)
    assert disabled.value.data["state"] == "disabled"
    assert "set executors.pyodide.enabled = true" in disabled.value.message


async def test_a_starting_default_is_waited_for_before_another_stands_in(
    autojump_clock: trio.abc.Clock,
) -> None:
    deno = StandIn("deno", frozenset({"javascript", "typescript"}))
    wasm_js = Preparing("wasm-js", frozenset({"javascript"}), available=False)
    chosen = ExecutorRegistry([deno, wasm_js], {"javascript": "wasm-js"})  # type: ignore[list-item]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(wasm_js.ready_after, 2)
        assert await chosen.pick_ready("javascript", within_s=5) is wasm_js


async def test_another_stands_in_once_the_wait_is_over(autojump_clock: trio.abc.Clock) -> None:
    deno = StandIn("deno", frozenset({"javascript", "typescript"}))
    wasm_js = Preparing("wasm-js", frozenset({"javascript"}), available=False)
    chosen = ExecutorRegistry([deno, wasm_js], {"javascript": "wasm-js"})  # type: ignore[list-item]
    assert await chosen.pick_ready("javascript", within_s=5) is deno
    assert trio.current_time() == 5


def _no_intl(code: str, _syntax: SyntaxMemo, _language: str = "javascript") -> str | None:
    return "Intl" if "Intl" in code else None


def intl_registry(*, deno_available: bool = True) -> tuple[ExecutorRegistry, StandIn, StandIn]:
    deno = StandIn("deno", frozenset({"javascript", "typescript"}), available=deno_available)
    wasm_js = StandIn("wasm-js", frozenset({"javascript"}), lacks=_no_intl)
    chosen = ExecutorRegistry([wasm_js, deno], {"javascript": "wasm-js"})  # type: ignore[list-item]
    return chosen, deno, wasm_js


def test_a_program_the_default_lacks_something_for_runs_on_another() -> None:
    chosen, deno, wasm_js = intl_registry()
    assert chosen.pick("javascript", code="new Intl.NumberFormat()") is deno
    assert chosen.pick("javascript", code="1 + 1") is wasm_js
    # Named, the executor runs it as it is.
    assert chosen.pick("javascript", "wasm-js", code="new Intl.NumberFormat()") is wasm_js


def test_the_default_runs_it_when_nothing_else_can() -> None:
    chosen, _, wasm_js = intl_registry(deno_available=False)
    assert chosen.pick("javascript", code="new Intl.NumberFormat()") is wasm_js


async def test_a_large_program_is_read_off_the_event_loop_with_the_same_answer() -> None:
    chosen, deno, wasm_js = intl_registry()
    large = "let x = 1;\n" * 1000
    assert await chosen.pick_ready("javascript", within_s=1, code=large + "Intl") is deno
    assert await chosen.pick_ready("javascript", within_s=1, code=large) is wasm_js


async def test_the_executor_that_has_it_is_waited_for_when_still_starting(
    autojump_clock: trio.abc.Clock,
) -> None:
    deno = Preparing("deno", frozenset({"javascript"}), available=False)
    wasm_js = StandIn("wasm-js", frozenset({"javascript"}), lacks=_no_intl)
    chosen = ExecutorRegistry([wasm_js, deno], {"javascript": "wasm-js"})  # type: ignore[list-item]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(deno.ready_after, 2)
        assert await chosen.pick_ready("javascript", within_s=5, code="Intl") is deno
        assert trio.current_time() == 2


@pytest.mark.parametrize("deno_starting", [False, True])
async def test_a_parse_made_to_pick_is_kept_unless_the_pick_waits(
    autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch, deno_starting: bool
) -> None:
    """Kept for the program's next reader; let go before a wait, which could be long."""
    parses = count_parses(monkeypatch)
    deno = Preparing("deno", frozenset({"javascript"}), available=not deno_starting)
    wasm_js = StandIn("wasm-js", frozenset({"javascript"}), lacks=WasmJsExecutor.lacks)
    chosen = ExecutorRegistry([wasm_js, deno], {"javascript": "wasm-js"})  # type: ignore[list-item]
    code, syntax = "new Intl.NumberFormat()", SyntaxMemo()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(deno.ready_after, 2)
        picked = await chosen.pick_ready("javascript", within_s=5, code=code, syntax=syntax)
    assert picked is deno
    assert syntax.take(code, "javascript") is not None
    assert len(parses.made) == (2 if deno_starting else 1)


def typescript_registry(*, deno: bool = True) -> tuple[ExecutorRegistry, StandIn, StandIn]:
    """wasm-js as TypeScript's default, running only what `typescript_lacks` allows."""
    on_deno = StandIn("deno", frozenset({"javascript", "typescript"}))
    wasm_js = StandIn(
        "wasm-js",
        frozenset({"javascript", "typescript"}),
        lacks=WasmJsExecutor.lacks,
        partly=frozenset({"typescript"}),
    )
    executors = [wasm_js, on_deno] if deno else [wasm_js]
    chosen = ExecutorRegistry(executors, {"typescript": "wasm-js", "javascript": "wasm-js"})  # type: ignore[arg-type]
    return chosen, on_deno, wasm_js


def test_typescript_whose_types_erase_runs_on_wasm_js_and_the_rest_on_deno() -> None:
    chosen, deno, wasm_js = typescript_registry()
    assert chosen.pick("typescript", code="const x: number = 1; x") is wasm_js
    assert chosen.pick("typescript", code="enum E { A }") is deno
    assert chosen.pick("typescript", code="Deno.pid") is deno
    assert chosen.pick("typescript", "wasm-js", code="enum E { A }") is wasm_js  # named
    # A session, whose programs are yet to come, goes where all of them can run.
    assert chosen.pick("typescript") is deno
    assert chosen.describing()["typescript"] == "deno"
    assert chosen.describing()["javascript"] == "wasm-js"


def test_without_deno_wasm_js_takes_typescript_and_says_what_it_cannot_run() -> None:
    chosen, _, wasm_js = typescript_registry(deno=False)
    assert chosen.pick("typescript", code="enum E { A }") is wasm_js  # and refuses it
    assert chosen.pick("typescript") is wasm_js
    assert chosen.describing()["typescript"] == "wasm-js"


def test_a_default_left_out_of_the_configuration_gives_way_to_another() -> None:
    deno = StandIn("deno", frozenset({"javascript", "typescript"}))
    chosen = ExecutorRegistry([deno], {"typescript": "wasm-js", "javascript": "wasm-js"})  # type: ignore[list-item]
    assert chosen.pick("typescript", code="const x: number = 1") is deno
    assert chosen.pick("javascript") is deno
    with pytest.raises(ExecutorUnavailable, match="disabled in the configuration"):
        chosen.pick("typescript", "wasm-js")
    misspelt = ExecutorRegistry([deno], {"typescript": "wasmjs"})  # type: ignore[list-item]
    with pytest.raises(InvalidParams, match="unknown executor 'wasmjs'"):
        misspelt.pick("typescript")


@dataclass
class Starting:
    """An executor whose start needs another to have started first."""

    name: str
    after: trio.Event
    started: trio.Event = field(default_factory=trio.Event)
    languages: frozenset[str] = frozenset({"python"})

    async def serve(self, *, task_status: trio.TaskStatus[None]) -> None:
        await self.after.wait()
        self.started.set()
        task_status.started()
        await trio.sleep_forever()


async def test_executors_start_side_by_side(nursery: trio.Nursery) -> None:
    """One waiting on another's start would hang if they started one after another."""
    second_started = trio.Event()
    first = Starting("first", after=second_started)
    second = Starting("second", after=trio.Event(), started=second_started)
    second.after.set()
    chosen = ExecutorRegistry([first, second], {})  # type: ignore[list-item]
    with trio.fail_after(5):
        await nursery.start(chosen.serve)
    assert first.started.is_set() and second.started.is_set()
