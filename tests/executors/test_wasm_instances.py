"""Instances, and those made ahead of their executions (`wasm_instances`), on the real
JS component."""

from __future__ import annotations

import gc
import json
import shutil
import weakref
from pathlib import Path
from typing import Any

import pytest
import trio
import wasmtime
import wasmtime.component

from conduit.executors import _wasmtime, wasm_instances
from conduit.executors.base import Job, Limits, Status
from conduit.executors.output import StreamName
from conduit.executors.wasm import RUNNERS
from conduit.executors.wasm_instances import (
    BASE_MEMORY_FILE,
    FIRST_INSTANCE_TRIES,
    MIB,
    BaseMemoryRecord,
    Instance,
    Instances,
)
from conduit.executors.wasm_js import WasmJsExecutor
from tests.executors.conftest import JsComponent
from tests.sandboxes import WAIT_S, NoBridge

PRINTING = json.dumps(
    {"function": "(async function () { console.log('hi'); return 1 })", "line_offset": 0}
)


def run(instance: Instance, request: str) -> tuple[str, list[tuple[StreamName, bytes]]]:
    """Run `request` in `instance` with its output attached, and close it."""
    written: list[tuple[StreamName, bytes]] = []
    try:
        instance.install(_wasmtime.Interrupt(WAIT_S))
        instance.output.attach(lambda stream, data: written.append((stream, data)))
        with instance.running():
            return instance.run(instance.store, request), written
    finally:
        instance.close()


def test_the_base_memory_is_the_smallest_limit_that_instantiates(js_instances: Instances) -> None:
    base = js_instances.base_memory_mib
    assert 1 < base < 64  # SpiderMonkey's snapshot: ~10 MiB
    js_instances.new(base * MIB).close()
    with pytest.raises(wasmtime.WasmtimeError, match="exceeds memory limits"):
        js_instances.new((base - 1) * MIB)


