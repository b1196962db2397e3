"""What a package list resolved to, kept so that rebuilding it gets the same wheels.

A build's lock lives in its hashed directory and goes with it when any build input
changes (a new Conduit, a new componentize-py). Without more, that rebuild would
resolve the list from the index again, and an unpinned requirement could silently
move. So the first resolution of a list is also written to a pins file beside the
builds, `packages-<digest>.pins.json`, keyed by the canonical list, the guest's Python
version and `packages.RESOLUTION`, outside any build directory; every later build of
that list downloads exactly those wheels, checked against their SHA-256
(`packages.download_pinned`). Deleting the file resolves the list afresh at the next
build. A changed list has another digest, so it is resolved afresh too.

It does not know how wheels are unpacked or what is built from them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from conduit.executors.package_markers import GuestEnvironment
from conduit.executors.packages import (
    RESOLUTION,
    LockedPackage,
    download,
    download_pinned,
    read_lock,
    requirements_key,
    write_lock,
)
from conduit.executors.wasm_build import BuildError

__all__ = ["pins_path", "resolve"]

log = logging.getLogger(__name__)

# Enough of the digest in a file name to tell lists apart.
PINS_KEY_CHARS = 16


def pins_path(directory: Path, requirements: Sequence[str], python_version: str) -> Path:
    """Where the pins of `requirements` for Python `python_version` are kept in
    `directory` (beside the builds)."""
    key = requirements_key(requirements, python_version, RESOLUTION)[:PINS_KEY_CHARS]
    return directory / f"packages-{key}.pins.json"


def resolve(
    requirements: Sequence[str], guest: GuestEnvironment, dest: Path, pins: Path
) -> list[LockedPackage]:
    """Download the wheels of `requirements` into `dest`: those `pins` records if it
    exists, or as `packages.download` resolves them, then recorded in `pins`.

    Raises BuildError as `download` does, or, pinned, naming the pins file to delete
    if the pinned wheels cannot be had (a wheel removed from the index, a changed hash).
    """
    if not pins.is_file():
        packages = download(requirements, guest, dest)
        _keep(pins, requirements, guest.python_version, packages)
        return packages
    pinned = read_lock(pins)
    try:
        packages = download_pinned(pinned, guest.python_version, dest)
    except BuildError as exc:
        raise BuildError(
            f"{exc}; the packages are pinned to what an earlier build resolved, in "
            f"{pins}: delete it to resolve the list afresh"
        ) from None
    log.info("packages pinned to %s: %s", pins.name, ", ".join(p.wheel for p in packages))
    return packages


def _keep(
    pins: Path, requirements: Sequence[str], python: str, packages: Sequence[LockedPackage]
) -> None:
    """Write the pins whole or not at all: a half-written file would fail every build."""
    partial = pins.with_name(f".{pins.name}.{os.getpid()}.tmp")
    write_lock(partial, requirements, python, packages)
    os.replace(partial, pins)
