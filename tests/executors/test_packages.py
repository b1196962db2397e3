"""Operator-chosen packages: requirements, pip's resolution, the lock, the unpacking,
and the recipes and cache keys of a guest with packages.

pip runs for real against the index (PyPI): the wheels are small, and what pip says
of a package with compiled code is what the refusal is made of.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import re
import zipfile
from pathlib import Path

import pytest
import trio
from packaging.markers import Marker
from packaging.requirements import Requirement

from conduit.core.errors import ExecutorUnavailable
from conduit.core.requirements import parse_requirement
from conduit.executors import package_pins, wasm_build, wasm_packages
from conduit.executors import packages as package_tools
from conduit.executors.base import Job, Limits, Status
from conduit.executors.caveats import MAX_LISTED_PACKAGES, installed_packages
from conduit.executors.package_markers import GuestEnvironment, missing, read_installed
from conduit.executors.package_pins import pins_path, resolve
from conduit.executors.packages import (
    LockedPackage,
    download,
    extract_wheels,
    project_names,
    read_lock,
    requirements_key,
    write_lock,
    zip_directory,
)
from conduit.executors.registry import ExecutorRegistry
from conduit.executors.wasm_build import (
    BuildError,
    build_inputs,
    only_build_errors,
    prune_superseded,
)
from conduit.executors.wasm_guests import GUEST_PYTHON, GUEST_PYTHON_VERSION, PYTHON_GUEST
from conduit.executors.wasm_packages import packages_dir_name
from conduit.executors.wasm_python import WasmPythonExecutor
from tests.daemon.fakes import FakeExecutor
from tests.sandboxes import NoBridge
from tests.wheels import EVIL_WHEEL, make_wheel, spoilt_wheel

pytestmark = pytest.mark.no_wasm

# A pure-Python package with a pure-Python dependency (six).
DATEUTIL = "python-dateutil==2.9.0.post0"
# What the sandboxes' time-zone zip holds, in part.
SANDBOX_ZONES = frozenset({"tzdata/__init__.py", "tzdata/zoneinfo/UTC"})

# Tests that run pip against PyPI: real, and out of the quick loop (`-m "not slow"`).
REACHES_PYPI = pytest.mark.slow


def test_requirements_are_canonical_and_their_key_ignores_order() -> None:
    assert parse_requirement("Tabulate == 0.9.0") == "Tabulate==0.9.0"
    assert requirements_key(["a==1", "b==2"]) == requirements_key(["b==2", "a==1", "a==1"])
    assert requirements_key(["a==1"]) != requirements_key(["a==2"])
    assert requirements_key(["a==1"], "3.14") != requirements_key(["a==1"], "3.13")


@pytest.mark.parametrize(
    "text", ["x @ file:///etc/passwd", "-e .", "--pre", "x; sys_platform == 'linux'", "x y"]
)
def test_anything_but_a_requirement_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"requirement|URL|option|marker"):
        parse_requirement(text)


def test_one_component_serves_every_package_list(tmp_path: Path) -> None:
    plain = WasmPythonExecutor(cache_dir=tmp_path)
    listed = WasmPythonExecutor(cache_dir=tmp_path, packages=("tabulate==0.9.0",))
    assert plain.recipe is listed.recipe is PYTHON_GUEST
    assert build_inputs(listed.recipe) == build_inputs(plain.recipe)


def test_a_lists_directory_is_named_by_the_list() -> None:
    name = packages_dir_name(("tabulate==0.9.0",), GUEST_PYTHON_VERSION)
    assert name.startswith("wasm-python-packages-")
    assert name == packages_dir_name(("tabulate==0.9.0", "tabulate==0.9.0"), "3.14")
    assert name != packages_dir_name(("tabulate==0.8.10",), GUEST_PYTHON_VERSION)
    assert name != packages_dir_name(("tabulate==0.9.0",), "3.13")


def test_builds_of_other_package_lists_are_not_pruned(tmp_path: Path) -> None:
    """Two daemons (or test processes) sharing one cache, with and without packages,
    keep each other's builds; only a same list's superseded build goes."""
    plain = PYTHON_GUEST.name
    listed = packages_dir_name(("tabulate==0.9.0",), GUEST_PYTHON_VERSION)
    other = packages_dir_name(("humanize==4.12.1",), GUEST_PYTHON_VERSION)
    names = [f"{plain}-{'a' * 16}", f"{listed}-{'b' * 16}", f"{listed}-{'c' * 16}"]
    names.append(f"{other}-{'d' * 16}")
    for name in names:
        (tmp_path / name).mkdir()
    prune_superseded(tmp_path, plain, keep=tmp_path / names[0])
    prune_superseded(tmp_path, listed, keep=tmp_path / names[1])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[:2] + names[3:])


@REACHES_PYPI
def test_pip_resolves_dependencies_and_the_lock_records_them(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    packages = download([DATEUTIL], GUEST_PYTHON, wheels)
    assert [p.name for p in packages] == ["python-dateutil", "six"]
    for package in packages:
        data = (wheels / package.wheel).read_bytes()
        assert package.sha256 == hashlib.sha256(data).hexdigest()
        assert package.wheel.endswith("-none-any.whl")
    write_lock(tmp_path / "lock.json", [DATEUTIL], "3.14", packages)
    assert read_lock(tmp_path / "lock.json") == tuple(packages)
    assert project_names(packages)["python-dateutil"] == "2.9.0.post0"
    site = tmp_path / "site"
    extract_wheels(wheels, packages, site)
    assert (site / "dateutil" / "relativedelta.py").is_file()
    assert (site / "six.py").is_file()
    assert (site / "python_dateutil-2.9.0.post0.dist-info" / "METADATA").is_file()


@REACHES_PYPI
def test_a_package_with_compiled_code_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(BuildError) as refused:
        download(["msgpack==1.1.0"], GUEST_PYTHON, tmp_path)
    message = str(refused.value)
    assert "package msgpack==1.1.0 cannot be installed: it has no pure-Python wheel" in message
    assert "(only compiled wheels or a source distribution)" in message
    assert "only pure-Python wheels can run in the sandbox" in message


def test_a_downloaded_platform_wheel_is_refused(tmp_path: Path) -> None:
    """Should pip hand over a compiled wheel anyway (its options overridden), it is
    still refused: every tag must be `none-any`."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "msgpack-1.1.0-cp314-cp314-manylinux_2_17_x86_64.whl").write_bytes(b"")
    with pytest.raises(BuildError, match="package msgpack has compiled code"):
        package_tools._locked(next(wheels.iterdir()))


