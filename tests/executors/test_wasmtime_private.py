"""Wasmtime's private paths (`_wasmtime_private`) and the public ones that stand in for
them: when each is taken, and that both run the real JS component alike."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import trio
import wasmtime

from conduit.executors import _wasmtime
from conduit.executors import _wasmtime_private as private
from conduit.executors.base import Job, Limits, Outcome, Status
from conduit.executors.wasm_build import ensure_component
from conduit.executors.wasm_guests import JS_GUEST
from conduit.executors.wasm_instances import Instance, Instances
from conduit.executors.wasm_js import WasmJsExecutor
from tests.executors.conftest import JsComponent
from tests.sandboxes import WAIT_S, NoBridge

ROOT = Path(__file__).resolve().parents[2]
# Every width of UTF-8, and the characters JSON escapes.
TEXT = 'plain, é, ☃, 𝄞, "quoted", back\\slash, new\nline'


@pytest.fixture(params=["private", "public"])
def api(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test taking it runs on both paths; on "public" the private one is off, as
    when the installed wasmtime is not the pinned one."""
    if request.param == "private" and not private.AVAILABLE:
        pytest.skip(f"the private paths are off: {private.UNAVAILABLE_REASON}")
    if request.param == "public":
        monkeypatch.setattr(private, "AVAILABLE", False)
    return request.param


@pytest.fixture
def component(api: str, wasm_cache: Path) -> JsComponent:
    """The real JS component in an engine made on `api`'s path (two pool slots)."""
    built = ensure_component(JS_GUEST, wasm_cache)
    engine = _wasmtime.new_engine(instances=2)
    loaded = _wasmtime.load_component(engine, built.path, built.component_hash)
    return JsComponent(engine, loaded.component)


def run(instances: Instances, body: str, inputs: object = None, timeout_s: float = WAIT_S) -> str:
    """`run` a fresh instance on a program of `body`; the guest's answer, unparsed."""
    instance: Instance = instances.new()
    try:
        instance.install(_wasmtime.Interrupt(timeout_s))
        request = {"function": f"(async function () {{\n{body}\n}})", "line_offset": 1}
        return instance.run(instance.store, json.dumps({**request, "inputs": inputs}))
    finally:
        instance.close()


# -- when the private paths are taken ---------------------------------------------------


def test_the_checked_version_is_the_pinned_one() -> None:
    # The daemon's dependencies are the `daemon` extra; the base install is the client.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = project["optional-dependencies"]["daemon"]
    assert f"wasmtime=={private.PINNED_VERSION}" in pins
    assert importlib.metadata.version("wasmtime") == private.PINNED_VERSION


def test_the_private_paths_are_on_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(private.PUBLIC_ONLY_ENV, raising=False)
    assert private._unavailable_reason() is None
    for off in ("1", "yes"):
        monkeypatch.setenv(private.PUBLIC_ONLY_ENV, off)
        assert private._unavailable_reason() == f"{private.PUBLIC_ONLY_ENV} is set"
    monkeypatch.setenv(private.PUBLIC_ONLY_ENV, "0")
    assert private._unavailable_reason() is None


def test_the_public_paths_are_announced_once_at_import() -> None:
    env = {**os.environ, private.PUBLIC_ONLY_ENV: "1"}
    code = "import conduit.executors._wasmtime, conduit.executors.wasm_js"
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "public API only" in line]
    assert lines == [
        f"using wasmtime's public API only ({private.PUBLIC_ONLY_ENV} is set): executions run "
        "slower, and guests that compute are not held to the CPU slots"
    ]


def test_another_wasmtime_version_takes_the_public_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(private.PUBLIC_ONLY_ENV, raising=False)
    monkeypatch.setattr(importlib.metadata, "version", lambda _name: "99.0.0")
    assert private._unavailable_reason() == f"wasmtime is 99.0.0, not {private.PINNED_VERSION}"


