"""Building a Wasmtime guest component from its sources in `shims/`, cached by content.

A `GuestRecipe` names a guest's source files (read from the installed package) and
knows how to turn them into a pre-initialised component with its pinned build tool
(see `wasm_guests`). `ensure_component` builds it into
`<cache_dir>/<recipe>-<hash>/guest.wasm`, where the hash covers every build input
(the sources and the tools' versions), so changing any of them builds a new component
and an unchanged one is never built twice; a new build deletes those it supersedes.
A build runs in a temporary directory that is renamed into place only when complete:
a crash mid-build leaves no half component. Nothing but the component is kept: a
build's tooling (an npm install) lives in its temporary directory and goes with it,
and what a crashed build or an earlier version left behind is deleted.

A first start takes a minute, so each step says what it is doing: every tool a build
runs (`run_tool`) is logged as it starts and ends, with its elapsed time, and recorded
in the `BuildProgress` the build was given, which an executor shows in its `info()`.

Blocking (a build takes seconds): call `ensure_component` in a worker thread.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import importlib.resources
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conduit.executors.file_digest import sha256_hex

__all__ = [
    "BuildError",
    "BuildProgress",
    "BuiltComponent",
    "GuestRecipe",
    "current_progress",
    "ensure_component",
    "move_into_place",
    "only_build_errors",
    "prune_superseded",
    "remove_abandoned",
    "run_tool",
    "shim_path",
]

SHIMS_PACKAGE = "conduit.shims"
COMPONENT_FILE = "guest.wasm"
# How much of a failed build's output to keep for the reason.
BUILD_ERROR_CHARS = 2000
# Prefix of a build's temporary directory in the cache directory.
BUILD_PREFIX = ".build-"
# A temporary directory untouched for this long belongs to a build that crashed: every
# step of a live one (an npm install, a componentize run) ends within 10 minutes.
ABANDONED_AFTER_S = 3600

log = logging.getLogger(__name__)


class BuildError(Exception):
    """The component could not be built; the message says why and what to do."""


@contextlib.contextmanager
def only_build_errors(what: str) -> Iterator[None]:
    """Let nothing but BuildError out of the block: anything else (a bug, or an input
    no check foresaw) is logged with its traceback and raised as a BuildError saying
    `what` failed and how. Executors catch BuildError: one is then unavailable, with
    the reason, rather than the daemon down."""
    try:
        yield
    except BuildError:
        raise
    except Exception as exc:
        log.exception("%s failed unexpectedly", what)
        raise BuildError(f"{what} failed: {type(exc).__name__}: {exc}") from exc


class BuildProgress:
    """What one executor's first start is doing: the step under way and those done.

    `step` times a step and logs its start and end; `snapshot` is what `info()` shows.
    Steps run in a worker thread and `snapshot` is read on the Trio thread: each update
    replaces one attribute with an immutable value, so a reader never sees half of one.
    """

    __slots__ = ("_current", "_done", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._current: tuple[str, float, float] | None = None  # step, Unix and monotonic
        self._done: tuple[tuple[str, float, bool], ...] = ()  # step, seconds, whether ok

    def __repr__(self) -> str:
        current = self._current[0] if self._current else "idle"
        return f"<BuildProgress {self.name}: {current}, {len(self._done)} steps done>"

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[None]:
        """Time the block as the step `what`, logged at its start and its end."""
        started = time.monotonic()
        self._current = (what, time.time(), started)
        fields: dict[str, Any] = {"executor": self.name, "step": what}
        log.info("%s: %s started", self.name, what, extra=fields)
        ok = False
        try:
            yield
            ok = True
        finally:
            elapsed_s = round(time.monotonic() - started, 1)
            self._done = (*self._done, (what, elapsed_s, ok))
            self._current = None
            fields |= {"elapsed_s": elapsed_s, "ok": ok}
            outcome = "done" if ok else "failed"
            log.info("%s: %s %s in %.1f s", self.name, what, outcome, elapsed_s, extra=fields)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Make this the record `run_tool` reports to, in this thread, for the block."""
        token = _ACTIVE.set(self)
        try:
            yield
        finally:
            _ACTIVE.reset(token)

    def snapshot(self) -> dict[str, Any] | None:
        """The step under way (None between steps), since when (Unix time) and for how
        long, and each step done with its seconds and whether it succeeded; None if no
        step has run."""
        current, done = self._current, self._done
        if current is None and not done:
            return None
        return {
            "step": current[0] if current else None,
            "started_at": round(current[1], 3) if current else None,
            "elapsed_s": round(time.monotonic() - current[2], 1) if current else None,
            "done": [{"step": what, "elapsed_s": s, "ok": ok} for what, s, ok in done],
        }