@pytest.mark.parametrize(
    "bad", ["format", "name", "sha256", "wheel", "not json", "missing"], ids=str
)
def test_a_malformed_lock_is_refused(tmp_path: Path, bad: str) -> None:
    entry = {"name": "six", "version": "1.17.0", "sha256": "0" * 64, "wheel": "six.whl"}
    lock: object = {"format": 1, "packages": [entry]}
    if bad == "format":
        lock = {"format": 99, "packages": [entry]}
    elif bad in ("name", "sha256", "wheel"):
        entry[bad] = {"name": "../../x", "sha256": "g" * 64, "wheel": "../six.whl"}[bad]
    elif bad == "missing":
        del entry["sha256"]
    path = tmp_path / "lock.json"
    path.write_text("{" if bad == "not json" else json.dumps(lock))
    with pytest.raises(BuildError, match="package lock"):
        read_lock(path)


@pytest.mark.parametrize(
    "member", ["../evil.py", "/etc/evil.py", "pkg/../../evil.py", "pkg\\evil.py", "C:/evil.py"]
)
def test_a_member_that_could_land_outside_is_refused(tmp_path: Path, member: str) -> None:
    package = make_wheel(tmp_path / "evil-1.0-py3-none-any.whl", {member: b"x = 1"})
    with pytest.raises(BuildError, match="unsafe member"):
        extract_wheels(tmp_path, [package], tmp_path / "site")
    assert not (tmp_path / "evil.py").exists()


def test_a_link_is_refused(tmp_path: Path) -> None:
    package = make_wheel(tmp_path / "evil-1.0-py3-none-any.whl", {}, links=("evil/passwd",))
    with pytest.raises(BuildError, match="unsafe member"):
        extract_wheels(tmp_path, [package], tmp_path / "site")


