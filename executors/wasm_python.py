"""The wasm-python executor: Python programs in CPython 3.14 compiled to WebAssembly.

The guest (`shims/wasm_python/guest.py`) is built into a component by componentize-py
and pre-initialised, so the interpreter and the chosen standard-library modules are
already loaded when an instance starts (`wasm_guests.PYTHON_GUEST`); the rest of the
standard library, which the build leaves beside the component, is mounted read-only
where the guest's interpreter looks for it. Everything about running it is shared
with the other Wasmtime executors (`wasm.WasmExecutor`). The operator's packages, if
any, are files in a directory of their own (`wasm_packages`), compiled by an instance
of that same component and mounted read-only at /packages, which the guest puts on
`sys.path`: one component serves every package list.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path

import wasmtime.component

from conduit.executors.packages import LOCK_FILE, RESOLUTION, project_names, read_lock
from conduit.executors.wasm import WasmExecutor
from conduit.executors.wasm_build import shim_path
from conduit.executors.wasm_guests import GUEST_PACKAGES, GUEST_PYTHON, PYTHON_GUEST, STDLIB_DIR
from conduit.executors.wasm_packages import PACKAGES_DIR, ensure_packages_dir

__all__ = ["WasmPythonExecutor"]

GUEST_STDLIB = ("/python", "/python/lib/python3.14")
# The program that compiles the packages in the guest, and where it sees them: not at
# GUEST_PACKAGES, so they are never on its `sys.path` while it compiles.
COMPILE_PROGRAM = "wasm_python/compile_packages.py"
COMPILE_STAGING = "/staging"


class WasmPythonExecutor(WasmExecutor):
    """Runs Python programs in fresh CPython-on-Wasmtime instances.

    `packages` are requirements of pure-Python packages the programs may import,
    canonical (see `core.requirements.parse_requirement`); they are resolved and built
    into a directory of their own once (see `wasm_packages`).
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
        self._requirements = tuple(sorted(set(packages)))
        self._packages_dir: Path | None = None

    def prepare_files(self, component: wasmtime.component.Component) -> None:
        """Build (or find) the packages' directory for this component, if any are listed."""
        if not self._requirements or self._built is None:
            return
        self._packages_dir = ensure_packages_dir(
            self._requirements,
            GUEST_PYTHON,
            self._built.component_hash,
            self._cache_dir,
            functools.partial(self._compile_packages, component),
        )
        self._packages = project_names(read_lock(self._packages_dir / LOCK_FILE))
        self._packages_inputs = {
            "packages": " ".join(self._requirements),
            "packages_resolution": RESOLUTION,
        }

    def _compile_packages(self, component: wasmtime.component.Component, packages: Path) -> None:
        """Compile `packages` with the guest's own CPython, in an instance of `component`:
        the bytecode must be its version's, which the host's Python may not be."""
        code = shim_path(COMPILE_PROGRAM).read_text(encoding="utf-8")
        inputs = {"dir": COMPILE_STAGING, "guest_dir": GUEST_PACKAGES}
        self.run_trusted(component, code, inputs, ((packages, COMPILE_STAGING),))

    def read_only_dirs(self, component_dir: Path) -> tuple[tuple[Path, str], ...]:
        # Where the guest's interpreter finds its standard library (its sys.prefix), and
        # where its frozen modules (os, codecs, ...) say their sources are.
        stdlib = component_dir / STDLIB_DIR
        dirs = tuple((stdlib, guest) for guest in GUEST_STDLIB)
        if self._packages_dir is not None:
            dirs += ((self._packages_dir / PACKAGES_DIR, GUEST_PACKAGES),)
        return dirs
