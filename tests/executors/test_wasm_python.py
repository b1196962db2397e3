"""The wasm-python executor with real Wasmtime and the real component."""

from __future__ import annotations

import fcntl
import hashlib
import logging
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.executors import _wasmtime
from conduit.executors.base import Job, Limits, Outcome, Status, StopSignal
from conduit.executors.wasm_guests import preloaded_modules
from conduit.executors.wasm_python import WasmPythonExecutor
from tests.sandboxes import WAIT_S, NoBridge


async def run(
    executor: WasmPythonExecutor, code: str, inputs: Any = None, **limits: Any
) -> Outcome:
    with trio.fail_after(WAIT_S):
        return await executor.run(
            Job("ex_py", "python", code, Limits(**limits), inputs=inputs), NoBridge()
        )


async def test_last_expression_is_the_result(wasm: WasmPythonExecutor) -> None:
    outcome = await run(wasm, "x = 20\nx + 22")
    assert outcome.status is Status.OK, outcome
    assert outcome.result == 42


async def test_top_level_return_is_the_result(wasm: WasmPythonExecutor) -> None:
    outcome = await run(wasm, "for i in range(10):\n    if i == 3:\n        return {'i': i}\n")
    assert outcome.result == {"i": 3}


async def test_no_final_expression_gives_none(wasm: WasmPythonExecutor) -> None:
    assert (await run(wasm, "x = 1")).result is None


async def test_values_json_cannot_hold_come_back_as_repr(wasm: WasmPythonExecutor) -> None:
    outcome = await run(wasm, "{1, 2}")
    assert outcome.status is Status.OK
    assert outcome.result == "{1, 2}"


async def test_print_goes_to_stdout_and_inputs_are_a_variable(wasm: WasmPythonExecutor) -> None:
    outcome = await run(
        wasm,
        "import sys\nprint('hi', inputs['n'])\nprint('e', file=sys.stderr)\ninputs['n'] * 2",
        inputs={"n": 21},
    )
    assert outcome.stdout == "hi 21\n"
    assert outcome.stderr == "e\n"
    assert outcome.result == 42


async def test_exceptions_give_type_message_and_user_line_numbers(wasm: WasmPythonExecutor) -> None:
    code = "def f(x):\n    return 1 / x\n\nprint('before')\nf(0)\n"
    outcome = await run(wasm, code)
    assert outcome.status is Status.ERROR
    assert outcome.stdout == "before\n"
    assert outcome.error is not None
    assert outcome.error.type == "ZeroDivisionError"
    assert outcome.error.message == "division by zero"
    trace = outcome.error.traceback
    assert 'File "<program>", line 5, in <module>' in trace
    assert 'File "<program>", line 2, in f' in trace
    assert "guest.py" not in trace


async def test_tracebacks_with_a_top_level_return_keep_user_lines(wasm: WasmPythonExecutor) -> None:
    outcome = await run(wasm, "x = 1\nif x:\n    raise KeyError('k')\nreturn x\n")
    assert outcome.error is not None and outcome.error.type == "KeyError"
    assert "line 3" in outcome.error.traceback
    assert "<module>" not in outcome.error.traceback


@pytest.mark.parametrize(
    ("code", "status", "result", "error"),
    [
        ("import sys\nsys.stdout.close()\n5", Status.OK, 5, None),
        ("import sys\nsys.stderr.close()\nraise KeyError('mine')", Status.ERROR, None, "KeyError"),
        (
            "import sys\nclass Out:\n    def write(self, text):\n        return len(text)\n"
            "    def flush(self):\n        raise OSError('disk full')\nsys.stdout = Out()\n5",
            Status.OK,
            5,
            None,
        ),
    ],
)
async def test_a_program_that_closes_or_breaks_its_output_keeps_its_outcome(
    wasm: WasmPythonExecutor, code: str, status: Status, result: Any, error: str | None
) -> None:
    outcome = await run(wasm, code)
    assert (outcome.status, outcome.result) == (status, result), outcome
    assert (outcome.error.type if outcome.error else None) == error


async def test_syntax_errors_name_the_line(wasm: WasmPythonExecutor) -> None:
    outcome = await run(wasm, "x = 1\ny = (\n")
    assert outcome.status is Status.ERROR
    assert outcome.error is not None and outcome.error.type == "SyntaxError"
    assert "line 2" in outcome.error.message