def test_only_the_importable_part_of_a_wheel_is_taken(tmp_path: Path) -> None:
    members = {
        "evil/__init__.py": b"",
        "evil-1.0.data/purelib/evil_extra.py": b"",
        "evil-1.0.data/scripts/evil": b"#!/bin/sh",
        "evil-1.0.data/data/etc/evil.conf": b"",
    }
    package = make_wheel(tmp_path / "evil-1.0-py3-none-any.whl", members)
    extract_wheels(tmp_path, [package], tmp_path / "site")
    found = sorted(p.relative_to(tmp_path / "site").as_posix() for p in tmp_path.rglob("site/**/*"))
    assert found == ["evil", "evil/__init__.py", "evil_extra.py"]
    with zipfile.ZipFile(tmp_path / "site.zip", "w") as out:
        zip_directory(tmp_path / "site", out, taken=frozenset({"tzdata/zones"}))
    with zipfile.ZipFile(tmp_path / "site.zip") as out:
        assert sorted(out.namelist()) == ["evil/__init__.py", "evil_extra.py"]
    (tmp_path / "site" / "tzdata").mkdir()
    (tmp_path / "site" / "tzdata" / "zones").write_bytes(b"")
    with (
        pytest.raises(BuildError, match="the sandbox has already"),
        zipfile.ZipFile(tmp_path / "clash.zip", "w") as out,
    ):
        zip_directory(tmp_path / "site", out, taken=frozenset({"tzdata/zones"}))


def test_the_description_names_the_packages_briefly() -> None:
    assert installed_packages({}) == ""
    assert installed_packages({"sympy": "1.14.0", "mpmath": "1.3.0"}) == (
        "Besides the standard library, these packages are installed: sympy 1.14.0, mpmath 1.3.0."
    )
    many = installed_packages({f"p{i}": "1" for i in range(MAX_LISTED_PACKAGES + 5)})
    assert many.endswith(f"p{MAX_LISTED_PACKAGES - 1} 1, and 5 more.")


# -- what a malformed or hostile wheel cannot do ------------------------------------------


@pytest.mark.parametrize("how", ["crc", "method", "encrypted", "not a zip"])
def test_a_malformed_wheel_is_refused_by_name(tmp_path: Path, how: str) -> None:
    """zipfile raises BadZipFile, NotImplementedError or RuntimeError for these, which
    no executor catches: each must become a BuildError naming the wheel."""
    package = spoilt_wheel(tmp_path / EVIL_WHEEL, how)
    with pytest.raises(BuildError, match=rf"wheel {EVIL_WHEEL} is malformed"):
        extract_wheels(tmp_path, [package], tmp_path / "site")


@pytest.mark.parametrize(
    "member",
    [
        "evil/componentize-py.toml",
        "componentize-py.toml",
        "evil/_speedups.cpython-314-wasm32-wasi.so",
        "evil/libz.so.1",
        "evil/libz.so.1.2.13",
        "evil/_speedups.pyd",
        "evil/_speedups.dylib",
        "evil-1.0.data/purelib/evil/Componentize-Py.toml",
    ],
)
def test_a_build_config_or_native_library_is_refused(tmp_path: Path, member: str) -> None:
    """componentize-py searches its Python path for these, and the build that compiles
    the packages has them on it: a wheel must not steer the host's build."""
    package = make_wheel(tmp_path / EVIL_WHEEL, {"evil/__init__.py": b"", member: b""})
    with pytest.raises(BuildError, match=rf"wheel {EVIL_WHEEL} holds '{re.escape(member)}'"):
        extract_wheels(tmp_path, [package], tmp_path / "site")
    assert not any((tmp_path / "site").rglob("*.toml"))


def test_a_module_named_like_a_library_is_not(tmp_path: Path) -> None:
    members = {"evil/iso.so.py": b"", "evil/also.py": b"", "evil/sopy.py": b""}
    package = make_wheel(tmp_path / EVIL_WHEEL, members)
    extract_wheels(tmp_path, [package], tmp_path / "site")
    assert sorted(p.name for p in (tmp_path / "site" / "evil").iterdir()) == sorted(
        name.split("/")[1] for name in members
    )


def test_a_wheel_of_too_many_members_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(package_tools, "MAX_MEMBERS", 3)
    members = {f"evil/m{i}.py": b"" for i in range(5)}
    package = make_wheel(tmp_path / EVIL_WHEEL, members)
    with pytest.raises(BuildError, match=rf"wheel {EVIL_WHEEL} takes the packages past 3 members"):
        extract_wheels(tmp_path, [package], tmp_path / "site")
    assert not (tmp_path / "site" / "evil").exists()


def test_a_clash_with_the_sandbox_names_the_wheel(tmp_path: Path) -> None:
    package = make_wheel(tmp_path / EVIL_WHEEL, {"tzdata/__init__.py": b""})
    with pytest.raises(BuildError, match=rf"wheel {EVIL_WHEEL} holds tzdata/__init__.py, which"):
        extract_wheels(tmp_path, [package], tmp_path / "site", taken=SANDBOX_ZONES)