def test_a_failure_other_than_the_limit_while_finding_the_base_is_raised(
    js_instances: Instances, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One failed try that is not Wasmtime refusing the limit (say, the host out of
    # memory for a moment) must not pass for a component that needs gigabytes.
    real_new = Instances.new
    failures = iter([wasmtime.WasmtimeError("Cannot allocate memory (os error 12)")])

    def new_failing_once(self: Instances, memory_bytes: int | None = None) -> Instance:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return real_new(self, memory_bytes)

    monkeypatch.setattr(Instances, "new", new_failing_once)
    with pytest.raises(wasmtime.WasmtimeError, match="os error 12"):
        js_instances._smallest_memory_mib()
    assert js_instances._smallest_memory_mib() == js_instances.base_memory_mib


def not_searched(monkeypatch: pytest.MonkeyPatch) -> None:
    def search(self: Instances) -> int:
        raise AssertionError("the base memory was searched for again")

    monkeypatch.setattr(Instances, "_smallest_memory_mib", search)


def test_a_recorded_base_memory_is_taken_at_the_next_start(
    js_component: JsComponent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = BaseMemoryRecord.of(tmp_path, "component", "options")
    found = js_component.instances(record=record).base_memory_mib
    assert record.get() == found
    other = BaseMemoryRecord.of(tmp_path, "component", "other options")
    assert other.get() is None  # each set of options has its own
    not_searched(monkeypatch)
    assert js_component.instances(record=record).base_memory_mib == found


@pytest.mark.parametrize(
    "kept",
    [
        "not json",
        "[1]",
        "[" * 100_000,
        '{"K": -1}',
        '{"K": 0}',
        '{"K": 4097}',
        '{"K": true}',
        '{"K": 10.5}',
        '{"K": "10"}',
        b"\xff\xfe",
    ],
)
def test_a_record_that_is_not_sane_is_found_again_and_replaced(
    js_component: JsComponent, tmp_path: Path, kept: str | bytes
) -> None:
    expected = js_component.instances().base_memory_mib
    record = BaseMemoryRecord.of(tmp_path, "component")
    file = tmp_path / BASE_MEMORY_FILE
    if isinstance(kept, bytes):
        file.write_bytes(kept)
    else:
        file.write_text(kept.replace('"K"', json.dumps(record.key)))
    assert js_component.instances(record=record).base_memory_mib == expected
    assert json.loads(file.read_text()) == {record.key: expected}


def test_a_record_that_cannot_be_written_is_logged_and_found_each_time(
    js_component: JsComponent, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    record = BaseMemoryRecord.of(tmp_path / "gone", "component")
    assert js_component.instances(record=record).base_memory_mib > 1
    assert "could not be recorded" in caplog.text
    assert record.get() is None


async def test_an_executor_records_its_base_memory_beside_the_component(
    tmp_path: Path, wasm_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "wasm"
    cache.mkdir()
    for built in wasm_cache.glob("wasm-js-*"):
        shutil.copytree(built, cache / built.name, ignore=shutil.ignore_patterns(BASE_MEMORY_FILE))
    bases = []
    for _ in range(2):
        executor = WasmJsExecutor(cache_dir=cache)
        async with trio.open_nursery() as nursery:
            await nursery.start(executor.serve)
            with trio.fail_after(WAIT_S):
                assert await executor.wait_ready(), executor.info().reason
            bases.append(executor._instances.base_memory_mib)
            nursery.cancel_scope.cancel()
        assert list(cache.glob(f"wasm-js-*/{BASE_MEMORY_FILE}"))
        not_searched(monkeypatch)  # the second start takes it from there
    assert bases[0] == bases[1] > 1


def failing_first(monkeypatch: pytest.MonkeyPatch, failures: int) -> list[int | None]:
    """Make `Instances.new` fail its first `failures` calls as the kernel's refusal to
    seal a memory image does; the memory limits of every call, in order."""
    real_new = Instances.new
    calls: list[int | None] = []

    def new(self: Instances, memory_bytes: int | None = None) -> Instance:
        calls.append(memory_bytes)
        if len(calls) <= failures:
            raise wasmtime.WasmtimeError("cannot add seals to the memfd")
        return real_new(self, memory_bytes)

    monkeypatch.setattr(Instances, "new", new)
    monkeypatch.setattr(wasm_instances, "FIRST_INSTANCE_BACKOFF_S", 0.0)
    return calls


def test_a_first_instance_that_fails_for_a_moment_is_tried_again(
    js_component: JsComponent, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = js_component.instances().base_memory_mib
    calls = failing_first(monkeypatch, failures=FIRST_INSTANCE_TRIES - 1)
    instances = js_component.instances()
    # The tries are unlimited instances, so no failure reads as a limit too small.
    assert calls[:FIRST_INSTANCE_TRIES] == [None] * FIRST_INSTANCE_TRIES
    assert instances.base_memory_mib == expected


def test_a_first_instance_that_keeps_failing_is_raised(
    js_component: JsComponent, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = failing_first(monkeypatch, failures=FIRST_INSTANCE_TRIES)
    with pytest.raises(wasmtime.WasmtimeError, match="seals"):
        js_component.instances()
    assert len(calls) == FIRST_INSTANCE_TRIES


def test_output_goes_to_the_sink_attached_when_taken(js_instances: Instances) -> None:
    standby = js_instances.standby()
    assert standby is not None
    answer, written = run(standby, PRINTING)
    assert json.loads(answer) == {"result": 1}
    assert {stream for stream, _ in written} == {"stdout"}
    assert b"".join(data for _, data in written) == b"hi\n"


def test_a_standby_that_cannot_be_made_is_none_and_logged(
    js_instances: Instances, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Instantiation under a limit below the base fails, as a broken component would.
    monkeypatch.setattr(js_instances, "new", lambda: Instances.new(js_instances, MIB))
    assert js_instances.standby() is None
    assert "could not be made ahead" in caplog.text


async def test_the_executor_keeps_standby_instances_while_serving_and_none_after(
    wasm_cache: Path,
) -> None:
    executor = WasmJsExecutor(cache_dir=wasm_cache)
    async with trio.open_nursery() as nursery:
        await nursery.start(executor.serve)
        with trio.fail_after(WAIT_S):
            assert await executor.wait_ready(), executor.info().reason
            while executor.info().pool["standby_instances"] < RUNNERS:
                await trio.sleep(0.01)
        job = Job("ex_standby", "javascript", "6 * 7", Limits())
        with trio.fail_after(WAIT_S):
            assert (await executor.run(job, NoBridge())).result == 42
            # The runner that ran it makes its next instance after answering.
            while executor.info().pool["standby_instances"] < RUNNERS:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert executor.info().pool["standby_instances"] == 0


async def test_a_memory_limit_below_what_the_sandbox_starts_with_is_refused_plainly(
    wasm_js: Any,
) -> None:
    base = wasm_js.info().pool["base_memory_mib"]
    job = Job("ex_tiny", "javascript", "1", Limits(memory_mb=base - 1))
    with trio.fail_after(WAIT_S):
        outcome = await wasm_js.run(job, NoBridge())
    assert outcome.status is Status.MEMORY_LIMIT
    assert outcome.error is not None
    assert f"needs {base} MB to start" in outcome.error.message
    assert f"limit of {base - 1} MB" in outcome.error.message
    job = Job("ex_enough", "javascript", "[1, 2, 3].length", Limits(memory_mb=base + 16))
    with trio.fail_after(WAIT_S):
        assert (await wasm_js.run(job, NoBridge())).result == 3


async def test_a_stopped_executor_is_freed_with_its_engine(wasm_cache: Path) -> None:
    # Wasmtime keeps registered host functions in a process-wide table until their
    # linker is freed: one that held the executor would keep every stopped executor's
    # engine, compiled code and pool alive (~60 MB each). Its runner threads are gone
    # by the time `serve` returns.
    executor = WasmJsExecutor(cache_dir=wasm_cache)
    async with trio.open_nursery() as nursery:
        await nursery.start(executor.serve)
        with trio.fail_after(WAIT_S):
            assert await executor.wait_ready(), executor.info().reason
            job = Job("ex_freed", "javascript", "1", Limits())
            assert (await executor.run(job, NoBridge())).status is Status.OK
        nursery.cancel_scope.cancel()
    freed = weakref.ref(executor)
    del executor, job
    gc.collect()
    assert freed() is None