async def test_every_preloaded_stdlib_module_imports(wasm: WasmPythonExecutor) -> None:
    code = "import importlib\n[m for m in inputs if importlib.import_module(m) is None]"
    outcome = await run(wasm, code, inputs=list(preloaded_modules()))
    assert {"json", "re", "math", "datetime", "collections", "urllib.parse"} <= set(
        preloaded_modules()
    )
    assert outcome.status is Status.OK, outcome.error
    assert outcome.result == []
    sample = "import json, re, math, statistics, decimal, datetime\nstatistics.mean([1, 2, 3])"
    assert (await run(wasm, sample)).result == 2


async def test_no_state_survives_between_executions(wasm: WasmPythonExecutor) -> None:
    first = await run(
        wasm, "import json, sys\njson.leak = 1\nsys.modules['leak'] = 1\nglobal_x = 5"
    )
    assert first.status is Status.OK
    second = await run(
        wasm,
        "import json, sys\n[hasattr(json, 'leak'), 'leak' in sys.modules, 'global_x' in globals()]",
    )
    assert second.result == [False, False, False]


async def test_timeout_stops_an_infinite_loop(wasm: WasmPythonExecutor) -> None:
    started = trio.current_time()
    # Long enough that the line (two writes) is out before the loop on a busy machine.
    outcome = await run(wasm, "print('spin')\nwhile True: pass", timeout_ms=1000)
    assert outcome.status is Status.TIMEOUT
    assert outcome.stdout == "spin\n"
    assert trio.current_time() - started < WAIT_S


async def test_memory_limit(wasm: WasmPythonExecutor) -> None:
    outcome = await run(wasm, "x = []\nwhile True: x.append(bytearray(1 << 20))", memory_mb=48)
    assert outcome.status is Status.MEMORY_LIMIT, outcome
    assert (await run(wasm, "1")).status is Status.OK


async def test_output_flood_is_cut_at_the_budget(wasm: WasmPythonExecutor) -> None:
    outcome = await run(wasm, "while True: print('x' * 99)", output_bytes=10_000)
    assert outcome.status is Status.OUTPUT_LIMIT
    assert outcome.truncated_stdout
    assert len(outcome.stdout) == 10_000 and outcome.stdout.startswith("x" * 99 + "\n")


async def test_job_stop_interrupts_the_guest(wasm: WasmPythonExecutor) -> None:
    job = Job("ex_stop", "python", "while True: pass", Limits(timeout_ms=20_000))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _set_later(job.stop))
        with trio.fail_after(5):
            outcome = await wasm.run(job, NoBridge())
    assert outcome.status is Status.CANCELLED


async def test_cancelling_run_waits_for_the_guest_to_stop(wasm: WasmPythonExecutor) -> None:
    with trio.move_on_after(0.2) as scope:
        await run(wasm, "while True: pass", timeout_ms=20_000)
    assert scope.cancelled_caught
    assert trio.current_time() - scope.deadline < 1
    assert (await run(wasm, "'still serving'")).result == "still serving"


async def _set_later(event: StopSignal) -> None:
    await trio.sleep(0.2)
    event.set()


async def test_info_reports_the_component_and_cache(wasm: WasmPythonExecutor) -> None:
    info = wasm.info()
    assert info.available and info.reason is None
    assert info.version is not None and info.version.startswith("CPython 3.14 on wasmtime 50.")
    assert info.pool is not None
    assert len(info.pool["component_hash"]) == 64
    assert info.pool["compiled_cache"] == "hit"
    assert info.pool["build_inputs"]["componentize-py"] == "0.25.1"


# A component of a few hundred bytes: the compiled cache's handling does not depend on
# the component, and compiling CPython's twice would cost ~15 s of CPU.
TINY_COMPONENT = '(component (core module (func (export "f") (result i32) i32.const 7)))'


def _tiny(tmp_path: Path) -> tuple[Path, str]:
    source = tmp_path / "guest.wasm"
    source.write_text(TINY_COMPONENT)
    return source, hashlib.sha256(source.read_bytes()).hexdigest()


