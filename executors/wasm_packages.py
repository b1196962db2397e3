"""The wasm-python packages directory for one list: resolved, unpacked, compiled in the
guest, moved into place atomically.

The operator's packages (see `packages`) are files, mounted read-only at /packages in
every instance of the one wasm-python component, whose guest puts that directory on
`sys.path` when it exists (shims/wasm_python/guest.py): a list needs no component of its
own. Their directory is `<cache_dir>/wasm-python-packages-<list>-<hash>/`, holding
`packages/` and the lock file, where `<list>` is the requirements' digest and `<hash>`
covers them, the guest's Python version, `RESOLUTION` and the component's hash: the
bytecode is that component's CPython's, compiled by the caller's `compile_dir` in an
instance of it. It is built in a temporary directory (`.build-*`, removed by a later
build if a killed one left it) renamed into place, so two daemons sharing the cache
never see half of one; a new one deletes only the same list's superseded directories.

Blocking (pip runs, the guest compiles): call `ensure_packages_dir` in a worker thread.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from conduit.executors.package_markers import GuestEnvironment
from conduit.executors.package_pins import pins_path, resolve
from conduit.executors.packages import (
    LOCK_FILE,
    RESOLUTION,
    extract_wheels,
    requirements_key,
    write_lock,
)
from conduit.executors.wasm_build import (
    BUILD_PREFIX,
    BuildProgress,
    current_progress,
    move_into_place,
    only_build_errors,
    prune_superseded,
    remove_abandoned,
)
from conduit.executors.wasm_guests import PACKAGES_DIR

__all__ = ["PACKAGES_DIR", "ensure_packages_dir", "packages_dir_name"]

NAME_PREFIX = "wasm-python-packages"
# Enough of the requirements' digest in a directory's name to tell lists apart.
LIST_KEY_CHARS = 12


def packages_dir_name(requirements: Sequence[str], python: str) -> str:
    """The prefix of every directory built for this list (`<prefix>-<16 hex>`)."""
    return f"{NAME_PREFIX}-{requirements_key(requirements, python)[:LIST_KEY_CHARS]}"


def ensure_packages_dir(
    requirements: Sequence[str],
    guest: GuestEnvironment,
    component_hash: str,
    cache_dir: Path,
    compile_dir: Callable[[Path], None],
) -> Path:
    """The directory of the packages `requirements` name (canonical) for the component
    `component_hash`, built if needed: `compile_dir(packages)` compiles the unpacked files
    in place. Raises only BuildError."""
    wanted = tuple(sorted(set(requirements)))
    prefix = packages_dir_name(wanted, guest.python_version)
    key = requirements_key(wanted, guest.python_version, RESOLUTION, component_hash)
    target = cache_dir / f"{prefix}-{key[:16]}"
    if (target / LOCK_FILE).is_file():
        return target
    cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    remove_abandoned(cache_dir, BUILD_PREFIX)
    with (
        (current_progress() or BuildProgress(NAME_PREFIX)).step("building the packages"),
        only_build_errors("building the packages"),
        tempfile.TemporaryDirectory(prefix=BUILD_PREFIX, dir=cache_dir) as staging,
    ):
        _build(wanted, guest, Path(staging), cache_dir, compile_dir)
        move_into_place(Path(staging) / "out", target, LOCK_FILE)
    prune_superseded(cache_dir, prefix, keep=target)
    return target


def _build(
    requirements: tuple[str, ...],
    guest: GuestEnvironment,
    staging: Path,
    cache_dir: Path,
    compile_dir: Callable[[Path], None],
) -> None:
    """Download (as the list's pins say, see `package_pins`), unpack and compile the
    packages into `staging/out`, the lock file last."""
    wheels, out = staging / "wheels", staging / "out"
    wheels.mkdir()
    out.mkdir()
    pins = pins_path(cache_dir, requirements, guest.python_version)
    packages = resolve(requirements, guest, wheels, pins)
    extract_wheels(wheels, packages, out / PACKAGES_DIR)
    shutil.rmtree(wheels)
    compile_dir(out / PACKAGES_DIR)
    write_lock(out / LOCK_FILE, requirements, guest.python_version, packages)
