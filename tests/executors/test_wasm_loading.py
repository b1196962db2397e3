"""A Wasmtime executor whose component fails to load is loaded again; one whose build
fails is not (`WasmExecutor.serve`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import wasmtime

from conduit.executors import _wasmtime, wasm
from conduit.executors.base import Job
from conduit.executors.wasm_build import BuildError
from conduit.executors.wasm_js import WasmJsExecutor
from tests.sandboxes import WAIT_S, NoBridge


def failing(
    monkeypatch: pytest.MonkeyPatch, module: Any, name: str, *failures: Exception
) -> list[int]:
    """Make `module.name` raise `failures` on its first calls; a list counting every call."""
    real = getattr(module, name)
    calls: list[int] = []

    def patched(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) <= len(failures):
            raise failures[len(calls) - 1]
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, patched)
    monkeypatch.setattr(wasm, "LOAD_RETRY_FIRST_S", 0.01)
    return calls


async def test_a_component_that_fails_to_load_is_loaded_again(
    nursery: trio.Nursery, wasm_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refusal = wasmtime.WasmtimeError("cannot add seals to the memfd")
    calls = failing(monkeypatch, _wasmtime, "load_component", refusal, refusal)
    executor = WasmJsExecutor(cache_dir=wasm_cache)
    await nursery.start(executor.serve)
    with trio.fail_after(WAIT_S):
        assert not await executor.wait_ready()
        assert "cannot add seals" in (executor.info().reason or "")
        assert "trying again in" in (executor.info().reason or "")
        while not executor.info().available:
            await trio.sleep(0.01)
    assert len(calls) == 3  # two refusals, then loaded
    outcome = await executor.run(Job("ex_reloaded", "javascript", "6 * 7"), NoBridge())
    assert outcome.result == 42


async def test_a_failed_build_is_not_tried_again(
    nursery: trio.Nursery, wasm_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = failing(monkeypatch, wasm, "ensure_component", BuildError("node is not on PATH"))
    executor = WasmJsExecutor(cache_dir=wasm_cache)
    await nursery.start(executor.serve)
    with trio.fail_after(WAIT_S):
        assert not await executor.wait_ready()
    await trio.sleep(0.2)  # twenty first retry delays
    info = executor.info()
    assert len(calls) == 1
    assert not info.available
    assert info.reason is not None and "node is not on PATH" in info.reason
    assert "trying again" not in info.reason