def test_compiled_cache_is_reused_and_a_corrupt_one_rebuilt(tmp_path: Path) -> None:
    source, component_hash = _tiny(tmp_path)
    engine = _wasmtime.new_engine()
    first = _wasmtime.load_component(engine, source, component_hash)
    assert first.cache is _wasmtime.CompiledCache.MISS
    again = _wasmtime.load_component(engine, source, component_hash)
    assert again.cache is _wasmtime.CompiledCache.HIT
    # Read-only: a loaded component maps its file, which must never change under it.
    assert stat.S_IMODE(again.path.stat().st_mode) == 0o444
    data = bytearray(again.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    again.path.chmod(0o644)
    again.path.write_bytes(bytes(data))
    rebuilt = _wasmtime.load_component(engine, source, component_hash)
    assert rebuilt.cache is _wasmtime.CompiledCache.REBUILT
    assert (
        _wasmtime.load_component(engine, source, component_hash).cache
        is _wasmtime.CompiledCache.HIT
    )


def test_a_start_waits_for_another_process_compiling_then_loads_its_result(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=_wasmtime.__name__)
    source, component_hash = _tiny(tmp_path)
    engine = _wasmtime.new_engine()
    compiled = _wasmtime.load_component(engine, source, component_hash).path
    loaded: list[_wasmtime.LoadedComponent] = []
    # A lock taken through another open file is another holder, as a peer daemon is.
    with compiled.with_suffix(".lock").open("w") as peer:
        fcntl.flock(peer, fcntl.LOCK_EX)
        waiter = threading.Thread(
            target=lambda: loaded.append(_wasmtime.load_component(engine, source, component_hash))
        )
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive() and not loaded  # it cannot go on while the peer holds it
    waiter.join(WAIT_S)
    assert [one.cache for one in loaded] == [_wasmtime.CompiledCache.HIT]
    assert "waiting for another process compiling" in caplog.text


def test_a_lock_held_for_ever_delays_a_start_only_so_long(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_wasmtime, "COMPILE_LOCK_WAIT_S", 0.2)
    source, component_hash = _tiny(tmp_path)
    engine = _wasmtime.new_engine()
    compiled = _wasmtime.load_component(engine, source, component_hash).path
    with compiled.with_suffix(".lock").open("w") as peer:
        fcntl.flock(peer, fcntl.LOCK_EX)
        loaded = _wasmtime.load_component(engine, source, component_hash)
    assert loaded.cache is _wasmtime.CompiledCache.HIT
    assert "stayed locked" in caplog.text


async def test_a_failed_build_makes_the_executor_unavailable_not_a_crash(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    executor = WasmPythonExecutor(cache_dir=blocked / "cache")
    await nursery.start(executor.serve)
    with trio.fail_after(WAIT_S):
        assert not await executor.wait_ready()
    info = executor.info()
    assert not info.available and "could not be built" in (info.reason or "")


TRAP_THROUGH_MEMORYERROR_NEW = """error while executing at wasm backtrace:
    0: 0x215978 - <unknown>!MemoryError_new
    1: 0x8d48b5 - <unknown>!run

Caused by:
    wasm trap: wasm `unreachable` instruction executed"""


def test_a_trap_is_judged_by_its_message_not_by_the_functions_in_its_backtrace(
    tmp_path: Path,
) -> None:
    # CPython has functions named MemoryError_*: a crash that passes through one is
    # not the program running out of memory.
    executor = WasmPythonExecutor(cache_dir=tmp_path)
    limits = Limits()
    crashed = executor._trapped(Outcome(Status.OK), limits, TRAP_THROUGH_MEMORYERROR_NEW)
    assert crashed.status is Status.CRASHED, crashed
    out_of_memory = executor._trapped(
        Outcome(Status.OK), limits, "Caused by:\n    out of memory (failed to allocate 65536 bytes)"
    )
    assert out_of_memory.status is Status.MEMORY_LIMIT, out_of_memory


def test_a_compiled_cache_replaced_as_it_loads_is_compiled_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, component_hash = _tiny(tmp_path)
    engine = _wasmtime.new_engine()
    _wasmtime.load_component(engine, source, component_hash)  # compiled and cached
    # Checked, then found another file once mapped, then the file compiled.
    versions = iter([(1,), (2,), (3,)])
    monkeypatch.setattr(_wasmtime, "file_version", lambda _path: next(versions))
    loaded = _wasmtime.load_component(engine, source, component_hash)
    assert loaded.cache is _wasmtime.CompiledCache.REBUILT


def test_compiling_gives_the_heap_back_and_loads_the_component_from_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, component_hash = _tiny(tmp_path)
    released: list[bool] = []
    monkeypatch.setattr(_wasmtime, "release_free_memory", lambda: released.append(True))
    loaded = _wasmtime.load_component(_wasmtime.new_engine(), source, component_hash)
    assert loaded.cache is _wasmtime.CompiledCache.MISS and released == [True]
    assert loaded.path.is_file()


def test_giving_the_heap_back_trims_with_glibc_and_does_nothing_without(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trims: list[int] = []

    class Glibc:
        @staticmethod
        def malloc_trim(pad: int) -> int:
            trims.append(pad)
            return 1

    monkeypatch.setattr(_wasmtime, "_LIBC", Glibc())
    _wasmtime.release_free_memory()
    assert trims == [0]
    monkeypatch.setattr(_wasmtime, "_LIBC", object())  # a C library without it
    _wasmtime.release_free_memory()
    assert trims == [0]
