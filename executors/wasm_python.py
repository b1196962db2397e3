"""The wasm-python executor: Python programs in CPython 3.14 compiled to WebAssembly.

The guest (`shims/wasm_python/guest.py`) is built into a component by componentize-py
and pre-initialised, so the interpreter and the chosen standard-library modules are
already loaded when an instance starts (`wasm_guests.PYTHON_GUEST`); the rest of the
standard library, which the build leaves beside the component, is mounted read-only
where the guest's interpreter looks for it. Everything about running it is shared
with the other Wasmtime executors (`wasm.WasmExecutor`). The operator's packages, if
any, are built into a component of their own (`wasm_guests.python_guest`) and their
files, left beside it too, are mounted read-only at /packages.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from conduit.executors.wasm import WasmExecutor
from conduit.executors.wasm_guests import (
    GUEST_PACKAGES,
    PACKAGES_DIR,
    PYTHON_GUEST,
    STDLIB_DIR,
    python_guest,
)

__all__ = ["WasmPythonExecutor"]

GUEST_STDLIB = ("/python", "/python/lib/python3.14")


class WasmPythonExecutor(WasmExecutor):
    """Runs Python programs in fresh CPython-on-Wasmtime instances.

    `packages` are requirements of pure-Python packages the programs may import,
    canonical (see `core.requirements.parse_requirement`); they are resolved and built into the
    component once (see `wasm_guests.python_guest`).
    """

    name = "wasm-python"
    languages = frozenset({"python"})
    recipe = PYTHON_GUEST
    runtime = "CPython 3.14"
    files = True
    # Kept resident, the pages a trivial program touches need no faults: its run is a
    # quarter as long, the reset longer but off the request path (instances are made
    # ahead), and less CPU is spent in all. It covers the pages a trivial program
    # touches, which reach higher since asyncio, logging and the rest are preloaded
    # (16 MB no longer did); more would only lengthen the reset.
    keep_resident_bytes = 24 * 1024 * 1024

    def __init__(
        self,
        *,
        cache_dir: str | os.PathLike[str],
        fuel: int | None = None,
        packages: Sequence[str] = (),
    ) -> None:
        super().__init__(cache_dir=cache_dir, fuel=fuel)
        self.recipe = python_guest(packages)

    def read_only_dirs(self, component_dir: Path) -> tuple[tuple[Path, str], ...]:
        # Where the guest's interpreter finds its standard library (its sys.prefix), and
        # where its frozen modules (os, codecs, ...) say their sources are.
        stdlib = component_dir / STDLIB_DIR
        dirs = tuple((stdlib, guest) for guest in GUEST_STDLIB)
        packages = component_dir / PACKAGES_DIR
        if packages.is_dir():
            dirs += ((packages, GUEST_PACKAGES),)
        return dirs
