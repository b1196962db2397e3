"""Installing a pinned set of npm packages once, from a lock file in `shims/`.

Some executors need packages from the npm registry (componentize-js to build the
wasm-js guest, Pyodide to run Python under Deno). Each set is a `package.json` and a
`package-lock.json` in a directory of `shims/`; the lock pins every version with its
integrity hash. `install_locked` installs a set with the machine's npm into
`<cache_dir>/<name>-<lock hash>/node_modules`, once: in a temporary directory renamed
into place only when the install succeeded, with install scripts off (so nothing but
registry tarballs arrives). npm's cache lives in that temporary directory and is
deleted with it (a reinstall after an upgrade downloads again): it would double what
the install keeps, and nothing reads it once the install is done.

Blocking (an install takes seconds): call it in a worker thread.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from contextlib import nullcontext
from pathlib import Path

from conduit.executors.wasm_build import (
    BuildError,
    BuildProgress,
    current_progress,
    move_into_place,
    prune_superseded,
    remove_abandoned,
    run_tool,
    shim_path,
)

__all__ = ["install_lock_dir", "install_locked", "locked_version", "node_tools"]

# An install takes ~10 s here; anything past this is hung.
INSTALL_TIMEOUT_S = 600
MISSING_NODE = "Node.js and npm are not on PATH (Debian: apt install nodejs npm)"
# Prefix of an install's temporary directory in the cache directory.
STAGING_PREFIX = ".npm-"
# npm's cache, inside the temporary directory: removed before the install is kept.
NPM_CACHE = ".npm-cache"
# Where earlier versions kept npm's cache, in the cache directory: deleted on sight.
OLD_NPM_CACHE = "npm-cache"


def node_tools() -> tuple[str, str]:
    """The machine's `node` and `npm`; BuildError if either is missing."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise BuildError(MISSING_NODE)
    return node, npm


def locked_version(shim_dir: str, package: str) -> str:
    """The version of `package` that `shims/<shim_dir>/package-lock.json` pins."""
    lock = json.loads(shim_path(f"{shim_dir}/package-lock.json").read_text(encoding="utf-8"))
    return str(lock["packages"][f"node_modules/{package}"]["version"])


def install_locked(
    shim_dir: str, cache_dir: Path, *, expect: str, progress: BuildProgress | None = None
) -> Path:
    """The directory holding `node_modules` for the set in `shims/<shim_dir>`.

    `expect` is a path under that directory whose presence means a complete install.
    The install is logged and recorded as a step in `progress` if given, else in the
    build's it is part of (see `wasm_build.BuildProgress`).
    """
    return install_lock_dir(shim_path(shim_dir), cache_dir, expect=expect, progress=progress)


def install_lock_dir(
    source: Path, cache_dir: Path, *, expect: str, progress: BuildProgress | None = None
) -> Path:
    """`install_locked` for a set kept in any directory `source` (tests keep their own)."""
    lock = (source / "package-lock.json").read_bytes()
    name = source.name.replace("_", "-")
    target = cache_dir / f"{name}-npm-{hashlib.sha256(lock).hexdigest()[:16]}"
    shutil.rmtree(cache_dir / OLD_NPM_CACHE, ignore_errors=True)
    if (target / expect).exists():
        return target
    _node, npm = node_tools()
    cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    remove_abandoned(cache_dir, STAGING_PREFIX)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=cache_dir))
    try:
        shutil.copyfile(source / "package.json", staging / "package.json")
        (staging / "package-lock.json").write_bytes(lock)
        env = dict(os.environ, npm_config_cache=str(staging / NPM_CACHE))
        # Not `npm ci`: it refuses a lock that omits optional per-platform packages
        # never published (jco lists some). `npm install` installs exactly the locked
        # versions, integrity-checked, and skips those.
        command = [npm, "install", "--ignore-scripts", "--no-audit", "--no-fund"]
        if progress is None and current_progress() is None:
            progress = BuildProgress(name)  # for the log's sake: nothing shows it
        with progress.active() if progress is not None else nullcontext():
            run_tool(
                f"npm install ({name})", command, cwd=staging, env=env, timeout_s=INSTALL_TIMEOUT_S
            )
        if not (staging / expect).exists():
            raise BuildError(f"npm install in {source} did not install {expect}")
        shutil.rmtree(staging / NPM_CACHE, ignore_errors=True)
        move_into_place(staging, target, expect)
        prune_superseded(cache_dir, f"{name}-npm", keep=target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