def test_anything_unexpected_in_a_build_step_becomes_a_build_error() -> None:
    with (
        pytest.raises(BuildError, match="building the packages failed: KeyError: 'x'"),
        only_build_errors("building the packages"),
    ):
        raise KeyError("x")


def _serve_a_spoilt_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wasm-python build's pip download, replaced by one that hands over a wheel
    with a bad CRC."""

    def resolve(requirements: object, guest: object, dest: Path, pins: Path) -> list[LockedPackage]:
        return [spoilt_wheel(dest / EVIL_WHEEL, "crc")]

    monkeypatch.setattr(wasm_packages, "resolve", resolve)


async def test_a_malformed_wheel_leaves_one_executor_unavailable_and_the_rest_serving(
    wasm_cache: Path, monkeypatch: pytest.MonkeyPatch, nursery: trio.Nursery
) -> None:
    _serve_a_spoilt_wheel(monkeypatch)
    python = WasmPythonExecutor(cache_dir=wasm_cache, packages=("evil==1.0",))
    other = FakeExecutor(name="deno", languages=frozenset({"javascript"}))
    registry = ExecutorRegistry([python, other], {"python": "wasm-python", "javascript": "deno"})
    await nursery.start(registry.serve)
    with trio.fail_after(60):
        await registry.wait_ready()
    reason = python.info().reason or ""
    assert f"wheel {EVIL_WHEEL} is malformed" in reason and "BadZipFile" in reason, reason
    with pytest.raises(ExecutorUnavailable, match=EVIL_WHEEL):
        registry.pick("python")
    job = Job("ex_other", "javascript", "1", Limits())
    outcome = await registry.pick("javascript").run(job, NoBridge())
    assert outcome.status is Status.OK


def _fake_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    def resolve(requirements: object, guest: object, dest: Path, pins: Path) -> list[LockedPackage]:
        return [make_wheel(dest / EVIL_WHEEL, {"evil/__init__.py": b""})]

    monkeypatch.setattr(wasm_packages, "resolve", resolve)


def _build(cache: Path, requirements: tuple[str, ...], component_hash: str = "c" * 64) -> Path:
    compiled: list[Path] = []
    built = wasm_packages.ensure_packages_dir(
        requirements, GUEST_PYTHON, component_hash, cache, compiled.append
    )
    assert len(compiled) <= 1
    return built


def test_a_packages_build_unpacks_compiles_and_moves_into_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the packages are built: no componentize-py, the staging gone, the lock
    there; the same list again is found, not built."""
    _fake_resolve(monkeypatch)
    tools: list[str] = []
    monkeypatch.setattr(wasm_build, "_run_tool", lambda what, *args, **kwargs: tools.append(what))
    seen: list[bool] = []

    def compile(packages: Path) -> None:
        seen.append((packages / "evil" / "__init__.py").is_file())

    built = wasm_packages.ensure_packages_dir(
        ("evil==1.0",), GUEST_PYTHON, "c" * 64, tmp_path, compile
    )
    assert tools == []
    assert seen == [True]  # compiled where unpacked
    assert (built / wasm_packages.PACKAGES_DIR / "evil" / "__init__.py").is_file()
    assert read_lock(built / package_tools.LOCK_FILE)
    assert [p.name for p in tmp_path.iterdir()] == [built.name]  # the staging is gone
    assert (
        wasm_packages.ensure_packages_dir(
            ("evil==1.0",), GUEST_PYTHON, "c" * 64, tmp_path, seen.append
        )
        == built
    )
    assert len(seen) == 1


def test_a_changed_list_or_component_rebuilds_only_the_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another list gets a directory of its own beside the first; a new component
    replaces the same list's directory (its bytecode was the old CPython's)."""
    _fake_resolve(monkeypatch)
    first = _build(tmp_path, ("evil==1.0",))
    other = _build(tmp_path, ("evil==1.0", "more==2.0"))
    assert first != other and first.is_dir()
    rebuilt = _build(tmp_path, ("evil==1.0",), component_hash="d" * 64)
    assert rebuilt != first
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([other.name, rebuilt.name])


def test_a_failed_packages_build_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_resolve(monkeypatch)

    def fail(packages: Path) -> None:
        raise BuildError("the guest failed a build step")

    with pytest.raises(BuildError, match="build step"):
        wasm_packages.ensure_packages_dir(("evil==1.0",), GUEST_PYTHON, "c" * 64, tmp_path, fail)
    assert list(tmp_path.iterdir()) == []


# -- what is resolved --------------------------------------------------------------------


@REACHES_PYPI
def test_dependencies_are_judged_by_the_guests_markers(tmp_path: Path) -> None:
    """webob 1.8.9 requires `legacy-cgi; python_version >= "3.13"`: pip on an older
    host leaves it out, and `import webob` fails in the 3.14 guest without it."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    packages = download(["webob==1.8.9"], GUEST_PYTHON, wheels)
    write_lock(tmp_path / "lock.json", ["webob==1.8.9"], "3.14", packages)
    assert set(project_names(read_lock(tmp_path / "lock.json"))) == {"legacy-cgi", "webob"}
    installed = read_installed(wheels, [p.wheel for p in packages])
    assert missing([Requirement("webob==1.8.9")], installed, GUEST_PYTHON) == []