def test_a_missing_private_name_takes_the_public_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(private.PUBLIC_ONLY_ENV, raising=False)
    monkeypatch.delattr(private.ffi, "wasmtime_store_epoch_deadline_callback")
    monkeypatch.delattr(private.ffi, "wasmtime_pooling_allocation_config_total_stacks_set")
    assert private._unavailable_reason() == (
        "wasmtime lacks wasmtime_store_epoch_deadline_callback, "
        "wasmtime_pooling_allocation_config_total_stacks_set"
    )


# -- both paths run the component alike -------------------------------------------------


def test_strings_cross_the_export_whole_both_ways(component: JsComponent) -> None:
    answer = run(component.instances(), "return [inputs, inputs.length]", inputs=TEXT)
    assert json.loads(answer) == {"result": [TEXT, len(TEXT.encode("utf-16-le")) // 2]}


async def test_a_guest_that_never_ends_traps_once_its_time_is_up(component: JsComponent) -> None:
    ticker = _wasmtime.EpochTicker()
    instances = component.instances()
    async with trio.open_nursery() as nursery:
        await nursery.start(ticker.serve)
        with (
            ticker.registered(component.engine),
            trio.fail_after(WAIT_S),
            pytest.raises(wasmtime.WasmtimeError),
        ):
            await trio.to_thread.run_sync(
                lambda: _spin_under(ticker, instances), abandon_on_cancel=True
            )
        nursery.cancel_scope.cancel()


def _spin_under(ticker: _wasmtime.EpochTicker, instances: Instances) -> None:
    with ticker.running():
        run(instances, "while (true) {}", timeout_s=0.2)


def test_only_the_private_path_bounds_the_instances_an_engine_holds(
    api: str, component: JsComponent
) -> None:
    """The pool has a slot for each component instance of two stores (a guest and its
    clock's helper each; these stores hold a guest alone); the public path maps fresh
    memory for every instance, so has no such bound."""
    instances = component.instances()
    held = [instances.new() for _ in range(2 * _wasmtime.COMPONENTS_PER_STORE)]
    try:
        if api == "private":
            with pytest.raises(wasmtime.WasmtimeError, match=re.compile("concurrent|limit", re.I)):
                held.append(instances.new())
        else:
            held.append(instances.new())
    finally:
        for instance in held:
            instance.close()


# -- the executor on both paths ---------------------------------------------------------


@pytest.fixture
async def executor(api: str, nursery: trio.Nursery, wasm_cache: Path) -> WasmJsExecutor:
    made = WasmJsExecutor(cache_dir=wasm_cache)
    await nursery.start(made.serve)
    with trio.fail_after(WAIT_S):
        assert await made.wait_ready()
    return made


async def _execute(executor: WasmJsExecutor, code: str, **limits: int) -> Outcome:
    with trio.fail_after(WAIT_S):
        return await executor.run(Job("ex_api", "javascript", code, Limits(**limits)), NoBridge())


async def test_the_executor_runs_programs_and_times_them_out(executor: WasmJsExecutor) -> None:
    ok = await _execute(executor, "const x = 20;\nx + 22")
    assert (ok.status, ok.result) == (Status.OK, 42)
    spin = await _execute(executor, "console.log('spin');\nwhile (true) {}", timeout_ms=1000)
    assert spin.status is Status.TIMEOUT
    assert spin.stdout == "spin\n"
    assert (await _execute(executor, "'after'")).result == "after"


async def test_a_stopped_execution_is_reported_cancelled(executor: WasmJsExecutor) -> None:
    job = Job("ex_stop", "javascript", "while (true) {}", Limits(timeout_ms=3000))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop_later, job)
        with trio.fail_after(WAIT_S):
            outcome = await executor.run(job, NoBridge())
    assert outcome.status is Status.CANCELLED


async def _stop_later(job: Job) -> None:
    await trio.sleep(0.2)
    job.stop.set()
