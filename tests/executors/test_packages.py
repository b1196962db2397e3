"""Operator-chosen packages: requirements, pip's resolution, the lock, the unpacking,
and the recipes and cache keys of a guest with packages.

pip runs for real against the index (PyPI): the wheels are small, and what pip says
of a package with compiled code is what the refusal is made of.
"""

from __future__ import annotations

import hashlib
import json
import stat
import zipfile
from pathlib import Path

import pytest

from conduit.executors import packages as package_tools
from conduit.executors.caveats import MAX_LISTED_PACKAGES, installed_packages
from conduit.executors.packages import (
    LockedPackage,
    download,
    extract_wheels,
    parse_requirement,
    project_names,
    read_lock,
    requirements_key,
    write_lock,
    zip_directory,
)
from conduit.executors.wasm_build import BuildError, build_inputs, prune_superseded
from conduit.executors.wasm_guests import PYTHON_GUEST, python_guest

pytestmark = pytest.mark.no_wasm

# A pure-Python package with a pure-Python dependency (six).
DATEUTIL = "python-dateutil==2.9.0.post0"


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


def test_the_plain_guest_keeps_its_recipe_and_key() -> None:
    assert python_guest(()) is PYTHON_GUEST
    packaged = python_guest(("tabulate==0.9.0",))
    assert packaged.name.startswith("wasm-python-packages-")
    assert packaged.name == python_guest(("tabulate==0.9.0", "tabulate==0.9.0")).name
    assert packaged.name != python_guest(("tabulate==0.8.10",)).name
    plain_hash, plain = build_inputs(PYTHON_GUEST)
    packaged_hash, inputs = build_inputs(packaged)
    added = {"guest_packages.py", "packages_compile.py", "packages"}
    assert inputs.keys() == plain.keys() | added
    assert {name: inputs[name] for name in plain} == plain
    assert inputs["packages"] == "tabulate==0.9.0"
    assert packaged_hash != plain_hash


def test_builds_of_other_package_lists_are_not_pruned(tmp_path: Path) -> None:
    """Two daemons (or test processes) sharing one cache, with and without packages,
    keep each other's component; only a same list's superseded build goes."""
    plain, listed = PYTHON_GUEST.name, python_guest(("tabulate==0.9.0",)).name
    other = python_guest(("humanize==4.12.1",)).name
    names = [f"{plain}-{'a' * 16}", f"{listed}-{'b' * 16}", f"{listed}-{'c' * 16}"]
    names.append(f"{other}-{'d' * 16}")
    for name in names:
        (tmp_path / name).mkdir()
    prune_superseded(tmp_path, plain, keep=tmp_path / names[0])
    prune_superseded(tmp_path, listed, keep=tmp_path / names[1])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[:2] + names[3:])


def test_pip_resolves_dependencies_and_the_lock_records_them(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    packages = download([DATEUTIL], "3.14", wheels)
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


def test_a_package_with_compiled_code_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(BuildError) as refused:
        download(["msgpack==1.1.0"], "3.14", tmp_path)
    message = str(refused.value)
    assert "package msgpack==1.1.0 cannot be installed: it has compiled code" in message
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


def _wheel(path: Path, members: dict[str, bytes], links: tuple[str, ...] = ()) -> LockedPackage:
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in members.items():
            wheel.writestr(name, data)
        for name in links:
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            wheel.writestr(info, "/etc/passwd")
    return LockedPackage("evil", "1.0", "0" * 64, path.name)


@pytest.mark.parametrize(
    "member", ["../evil.py", "/etc/evil.py", "pkg/../../evil.py", "pkg\\evil.py", "C:/evil.py"]
)
def test_a_member_that_could_land_outside_is_refused(tmp_path: Path, member: str) -> None:
    package = _wheel(tmp_path / "evil-1.0-py3-none-any.whl", {member: b"x = 1"})
    with pytest.raises(BuildError, match="unsafe member"):
        extract_wheels(tmp_path, [package], tmp_path / "site")
    assert not (tmp_path / "evil.py").exists()


def test_a_link_is_refused(tmp_path: Path) -> None:
    package = _wheel(tmp_path / "evil-1.0-py3-none-any.whl", {}, links=("evil/passwd",))
    with pytest.raises(BuildError, match="unsafe member"):
        extract_wheels(tmp_path, [package], tmp_path / "site")


def test_only_the_importable_part_of_a_wheel_is_taken(tmp_path: Path) -> None:
    members = {
        "evil/__init__.py": b"",
        "evil-1.0.data/purelib/evil_extra.py": b"",
        "evil-1.0.data/scripts/evil": b"#!/bin/sh",
        "evil-1.0.data/data/etc/evil.conf": b"",
    }
    package = _wheel(tmp_path / "evil-1.0-py3-none-any.whl", members)
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
