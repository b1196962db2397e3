"""The wasm-python executor: Python programs in CPython 3.14 compiled to WebAssembly.

The guest (`shims/wasm_python/guest.py`) is built into a component by componentize-py
and pre-initialised, so the interpreter and the chosen standard-library modules are
already loaded when an instance starts (`wasm_guests.PYTHON_GUEST`); the rest of the
standard library, which the build leaves beside the component, is mounted read-only
where the guest's interpreter looks for it. Everything about running it is shared
with the other Wasmtime executors (`wasm.WasmExecutor`).
"""

from __future__ import annotations

from pathlib import Path

from conduit.executors.wasm import WasmExecutor
from conduit.executors.wasm_guests import PYTHON_GUEST, STDLIB_DIR

__all__ = ["WasmPythonExecutor"]

GUEST_STDLIB = ("/python", "/python/lib/python3.14")


class WasmPythonExecutor(WasmExecutor):
    """Runs Python programs in fresh CPython-on-Wasmtime instances."""

    name = "wasm-python"
    languages = frozenset({"python"})
    recipe = PYTHON_GUEST
    runtime = "CPython 3.14"
    files = True
    # Kept resident, a trivial program's pages need no faults: its run took 0.55 ms
    # of CPU instead of 2.1 ms, for a reset of 1.4 ms instead of 0.4 (made off the
    # request path since instances are made ahead), and less CPU in all (2.85 against
    # 3.5 ms per execution; 32 MiB measured the same as 16).
    keep_resident_bytes = 16 * 1024 * 1024

    def read_only_dirs(self, component_dir: Path) -> tuple[tuple[Path, str], ...]:
        # Where the guest's interpreter finds its standard library (its sys.prefix), and
        # where its frozen modules (os, codecs, ...) say their sources are.
        stdlib = component_dir / STDLIB_DIR
        return tuple((stdlib, guest) for guest in GUEST_STDLIB)
