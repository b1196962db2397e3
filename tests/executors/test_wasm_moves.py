"""`MoveWatch` on its own, over a clock the test moves: when it gives a guest back."""

from __future__ import annotations

import gc
import time
from pathlib import Path

import pytest

from conduit.executors._wasmtime import StopReason
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
