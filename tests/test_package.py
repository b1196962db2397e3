"""The package's public surface and generated documents stay accurate."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tomllib
import types
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

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
    heavy = ["conduit.daemon", "pydantic", "wasmtime", "mcp", "trio"]
    probe = f"import sys, conduit.client; print([m for m in {heavy!r} if m in sys.modules])"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.strip()
    assert loaded == "[]"


def test_the_mcp_relay_loads_no_daemon() -> None:
    """`conduit mcp --connect` runs once per MCP client: it stays a relay's size."""
    heavy = [
        "conduit.daemon.server",
        "conduit.executors",
        "conduit.gateway.keeper",
        "wasmtime",
        "mcp",
    ]
    probe = (
        f"import sys, conduit.daemon.mcp_stdio; print([m for m in {heavy!r} if m in sys.modules])"
    )
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


# What only the daemon needs: a client-only install must pull none of it.
DAEMON_ONLY = {
    "trio",
    "pydantic",
    "jsonschema",
    "wasmtime",
    "componentize-py",
    "deno",
    "mcp",
    "prometheus-client",
    "pyyaml",
    "tzdata",
    "httpx",
}


def _project() -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project


def test_the_client_needs_only_ranged_requirements() -> None:
    """The base install is the client: ranges (it lives in other people's environments)
    and nothing of the daemon's; the daemon's pins are the `daemon` extra."""
    project = _project()
    base = [Requirement(line) for line in project["dependencies"]]
    assert {r.name for r in base}.isdisjoint(DAEMON_ONLY)
    assert all(r.specifier and all(s.operator != "==" for s in r.specifier) for r in base)
    daemon = {Requirement(line).name for line in project["optional-dependencies"]["daemon"]}
    assert daemon >= DAEMON_ONLY
    assert "conduit[daemon]" in project["optional-dependencies"]["test"]


def _copy_source(target: Path) -> None:
    """What a wheel is built from: the project file, the readme and every package folder."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    target.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, target / name)
    for folder in {directory.split("/")[0] for directory in setuptools["package-dir"].values()}:
        ignore = shutil.ignore_patterns("__pycache__", "node_modules")
        shutil.copytree(ROOT / folder, target / folder, ignore=ignore)


def _base_requirements(wheel: Path) -> list[Requirement]:
    """The wheel's requirements that no extra asks for."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(archive.read(name).decode())
    found = [Requirement(line) for line in metadata.get_all("Requires-Dist") or []]
    return [r for r in found if r.marker is None or r.marker.evaluate({"extra": ""})]


def _link_installed(requirements: list[Requirement], target: Path) -> None:
    """Make `requirements` (and theirs, as this interpreter's markers select) importable
    from `target` by linking this environment's copies: an install of exactly them."""
    target.mkdir(exist_ok=True)
    pending, seen = list(requirements), set()
    while pending:
        requirement = pending.pop()
        if requirement.name in seen:
            continue
        seen.add(requirement.name)
        distribution = importlib.metadata.distribution(requirement.name)
        assert distribution.version in requirement.specifier
        tops = {Path(str(f)).parts[0] for f in distribution.files or ()} - {".."}
        for top in tops:
            source = Path(str(distribution.locate_file(top)))
            if source.exists() and not (target / top).exists():
                (target / top).symlink_to(source)
        pending += [
            Requirement(line)
            for line in distribution.requires or ()
            if Requirement(line).marker is None or Requirement(line).marker.evaluate({"extra": ""})
        ]


_CLIENT_PROBE = """
import asyncio, importlib.util, sys
import conduit.client
from conduit.client import AsyncClient, Backoff, ConnectionFailed

async def connect():
    try:
        async with AsyncClient(unix_path=sys.argv[1], token="", backoff=Backoff(1)):
            return "connected"
    except ConnectionFailed as exc:
        return str(exc)

print(asyncio.run(connect()))
print(conduit.client.__file__)
heavy = ["conduit.daemon", "trio", "wasmtime", "pydantic", "mcp", "httpx", "jsonschema"]
print([name for name in heavy if name in sys.modules])
print([name for name in heavy[1:] if importlib.util.find_spec(name)])
"""


@pytest.mark.slow
def test_a_client_only_install_runs_the_client_without_the_daemons_dependencies(
    tmp_path: Path,
) -> None:
    """Build the wheel from this checkout, install it without dependencies, add exactly
    the requirements it declares for the client, and use the client under asyncio in an
    interpreter that sees nothing else."""
    _copy_source(tmp_path / "source")
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    wheels = tmp_path / "wheels"
    build = [*pip, "wheel", "--no-deps", "-w", str(wheels), str(tmp_path / "source")]
    subprocess.run(build, check=True, timeout=600)
    (wheel,) = wheels.glob("conduit-*.whl")
    requirements = _base_requirements(wheel)
    assert {r.name for r in requirements} == {"anyio"}

    site = tmp_path / "site"
    install = [*pip, "install", "--no-deps", "--target", str(site), str(wheel)]
    subprocess.run(install, check=True, timeout=300)
    _link_installed(requirements, tmp_path / "deps")
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{tmp_path / 'deps'}"}
    missing = tmp_path / "nobody.sock"
    # -S: no site-packages, so only the install and its declared requirements are seen.
    probe = [sys.executable, "-S", "-c", _CLIENT_PROBE, str(missing)]
    done = subprocess.run(
        probe, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    message, location, loaded, installed = done.stdout.splitlines()
    assert message.startswith(f"cannot reach the daemon at {missing}: ")
    assert Path(location).is_relative_to(site)
    assert (loaded, installed) == ("[]", "[]")
