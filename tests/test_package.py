"""The package's public surface and generated documents stay accurate."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types
from pathlib import Path

import pytest

from conduit.daemon.reference import render_protocol

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "name",
    [
        "conduit.client",
        "conduit.daemon",
        "conduit.executors",
        "conduit.gateway",
        "conduit.core.errors",
    ],
)
def test_all_lists_exactly_the_public_names(name: str) -> None:
    module = importlib.import_module(name)
    exported = set(module.__all__)
    assert all(hasattr(module, attribute) for attribute in exported)
    public = {
        attribute
        for attribute, value in vars(module).items()
        if not attribute.startswith("_")
        and not isinstance(value, types.ModuleType)
        and getattr(value, "__module__", name).startswith(name)
        and attribute not in {"annotations"}
    }
    assert public <= exported | {"Any", "ClassVar"}


def test_the_client_imports_none_of_the_daemons_machinery() -> None:
    """`import conduit.client` stays light: scripts and agents import it on every start."""
    heavy = ["conduit.daemon", "pydantic", "wasmtime", "mcp"]
    probe = f"import sys, conduit.client; print([m for m in {heavy!r} if m in sys.modules])"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.strip()
    assert loaded == "[]"


def test_protocol_reference_is_generated_from_the_method_table() -> None:
    committed = (ROOT / "docs" / "protocol.md").read_text()
    assert committed == render_protocol(), (
        "run: python -m conduit.daemon.reference > docs/protocol.md"
    )


def test_shims_ship_as_package_data() -> None:
    from importlib.resources import files

    assert (files("conduit.shims") / "deno_worker.js").is_file()


def test_every_shim_file_is_declared_package_data() -> None:
    """A wheel (what CI and users install) carries only what pyproject.toml declares."""
    import fnmatch
    import tomllib

    root = Path(__file__).resolve().parent.parent
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_of = {directory: name for name, directory in setuptools["package-dir"].items()}
    missing = []
    for path in sorted((root / "shims").rglob("*")):
        if path.is_dir() or "__pycache__" in path.parts:
            continue
        directory = path.parent.relative_to(root).as_posix()
        patterns = setuptools["package-data"].get(package_of.get(directory, ""), [])
        if not any(fnmatch.fnmatch(path.name, pattern) for pattern in patterns):
            missing.append(path.relative_to(root).as_posix())
    assert missing == []
