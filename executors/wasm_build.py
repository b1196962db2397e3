"""Building a Wasmtime guest component from its sources in `shims/`, cached by content.

A `GuestRecipe` names a guest's source files (read from the installed package) and
knows how to turn them into a pre-initialised component with its pinned build tool
(see `wasm_guests`). `ensure_component` builds it into
`<cache_dir>/<recipe>-<hash>/guest.wasm`, where the hash covers every build input
(the sources and the tools' versions), so changing any of them builds a new component
and an unchanged one is never built twice; a new build deletes those it supersedes.
A build runs in a temporary directory that is renamed into place only when complete:
a crash mid-build leaves no half component.

Blocking (a build takes seconds): call `ensure_component` in a worker thread.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BuildError",
    "BuiltComponent",
    "GuestRecipe",
    "ensure_component",
    "move_into_place",
    "prune_superseded",
    "run_tool",
    "shim_path",
]

SHIMS_PACKAGE = "conduit.shims"
COMPONENT_FILE = "guest.wasm"
# How much of a failed build's output to keep for the reason.
BUILD_ERROR_CHARS = 2000


class BuildError(Exception):
    """The component could not be built; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class GuestRecipe:
    """How one guest component is made.

    `sources` are paths under `shims/`, copied flat into the build directory.
    `tool_versions` returns the build tools' versions (build inputs too), raising
    `BuildError` when a tool is missing. `build(work, cache_dir)` runs the tools in
    `work` and leaves `work/guest.wasm`, and each of `outputs` (files or directories
    the guest needs at run time, kept beside it); it may keep reusable tooling in
    `cache_dir`.
    """

    name: str
    sources: tuple[str, ...]
    tool_versions: Callable[[], dict[str, str]]
    build: Callable[[Path, Path], None]
    outputs: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BuiltComponent:
    path: Path
    inputs_hash: str
    component_hash: str
    inputs: dict[str, str]
    built: bool  # False if it came from the cache
    seconds: float


def shim_path(relative: str) -> Path:
    """A file of the installed `shims/` package."""
    return Path(str(importlib.resources.files(SHIMS_PACKAGE) / relative))


def build_inputs(recipe: GuestRecipe) -> tuple[str, dict[str, str]]:
    """The hash of every build input, and the inputs by name (file hashes, versions)."""
    inputs = {
        Path(source).name: hashlib.sha256(shim_path(source).read_bytes()).hexdigest()
        for source in recipe.sources
    }
    inputs.update(recipe.tool_versions())
    digest = hashlib.sha256()
    for name, value in sorted(inputs.items()):
        digest.update(f"{name}={value}\n".encode())
    return digest.hexdigest(), inputs


def ensure_component(recipe: GuestRecipe, cache_dir: Path) -> BuiltComponent:
    """The component for the recipe's current inputs, built into `cache_dir` if needed."""
    started = time.perf_counter()
    inputs_hash, inputs = build_inputs(recipe)
    target = cache_dir / f"{recipe.name}-{inputs_hash[:16]}"
    wasm = target / COMPONENT_FILE
    built = False
    if not wasm.is_file():
        cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        _build(recipe, cache_dir, target)
        prune_superseded(cache_dir, recipe.name, keep=target)
        built = True
    component_hash = hashlib.sha256(wasm.read_bytes()).hexdigest()
    return BuiltComponent(
        wasm, inputs_hash, component_hash, inputs, built, time.perf_counter() - started
    )


def _build(recipe: GuestRecipe, cache_dir: Path, target: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=cache_dir))
    try:
        for source in recipe.sources:
            shutil.copyfile(shim_path(source), work / Path(source).name)
        recipe.build(work, cache_dir)
        if not (work / COMPONENT_FILE).is_file():
            raise BuildError(f"building {recipe.name} produced no component")
        final = work / "out"
        final.mkdir()
        for output in recipe.outputs:
            if not (work / output).exists():
                raise BuildError(f"building {recipe.name} produced no {output}")
            os.replace(work / output, final / output)
        os.replace(work / COMPONENT_FILE, final / COMPONENT_FILE)
        move_into_place(final, target, COMPONENT_FILE)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def prune_superseded(cache_dir: Path, prefix: str, *, keep: Path) -> None:
    """Delete the `<prefix>-<16 hex>` directories in `cache_dir` other than `keep`:
    builds for inputs that changed (an upgrade), which nothing will load again."""
    pattern = re.compile(rf"{re.escape(prefix)}-[0-9a-f]{{16}}")
    for old in cache_dir.iterdir():
        if old != keep and old.is_dir() and pattern.fullmatch(old.name):
            shutil.rmtree(old, ignore_errors=True)


def move_into_place(staging: Path, target: Path, marker: str) -> None:
    """Rename a finished `staging` directory to `target`, atomically.

    If `target` exists already, another build finished first: fine when it holds
    `marker`, an error otherwise.
    """
    try:
        os.replace(staging, target)
    except OSError:
        if not (target / marker).exists():
            raise


def run_tool(
    what: str,
    command: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    timeout_s: float,
) -> None:
    """Run one build step; a `BuildError` with the tail of its output if it fails."""
    try:
        done = subprocess.run(
            list(command),
            cwd=cwd,
            env=dict(env) if env is not None else None,
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"{what} could not run: {exc}") from exc
    if done.returncode != 0:
        output = (done.stderr or done.stdout).decode("utf-8", "replace").strip()
        raise BuildError(f"{what} failed (exit {done.returncode}): {output[-BUILD_ERROR_CHARS:]}")
