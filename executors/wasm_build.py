"""Building the wasm-python component from the guest sources in `shims/wasm_python/`.

`componentize-py` (pinned in pyproject.toml) turns CPython 3.14 plus `guest.py` into a
WebAssembly component and pre-initialises it: the guest's top level, which imports
the standard-library modules it lists, runs at build time. The component is cached
under `<cache_dir>/wasm-python-<hash>/guest.wasm`, where the hash covers every build
input (the guest sources, the WIT world, the componentize-py version), so changing
any of them builds a new one and an unchanged one is never built twice. A build goes
to a temporary directory that is renamed into place only when complete.

Blocking (a build takes ~5 s): call `ensure_component` in a worker thread.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.resources
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BuildError", "BuiltComponent", "build_inputs", "ensure_component", "preloaded_modules"]

# The guest's files, read from the installed package; all of them are build inputs.
GUEST_PACKAGE = "conduit.shims"
GUEST_DIR = "wasm_python"
GUEST_FILES = ("guest.py", "world.wit")
GUEST_MODULE = "guest"
WORLD = "guest"
# Building takes ~5 s here; anything past this is a hung build.
BUILD_TIMEOUT_S = 300
# How much of a failed build's output to keep for the reason.
BUILD_ERROR_CHARS = 2000
# Runs componentize-py's console entry point with this interpreter, wherever pip put
# its script.
COMPONENTIZE = (
    "import sys; from componentize_py import script; sys.argv[0] = 'componentize-py'; script()"
)


class BuildError(Exception):
    """The component could not be built; the message says why."""


@dataclass(frozen=True, slots=True)
class BuiltComponent:
    path: Path
    inputs_hash: str
    component_hash: str
    inputs: dict[str, str]
    built: bool  # False if it came from the cache
    seconds: float


def componentize_version() -> str | None:
    try:
        return importlib.metadata.version("componentize-py")
    except importlib.metadata.PackageNotFoundError:
        return None


def _guest_dir() -> Path:
    return Path(str(importlib.resources.files(GUEST_PACKAGE) / GUEST_DIR))


def preloaded_modules() -> tuple[str, ...]:
    """The standard-library modules the guest imports at build time (its PRELOADED)."""
    tree = ast.parse((_guest_dir() / "guest.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "PRELOADED" for target in node.targets
        ):
            return tuple(ast.literal_eval(node.value))
    return ()


def build_inputs() -> tuple[str, dict[str, str]]:
    """The hash of every build input, and the inputs by name (file hashes, versions)."""
    guest = _guest_dir()
    inputs: dict[str, str] = {}
    for name in GUEST_FILES:
        inputs[name] = hashlib.sha256((guest / name).read_bytes()).hexdigest()
    inputs["componentize-py"] = componentize_version() or "missing"
    digest = hashlib.sha256()
    for name, value in sorted(inputs.items()):
        digest.update(f"{name}={value}\n".encode())
    return digest.hexdigest(), inputs


def ensure_component(cache_dir: Path) -> BuiltComponent:
    """The component for the current build inputs, built into `cache_dir` if needed."""
    if componentize_version() is None:
        raise BuildError("componentize-py is not installed; reinstall conduit")
    started = time.perf_counter()
    inputs_hash, inputs = build_inputs()
    target = cache_dir / f"wasm-python-{inputs_hash[:16]}"
    wasm = target / "guest.wasm"
    built = False
    if not wasm.is_file():
        cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        _build(cache_dir, target)
        built = True
    component_hash = hashlib.sha256(wasm.read_bytes()).hexdigest()
    return BuiltComponent(
        wasm, inputs_hash, component_hash, inputs, built, time.perf_counter() - started
    )


def _build(cache_dir: Path, target: Path) -> None:
    guest = _guest_dir()
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=cache_dir))
    try:
        for name in GUEST_FILES:
            shutil.copyfile(guest / name, work / name)
        # No VIRTUAL_ENV: componentize-py would add its site-packages to the guest's path.
        env = {key: value for key, value in os.environ.items() if key != "VIRTUAL_ENV"}
        command = [
            sys.executable,
            "-c",
            COMPONENTIZE,
            "-q",
            "-d",
            str(work / "world.wit"),
            "-w",
            WORLD,
            "componentize",
            "-p",
            str(work),
            GUEST_MODULE,
            "-o",
            str(work / "guest.wasm"),
        ]
        try:
            done = subprocess.run(
                command,
                cwd=work,
                env=env,
                capture_output=True,
                timeout=BUILD_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BuildError(f"componentize-py could not build the guest: {exc}") from exc
        if done.returncode != 0 or not (work / "guest.wasm").is_file():
            output = (done.stderr or done.stdout).decode("utf-8", "replace").strip()
            raise BuildError(
                f"componentize-py failed (exit {done.returncode}): {output[-BUILD_ERROR_CHARS:]}"
            )
        final = work / "out"
        final.mkdir()
        os.replace(work / "guest.wasm", final / "guest.wasm")
        try:
            os.replace(final, target)
        except OSError:
            if not (target / "guest.wasm").is_file():  # else another build won the race
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