def test_markers_see_the_guest_not_the_host() -> None:
    marker = Marker('python_version >= "3.13" and sys_platform == "wasi"')
    assert marker.evaluate(GUEST_PYTHON.markers())
    pyodide = GuestEnvironment("3.14", "3.14.2", "emscripten", "Emscripten")
    assert Marker('sys_platform == "emscripten"').evaluate(pyodide.markers())
    assert not Marker('extra == "speedups"').evaluate(pyodide.markers())
    assert Marker('extra == "speedups"').evaluate(pyodide.markers("speedups"))


@REACHES_PYPI
def test_tzdata_is_locked_but_the_sandboxes_own_is_kept(tmp_path: Path) -> None:
    """icalendar requires tzdata, which both sandboxes have already: its wheel is
    locked, listed with the sandbox's version, and never unpacked over theirs."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    packages = download(["icalendar==6.1.0"], GUEST_PYTHON, wheels)
    (tzdata,) = [p for p in packages if p.name == "tzdata"]
    assert tzdata.provided
    site = tmp_path / "site"
    extract_wheels(wheels, packages, site, taken=SANDBOX_ZONES)
    assert (site / "icalendar" / "__init__.py").is_file()
    assert not (site / "tzdata").exists()
    write_lock(tmp_path / "lock.json", ["icalendar==6.1.0"], "3.14", packages)
    assert read_lock(tmp_path / "lock.json") == tuple(packages)
    own = importlib.metadata.version("tzdata")
    assert project_names(packages)["tzdata"] == f"{own} (the sandbox's own)"


@REACHES_PYPI
def test_a_source_only_package_is_not_said_to_have_compiled_code(tmp_path: Path) -> None:
    """docopt 0.6.2 is pure Python, published as a source distribution only."""
    with pytest.raises(BuildError) as refused:
        download(["docopt==0.6.2"], GUEST_PYTHON, tmp_path)
    message = str(refused.value)
    assert "package docopt==0.6.2 cannot be installed: it has no pure-Python wheel" in message
    assert "(only compiled wheels or a source distribution)" in message
    assert "compiled code" not in message


# -- a rebuild gets the same wheels ------------------------------------------------------


@REACHES_PYPI
def test_a_rebuild_downloads_the_wheels_the_list_first_resolved_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unpinned requirement resolved once stays what it resolved to: a rebuild (new
    build inputs) downloads the pinned wheels, by hash, and resolves nothing."""
    pins = pins_path(tmp_path, ["six"], GUEST_PYTHON_VERSION)
    first = _resolved_into(tmp_path / "first", ["six"], pins)
    assert pins.is_file() and [p.name for p in first] == ["six"]

    def resolved_again(*args: object) -> list[LockedPackage]:
        raise AssertionError("resolved again")

    monkeypatch.setattr(package_pins, "download", resolved_again)
    assert _resolved_into(tmp_path / "again", ["six"], pins) == first
    assert pins_path(tmp_path, ["six==1.17.0"], GUEST_PYTHON_VERSION) != pins


@REACHES_PYPI
def test_a_pinned_wheel_that_changed_fails_the_build(tmp_path: Path) -> None:
    pins = pins_path(tmp_path, ["six"], GUEST_PYTHON_VERSION)
    (six,) = _resolved_into(tmp_path / "first", ["six"], pins)
    write_lock(pins, ["six"], GUEST_PYTHON_VERSION, [dataclasses.replace(six, sha256="0" * 64)])
    with pytest.raises(BuildError, match="delete it to resolve the list afresh") as refused:
        _resolved_into(tmp_path / "again", ["six"], pins)
    assert "hash" in str(refused.value).lower()


def _resolved_into(wheels: Path, requirements: list[str], pins: Path) -> list[LockedPackage]:
    wheels.mkdir()
    return resolve(requirements, GUEST_PYTHON, wheels, pins)
