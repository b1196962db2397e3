"""`MoveWatch` on its own, over a clock the test moves: when it gives a guest back; and
which programs may move, read where."""

from __future__ import annotations

import gc
import threading
import time
from pathlib import Path

import pytest

from conduit.executors import wasm_js as wasm_js_module
from conduit.executors._wasmtime import StopReason
from conduit.executors.registry import ExecutorRegistry
from conduit.executors.syntax_memo import SyntaxMemo
from conduit.executors.wasm_js import MOVE_AFTER_CPU_S, WasmJsExecutor
from conduit.executors.wasm_moves import MoveWatch, program_cpu_s
from tests.hand_clock import HandClock


def test_it_gives_the_guest_back_once_it_has_computed_for_long() -> None:
    clock = HandClock()
    watch = MoveWatch(0.05, lambda: False, clock)
    clock.now += 0.049
    assert watch() is None
    clock.now += 0.002
    assert watch() is StopReason.MOVED
    assert watch() is None  # said once


def test_what_was_seen_outside_keeps_the_guest_where_it_is() -> None:
    clock, asked = HandClock(), []
    seen = [False]

    def was_seen() -> bool:
        asked.append(True)
        return seen[0]

    watch = MoveWatch(0.05, was_seen, clock)
    assert watch() is None and asked == []  # not asked before the time is up
    seen[0] = True
    clock.now += 1
    assert watch() is None and len(asked) == 1
    seen[0] = False
    assert watch() is None and len(asked) == 1  # decided for good


def test_it_counts_from_when_it_was_made_on_the_guests_thread() -> None:
    clock = HandClock()
    clock.now = 100.0
    watch = MoveWatch(0.05, lambda: False, clock)
    clock.now = 100.04
    assert watch() is None


def test_time_spent_collecting_garbage_is_not_the_programs() -> None:
    garbage = []
    for _ in range(200_000):  # cycles only the collector frees
        cycle: list[object] = []
        cycle.append(cycle)
        garbage.append(cycle)
    del garbage
    before, cpu_before = program_cpu_s(), time.thread_time()
    gc.collect()
    collected_s = time.thread_time() - cpu_before
    assert collected_s > 0.005  # the collection was worth measuring
    assert program_cpu_s() - before < collected_s / 4


@pytest.mark.parametrize(
    ("code", "moves"),
    [
        ("fs.readFileSync('a')", False),
        ("x.fs", False),
        ("e instanceof InternalError", False),
        ("const s = '\\u0066s'", False),
        ("const offsets = [1]; ifs(fs_x, $fs)", True),
        ("let n = 0; for (;;) n++", True),
    ],
)
def test_only_a_program_that_may_name_a_guest_only_global_stays(
    tmp_path: Path, code: str, moves: bool
) -> None:
    wasm_js = WasmJsExecutor(cache_dir=tmp_path)
    assert (wasm_js.moves(code) == MOVE_AFTER_CPU_S) is moves


async def test_a_large_programs_text_is_read_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether a program names a guest-only global is a scan of all its text (~12 ms a
    MiB): for a program too large to be read inline, it is read with the rest in the
    registry's worker thread, and the decision found there when the move is planned."""
    wasm_js = WasmJsExecutor(cache_dir=tmp_path)
    wasm_js._reason = None  # as once its component is loaded
    registry = ExecutorRegistry([wasm_js], {"javascript": "wasm-js"})
    readers: list[str] = []
    scan = wasm_js_module._NAMES_GUEST_ONLY

    class Watched:
        def search(self, code: str) -> object:
            readers.append(threading.current_thread().name)
            return scan.search(code)

    monkeypatch.setattr(wasm_js_module, "_NAMES_GUEST_ONLY", Watched())
    monkeypatch.setattr(wasm_js, "moves_to", "wasm-js")  # a successor that is there
    code = "let n = 0;\n" * 100_000  # past what Readings keeps, so only the memo holds it
    syntax = SyntaxMemo()
    picked = await registry.pick_ready("javascript", within_s=1, code=code, syntax=syntax)
    assert registry.successor("javascript", None, picked, code, syntax) == (
        wasm_js,
        MOVE_AFTER_CPU_S,
    )
    assert len(readers) == 1 and readers[0] != threading.current_thread().name
