"""Fixtures shared by the executor tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
import wasmtime
import wasmtime.component

from conduit.executors import _wasmtime
from conduit.executors.base import ExecutorSession, SessionSpec
from conduit.executors.wasm import WasmExecutor
from conduit.executors.wasm_build import ensure_component
from conduit.executors.wasm_calls import StringImport, add_string_import
from conduit.executors.wasm_guests import JS_GUEST
from conduit.executors.wasm_instances import BaseMemoryRecord, Instances
from conduit.executors.wasm_python import WasmPythonExecutor
from tests.sandboxes import WAIT_S

# What a Wasmtime test session's memory is capped at.
SESSION_MB = 128


def null_host_call(_method: str, _params: str) -> str:
    """A `host-call` that answers every call with a null result."""
    return '{"result": null}'


@dataclass
class JsComponent:
    """The real JS component, loaded into an engine of its own (8 pool slots)."""

    engine: wasmtime.Engine
    component: wasmtime.component.Component

    def instances(
        self, host_call: StringImport = null_host_call, record: BaseMemoryRecord | None = None
    ) -> Instances:
        """Instances whose `host-call` is answered by `host_call`."""
        linker = wasmtime.component.Linker(self.engine)
        linker.add_wasip2()
        add_string_import(linker, "host-call", host_call)
        return Instances(self.engine, linker, self.component, fuel=False, record=record)


@pytest.fixture
def js_component(wasm_cache: Path) -> JsComponent:
    built = ensure_component(JS_GUEST, wasm_cache)
    engine = _wasmtime.new_engine(instances=8)
    loaded = _wasmtime.load_component(engine, built.path, built.component_hash)
    return JsComponent(engine, loaded.component)


@pytest.fixture
def js_instances(js_component: JsComponent) -> Instances:
    """Instances of the real JS component whose `host-call` answers null to all."""
    return js_component.instances()


async def open_wasm_session(executor: WasmExecutor, session_id: str = "ses_1") -> ExecutorSession:
    """A session of alice's on `executor`, in the language it keeps sessions in."""
    language = min(executor.languages - getattr(executor, "partly", frozenset()))
    with trio.fail_after(WAIT_S):
        return await executor.open_session(SessionSpec(session_id, language, SESSION_MB, "alice"))


@pytest.fixture
async def py_session(wasm: WasmPythonExecutor) -> AsyncIterator[ExecutorSession]:
    """A wasm-python session, closed after the test."""
    session = await open_wasm_session(wasm)
    try:
        yield session
    finally:
        await session.aclose()
