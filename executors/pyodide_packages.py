"""The zip the Pyodide interpreters import the operator's packages from.

Pyodide's interpreters read no file: the host hands each one, as bytes, the zip of the
time-zone data that `PREPARE` puts on `sys.path` (see shims/pyodide_boot.js). With
packages configured, that zip also holds their files (see `packages`), compiled by
Pyodide's own CPython (the caller's `compile_zip`, in an interpreter of it), so they
are imported with `zipimport` from the interpreter's memory without compiling, and the
memory snapshot, keyed by the zip's bytes, is built again for them. Without packages
the plain time-zone zip is used as it always was.

The zip is `packages-<key>.zip` beside Pyodide, keyed by the requirements, the Python
version, the time-zone zip and the compiler, with its lock file beside it; made once, in
a temporary directory (`.packages-*`, removed by a later build if a killed one left it)
renamed into place. Zips of other lists are left alone: another daemon may share the
directory. A package the time zones hold already (tzdata) is locked, not unpacked.

Blocking (pip and the compiler run): call `ensure_packages_zip` in a worker thread.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

from conduit.executors.package_markers import GuestEnvironment
from conduit.executors.package_pins import pins_path, resolve
from conduit.executors.packages import (
    RESOLUTION,
    LockedPackage,
    extract_wheels,
    read_lock,
    requirements_key,
    write_lock,
    zip_directory,
)
from conduit.executors.wasm_build import BuildError, only_build_errors, remove_abandoned
from conduit.executors.wasm_guests import PACKAGES_DIR

__all__ = ["CompileZip", "ensure_packages_zip", "guest_environment"]

# Enough of the key's digest in a file name to tell builds apart.
KEY_CHARS = 16
# Prefix of a build's temporary directory in the install directory: one untouched for
# long is a killed build's, removed by the next (see `wasm_build.remove_abandoned`).
WORK_PREFIX = ".packages-"
_PYTHON = re.compile(r"^(\d+\.\d+)(\.\d+)?$")

# Compiles the zip of the packages' sources (the first path) into a zip of their
# bytecode alone, each pyc beside its source (the second path). Raises BuildError.
CompileZip = Callable[[Path, Path], None]


def guest_environment(pyodide_dir: Path) -> GuestEnvironment:
    """The interpreter of the Pyodide in `pyodide_dir` as environment markers see it,
    with its Python version from Pyodide's lock file. Raises BuildError if it does not
    say."""
    try:
        info = json.loads((pyodide_dir / "pyodide-lock.json").read_text(encoding="utf-8"))["info"]
        found = _PYTHON.match(info["python"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BuildError(f"Pyodide's lock file gives no Python version: {exc}") from None
    if found is None:
        raise BuildError(f"Pyodide's lock file gives no Python version: {info['python']!r}")
    version = found.group(1)
    return GuestEnvironment(
        python_version=version,
        python_full_version=version + (found.group(2) or ".0"),
        sys_platform="emscripten",
        platform_system="Emscripten",
    )


def ensure_packages_zip(
    install_dir: Path,
    requirements: Sequence[str],
    guest: GuestEnvironment,
    time_zones: Path,
    compile_zip: CompileZip,
    compiler: str,
) -> tuple[Path, tuple[LockedPackage, ...]]:
    """The zip of the time zones and the packages `requirements` resolve to, and those
    packages; made in `install_dir` if it is not there yet, its modules compiled by
    `compile_zip`, which `compiler` names (a digest of all its bytecode depends on).

    Raises BuildError as `packages.download` does, if a package's files clash with
    the time zones', and for anything else that fails (see `only_build_errors`).
    """
    python = guest.python_version
    inputs = (python, time_zones.name, RESOLUTION, compiler)
    key = requirements_key(requirements, *inputs)[:KEY_CHARS]
    target = install_dir / f"packages-{key}.zip"
    lock = target.with_suffix(".lock.json")
    if target.is_file() and lock.is_file():
        return target.resolve(), read_lock(lock)
    with only_build_errors("building the pyodide packages"):
        remove_abandoned(install_dir, WORK_PREFIX)
        work = Path(tempfile.mkdtemp(prefix=WORK_PREFIX, dir=install_dir))
        try:
            pins = pins_path(install_dir, requirements, python)
            packages = _build_zip(work, requirements, guest, time_zones, pins, compile_zip)
            # The zip first: a lock names a zip that is complete.
            os.replace(work / "site.zip", target)
            os.replace(work / "lock.json", lock)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target.resolve(), tuple(packages)


def _build_zip(
    work: Path,
    requirements: Sequence[str],
    guest: GuestEnvironment,
    time_zones: Path,
    pins: Path,
    compile_zip: CompileZip,
) -> list[LockedPackage]:
    """Make `work/site.zip` (the time zones and the packages, downloaded as `pins`
    says: see `package_pins`) and `work/lock.json`; what was downloaded."""
    wheels = work / "wheels"
    wheels.mkdir()
    packages = resolve(requirements, guest, wheels, pins)
    with zipfile.ZipFile(time_zones) as zones:
        taken = frozenset(zones.namelist())
    extract_wheels(wheels, packages, work / PACKAGES_DIR, taken=taken)
    shutil.rmtree(wheels)
    # Imported from a zip, modules would be compiled in every interpreter, each time.
    _compile(work / PACKAGES_DIR, work, compile_zip)
    with zipfile.ZipFile(time_zones) as zones, zipfile.ZipFile(work / "site.zip", "w") as out:
        for entry in zones.infolist():
            out.writestr(entry, zones.read(entry))
        zip_directory(work / PACKAGES_DIR, out, taken=taken)
    write_lock(work / "lock.json", requirements, guest.python_version, packages)
    return packages


def _compile(packages: Path, work: Path, compile_zip: CompileZip) -> None:
    """Put beside each module under `packages` its bytecode, which `compile_zip` makes
    from a zip of them (in `work`)."""
    sources, compiled = work / "sources.zip", work / "compiled.zip"
    with zipfile.ZipFile(sources, "w") as out:
        zip_directory(packages, out)
    compile_zip(sources, compiled)
    with zipfile.ZipFile(compiled) as bytecode:
        names = bytecode.namelist()
        if not all(name.endswith(".pyc") for name in names):
            raise BuildError("the packages' compiler made something other than bytecode")
        bytecode.extractall(packages)
    sources.unlink()
    compiled.unlink()
