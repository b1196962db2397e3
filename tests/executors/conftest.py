"""Fixtures shared by the executor tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import wasmtime
import wasmtime.component

from conduit.executors import _wasmtime
from conduit.executors.wasm_build import ensure_component
from conduit.executors.wasm_guests import JS_GUEST
from conduit.executors.wasm_instances import Instances


@pytest.fixture
def make_js_instances(wasm_cache: Path) -> Callable[[], Instances]:
    """Makes `Instances` of the real JS component, on one engine of their own (8 pool
    slots), whose `host-call` answers every call with a null result."""
    built = ensure_component(JS_GUEST, wasm_cache)
    engine = _wasmtime.new_engine(instances=8)
    loaded = _wasmtime.load_component(engine, built.path, built.component_hash)
    linker = wasmtime.component.Linker(engine)
    linker.add_wasip2()
    linker.root().add_func("host-call", lambda _store, _method, _params: '{"result": null}')
    return lambda: Instances(engine, linker, loaded.component, fuel=False)


@pytest.fixture
def js_instances(make_js_instances: Callable[[], Instances]) -> Instances:
    """Instances of the real JS component (see `make_js_instances`)."""
    return make_js_instances()
