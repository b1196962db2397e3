"""Instances made ahead of their executions (`wasm_instances`), on the real JS component."""

from __future__ import annotations

import gc
import json
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import wasmtime
import wasmtime.component

from conduit.executors import _wasmtime
from conduit.executors.base import Job, Limits, Status
from conduit.executors.output import StreamName
from conduit.executors.wasm import STANDBY_INSTANCES
from conduit.executors.wasm_build import ensure_component
from conduit.executors.wasm_guests import JS_GUEST
from conduit.executors.wasm_instances import MIB, Instances
from conduit.executors.wasm_js import WasmJsExecutor
from tests.sandboxes import WAIT_S, NoBridge

STANDBY = 2
PRINTING = json.dumps(
    {"function": "(async function () { console.log('hi'); return 1 })", "line_offset": 0}
)


@pytest.fixture
def instances(wasm_cache: Path) -> Iterator[Instances]:
    built = ensure_component(JS_GUEST, wasm_cache)
    engine = _wasmtime.new_engine(instances=8)
    loaded = _wasmtime.load_component(engine, built.path, built.component_hash)
    linker = wasmtime.component.Linker(engine)
    linker.add_wasip2()
    linker.root().add_func("host-call", lambda _store, _method, _params: '{"result": null}')
    made = Instances(engine, linker, loaded.component, fuel=False, standby=STANDBY)
    yield made
    made.close()


def run(instances: Instances, request: str) -> tuple[str, list[tuple[StreamName, bytes]]]:
    """Take (or make) an instance, run `request` in it, and close it."""
    instance = instances.take() or instances.new()
    written: list[tuple[StreamName, bytes]] = []
    try:
        instance.install(_wasmtime.Interrupt(WAIT_S))
        instance.output.attach(lambda stream, data: written.append((stream, data)))
        return instance.run(instance.store, request), written
    finally:
        instance.close()


def test_the_base_memory_is_the_smallest_limit_that_instantiates(instances: Instances) -> None:
    base = instances.base_memory_mib
    assert 1 < base < 64  # SpiderMonkey's snapshot: ~10 MiB
    instances.new(base * MIB).close()
    with pytest.raises(wasmtime.WasmtimeError, match="exceeds memory limits"):
        instances.new((base - 1) * MIB)


def test_refill_keeps_the_standby_count_and_each_instance_serves_one_run(
    instances: Instances,
) -> None:
    assert instances.standing_by == 0
    instances.refill()
    assert instances.standing_by == STANDBY
    first = instances.take()
    second = instances.take()
    assert first is not None and second is not None and first is not second
    assert instances.take() is None  # none left until the next refill
    for instance in (first, second):
        instance.close()
    instances.refill()
    assert instances.standing_by == STANDBY


def test_output_goes_to_the_sink_attached_when_taken(instances: Instances) -> None:
    instances.refill()
    answer, written = run(instances, PRINTING)
    assert json.loads(answer) == {"result": 1}
    assert {stream for stream, _ in written} == {"stdout"}
    assert b"".join(data for _, data in written) == b"hi\n"


def test_closing_closes_the_standbys_and_stops_refills(instances: Instances) -> None:
    instances.refill()
    instances.close()
    assert instances.standing_by == 0
    instances.refill()
    assert instances.standing_by == 0
    assert instances.take() is None


async def test_the_executor_keeps_standbys_while_serving_and_closes_them_after(
    wasm_cache: Path,
) -> None:
    executor = WasmJsExecutor(cache_dir=wasm_cache)
    async with trio.open_nursery() as nursery:
        await nursery.start(executor.serve)
        with trio.fail_after(WAIT_S):
            assert await executor.wait_ready(), executor.info().reason
        assert executor.info().pool["standby_instances"] == STANDBY_INSTANCES
        job = Job("ex_standby", "javascript", "6 * 7", Limits())
        with trio.fail_after(WAIT_S):
            assert (await executor.run(job, NoBridge())).result == 42
            # The thread that ran it makes the next standby after answering.
            while executor.info().pool["standby_instances"] < STANDBY_INSTANCES:
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
    # engine, compiled code and pool alive (~60 MB each).
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
