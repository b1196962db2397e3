"""Operator-chosen packages on Pyodide: zipped with the time zones into what every
interpreter imports from, with no permission at all, and listed with their versions;
a package with compiled code leaves the executor unavailable, saying why."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
import trio

from conduit.executors import pyodide_packages
from conduit.executors.base import Job, Limits, Status
from conduit.executors.package_markers import GuestEnvironment
from conduit.executors.packages import LockedPackage
from conduit.executors.pyodide import PyodideExecutor
from conduit.executors.pyodide_packages import ensure_packages_zip
from conduit.executors.wasm_build import ABANDONED_AFTER_S, BuildError
from tests.sandboxes import LOAD_WAIT_S, NoBridge
from tests.wheels import EVIL_WHEEL, spoilt_wheel

# Pyodide alone: no test here waits for the wasm components to be built.
pytestmark = pytest.mark.no_wasm

# A pure-Python package with a pure-Python dependency (six).
DATEUTIL = "python-dateutil==2.9.0.post0"
PROGRAM = """
import datetime, importlib.metadata
import dateutil, six
from dateutil.relativedelta import relativedelta
day = datetime.date(2024, 1, 31) + relativedelta(months=1)
[day.isoformat(), dateutil.__file__, importlib.metadata.version("six")]
"""
# The snapshot of the executor without packages, which one with packages must not prune.
PLAIN_SNAPSHOT = re.compile(r"snapshot-[0-9a-f]{16}\.bin")


def _executor(tmp_path: Path, install: Path, *packages: str) -> PyodideExecutor:
    return PyodideExecutor(
        cache_dir=tmp_path / "cache", install_dir=install, pool_size=1, packages=packages
    )


async def test_programs_import_the_packages_and_their_versions_are_listed(
    nursery: trio.Nursery, pyodide_install: Path, tmp_path: Path
) -> None:
    plain = {p.name for p in pyodide_install.iterdir() if PLAIN_SNAPSHOT.fullmatch(p.name)}
    executor = _executor(tmp_path, pyodide_install, DATEUTIL)
    await nursery.start(executor.serve)
    with trio.fail_after(LOAD_WAIT_S):
        assert await executor.wait_ready(), executor.info().reason
        outcome = await executor.run(Job("ex_pkg", "python", PROGRAM, Limits()), NoBridge())
    assert outcome.status is Status.OK, outcome
    day, where, six_version = outcome.result
    assert day == "2024-02-29"
    # Compiled at build time: imported from the zip's bytecode, not its sources.
    assert where == "/lib/site-packages.zip/dateutil/__init__.pyc"
    info = executor.info()
    assert info.packages == {"python-dateutil": "2.9.0.post0", "six": six_version}
    assert "snapshot-packages-" in info.pool["snapshot"]
    assert plain <= {p.name for p in pyodide_install.iterdir()}  # the plain one is kept


async def test_a_package_with_compiled_code_makes_the_executor_unavailable(
    nursery: trio.Nursery, pyodide_install: Path, tmp_path: Path
) -> None:
    executor = _executor(tmp_path, pyodide_install, "msgpack==1.1.0")
    await nursery.start(executor.serve)
    with trio.fail_after(LOAD_WAIT_S):
        assert not await executor.wait_ready()
    reason = executor.info().reason or ""
    assert "package msgpack==1.1.0 cannot be installed: it has no pure-Python wheel" in reason
    assert "only pure-Python wheels can run in the sandbox" in reason


async def test_a_malformed_wheel_makes_the_executor_unavailable_naming_it(
    nursery: trio.Nursery, pyodide_install: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def resolve(requirements: object, guest: object, dest: Path, pins: Path) -> list[LockedPackage]:
        return [spoilt_wheel(dest / EVIL_WHEEL, "crc")]

    monkeypatch.setattr(pyodide_packages, "resolve", resolve)
    executor = _executor(tmp_path, pyodide_install, "evil==1.0")
    await nursery.start(executor.serve)
    with trio.fail_after(LOAD_WAIT_S):
        assert not await executor.wait_ready()
    reason = executor.info().reason or ""
    assert f"wheel {EVIL_WHEEL} is malformed" in reason, reason


def _never_compile(sources: Path, compiled: Path) -> None:
    raise AssertionError("nothing resolved: nothing to compile")


def test_a_killed_builds_directory_is_removed_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build killed halfway leaves its `.packages-*` directory (up to the unpacked
    packages' limit); the next build removes it, and leaves a live build's alone."""

    def resolve(requirements: object, guest: object, dest: Path, pins: Path) -> list[LockedPackage]:
        raise BuildError("no index")

    monkeypatch.setattr(pyodide_packages, "resolve", resolve)
    abandoned, live = tmp_path / ".packages-killed", tmp_path / ".packages-live"
    for directory in (abandoned, live):
        (directory / "packages").mkdir(parents=True)
    old = time.time() - ABANDONED_AFTER_S - 60
    os.utime(abandoned, (old, old))
    guest = GuestEnvironment("3.14", "3.14.2", "emscripten", "Emscripten")
    with pytest.raises(BuildError, match="no index"):
        ensure_packages_zip(
            tmp_path, ["evil==1.0"], guest, tmp_path / "zones.zip", _never_compile, "compiler"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == [".packages-live"]