# The record of the build running in this thread: `run_tool` reports each tool to it,
# so a recipe's `build` needs no parameter for it.
_ACTIVE: contextvars.ContextVar[BuildProgress | None] = contextvars.ContextVar(
    "conduit_build_progress", default=None
)


def current_progress() -> BuildProgress | None:
    """The record of the build running in this thread, if any (`BuildProgress.active`)."""
    return _ACTIVE.get()


@dataclass(frozen=True, slots=True)
class GuestRecipe:
    """How one guest component is made.

    `sources` are paths under `shims/`, copied flat into the build directory.
    `tool_versions` returns the build tools' versions (build inputs too), raising
    `BuildError` when a tool is missing. `build(work, cache_dir)` runs the tools in
    `work` and leaves `work/guest.wasm`, and each of `outputs` (files or directories
    the guest needs at run time, kept beside it); tooling it installs belongs in
    `work`, deleted after the build. `leftovers` are glob patterns, in `cache_dir`, of
    tooling earlier versions kept there: deleted once the component exists.
    """

    name: str
    sources: tuple[str, ...]
    tool_versions: Callable[[], dict[str, str]]
    build: Callable[[Path, Path], None]
    outputs: tuple[str, ...] = ()
    leftovers: tuple[str, ...] = ()


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


def ensure_component(
    recipe: GuestRecipe, cache_dir: Path, progress: BuildProgress | None = None
) -> BuiltComponent:
    """The component for the recipe's current inputs, built into `cache_dir` if needed.

    Each step of a build is logged and recorded in `progress` (see `BuildProgress`).
    """
    started = time.perf_counter()
    inputs_hash, inputs = build_inputs(recipe)
    target = cache_dir / f"{recipe.name}-{inputs_hash[:16]}"
    wasm = target / COMPONENT_FILE
    built = False
    if not wasm.is_file():
        cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        remove_abandoned(cache_dir, BUILD_PREFIX)
        with (progress or BuildProgress(recipe.name)).active():
            _build(recipe, cache_dir, target)
        prune_superseded(cache_dir, recipe.name, keep=target)
        built = True
    _remove_leftovers(cache_dir, recipe.leftovers)
    component_hash = sha256_hex(wasm)
    return BuiltComponent(
        wasm, inputs_hash, component_hash, inputs, built, time.perf_counter() - started
    )


def _build(recipe: GuestRecipe, cache_dir: Path, target: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix=BUILD_PREFIX, dir=cache_dir))
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


def remove_abandoned(cache_dir: Path, prefix: str) -> None:
    """Delete the temporary directories named `<prefix>…` in `cache_dir` that no build
    has touched for ABANDONED_AFTER_S: a crash's, which nothing else would remove
    (one of another live build, in another process, is left alone)."""
    now = time.time()
    for path in cache_dir.iterdir():
        if not path.name.startswith(prefix):
            continue
        with contextlib.suppress(OSError):
            if path.is_dir() and now - path.stat().st_mtime > ABANDONED_AFTER_S:
                shutil.rmtree(path, ignore_errors=True)


def _remove_leftovers(cache_dir: Path, patterns: Sequence[str]) -> None:
    """Delete what matches `patterns` in `cache_dir`, as far as it can: a leftover that
    cannot be deleted only takes space, so it must not keep the component from loading."""
    for pattern in patterns:
        for path in cache_dir.glob(pattern):
            log.info("deleting %s, which an earlier version kept for builds", path)
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()


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
    """Run one build step; a `BuildError` with the tail of its output if it fails.

    The step is logged and recorded in the active build's progress (`what` names it).
    """
    with (current_progress() or BuildProgress("build")).step(what):
        _run_tool(what, command, cwd=cwd, env=env, timeout_s=timeout_s)


def _run_tool(
    what: str,
    command: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str] | None,
    timeout_s: float,
) -> None:
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
