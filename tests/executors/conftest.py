"""Fixtures shared by the executor tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import wasmtime
import wasmtime.component

from conduit.executors import _wasmtime
from conduit.executors.wasm_build import ensure_component
from conduit.executors.wasm_calls import StringImport, add_string_import
from conduit.executors.wasm_guests import JS_GUEST
from conduit.executors.wasm_instances import Instances


def null_host_call(_method: str, _params: str) -> str:
    """A `host-call` that answers every call with a null result."""
    return '{"result": null}'


@dataclass
class JsComponent:
    """The real JS component, loaded into an engine of its own (8 pool slots)."""

    engine: wasmtime.Engine
    component: wasmtime.component.Component

    def instances(self, host_call: StringImport = null_host_call) -> Instances:
        """Instances whose `host-call` is answered by `host_call`."""
        linker = wasmtime.component.Linker(self.engine)
        linker.add_wasip2()
        add_string_import(linker, "host-call", host_call)
        return Instances(self.engine, linker, self.component, fuel=False)


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
