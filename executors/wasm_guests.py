"""The two Wasmtime guests and how each is built (see `wasm_build` for the cache).

Both target the one WIT world in `shims/world.wit`:

- `PYTHON_GUEST`: CPython 3.14 plus `shims/wasm_python/guest.py`, built and
  pre-initialised by componentize-py (a pinned Python dependency of Conduit). The
  guest's top level, which imports the standard-library modules it lists in
  PRELOADED, runs at build time. The operator's pure-Python packages are no part of
  it: they are files mounted beside it (see `wasm_packages`).
- `JS_GUEST`: SpiderMonkey plus `shims/wasm_js/guest.js`, built by npm's
  `@bytecodealliance/componentize-js`. Its exact version and every transitive
  dependency are pinned, with integrity hashes, by `shims/wasm_js/package-lock.json`;
  `npm install` installs them into the build directory (the machine's Node.js and npm
  run it; install scripts are off, so nothing but registry tarballs arrives), deleted
  with it: ~400 MB that nothing needs once the component exists. The component is
  built without the `http` and `fetch-event` features: the guest has no `fetch`.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.resources
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conduit.executors.npm import install_locked, locked_version, node_tools
from conduit.executors.package_markers import GuestEnvironment
from conduit.executors.wasm_build import (
    BuildError,
    GuestRecipe,
    run_tool,
    shim_path,
)

__all__ = [
    "GUEST_PACKAGES",
    "GUEST_PYTHON",
    "JS_GUEST",
    "PACKAGES_DIR",
    "PYTHON_GUEST",
    "STDLIB_DIR",
    "componentize_js_version",
    "preloaded_modules",
]

WORLD_FILE = "world.wit"
WORLD = "guest"
# A build takes ~5 s here; anything past this is hung.
BUILD_TIMEOUT_S = 300

# -- wasm-python ------------------------------------------------------------------------

PYTHON_SOURCE = "wasm_python/guest.py"
# Copies the standard library out of the build (see its docstring), into STDLIB_DIR.
PYTHON_STDLIB_EXPORT = "wasm_python/stdlib_export.py"
# asyncio's event loop without the socket pair WASI cannot make.
PYTHON_ASYNCIO = "wasm_python/guest_asyncio.py"
STDLIB_DIR = "stdlib"
# The directory packages' files are unpacked into, and the Python they are for.
PACKAGES_DIR = "packages"
GUEST_PYTHON_VERSION = "3.14"
# The guest's interpreter as dependencies' environment markers see it (what its `sys`
# and `platform` say: CPython 3.14.0, built with wasi-sdk).
GUEST_PYTHON = GuestEnvironment(
    python_version=GUEST_PYTHON_VERSION,
    python_full_version="3.14.0",
    sys_platform="wasi",
    platform_system="wasi",
    platform_release="0.0.0",
)
# Where the guest sees the packages (shims/wasm_python/guest.py).
GUEST_PACKAGES = "/packages"
# The IANA time-zone package (a pinned dependency), copied into the guest's library.
TIME_ZONES = "tzdata"
_NOT_DATA = shutil.ignore_patterns("__pycache__")
# The program contract every Python executor shares.
PYTHON_PROGRAM = "python_program.py"
# Runs componentize-py's console entry point with this interpreter, wherever pip put
# its script.
COMPONENTIZE_PY = (
    "import sys; from componentize_py import script; sys.argv[0] = 'componentize-py'; script()"
)


def _python_tool_versions() -> dict[str, str]:
    versions = {}
    for package in ("componentize-py", TIME_ZONES):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            raise BuildError(f"{package} is not installed; reinstall conduit") from None
    return versions


def _build_python(work: Path, _cache_dir: Path) -> None:
    _componentize_python(work, Path(PYTHON_SOURCE).stem)
    _add_time_zones(work)


def _componentize_python(work: Path, module: str) -> None:
    # No VIRTUAL_ENV: componentize-py would add its site-packages to the guest's path.
    env = {key: value for key, value in os.environ.items() if key != "VIRTUAL_ENV"}
    command = [sys.executable, "-c", COMPONENTIZE_PY, "-q", "-d", WORLD_FILE, "-w", WORLD]
    command += ["componentize", "-p", ".", module, "-o", "guest.wasm"]
    run_tool("componentize-py", command, cwd=work, env=env, timeout_s=BUILD_TIMEOUT_S)


def _add_time_zones(work: Path) -> None:
    # The time-zone database `zoneinfo` falls back on: the guest has no /usr/share.
    zones = importlib.resources.files(TIME_ZONES)
    with importlib.resources.as_file(zones) as source:
        shutil.copytree(source, work / STDLIB_DIR / TIME_ZONES, ignore=_NOT_DATA)


PYTHON_GUEST = GuestRecipe(
    name="wasm-python",
    sources=(WORLD_FILE, PYTHON_SOURCE, PYTHON_PROGRAM, PYTHON_STDLIB_EXPORT, PYTHON_ASYNCIO),
    tool_versions=_python_tool_versions,
    build=_build_python,
    outputs=(STDLIB_DIR,),
)


def preloaded_modules() -> tuple[str, ...]:
    """The standard-library modules the Python guest imports at build time (PRELOADED)."""
    tree = ast.parse(shim_path(PYTHON_SOURCE).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "PRELOADED" for target in node.targets
        ):
            return tuple(ast.literal_eval(node.value))
    return ()


# -- wasm-js ----------------------------------------------------------------------------

JS_DIR = "wasm_js"
JS_SOURCE = f"{JS_DIR}/guest.js"
# The tools SDK the Deno worker shares; imported by the guest as ./sandbox_sdk.js.
JS_SDK = "sandbox_sdk.js"
# The programs' `fs`, served by the host on the working directory; imported as ./fs.js.
JS_FS = f"{JS_DIR}/fs.js"
# The programs' console, written as Deno's writes; imported as ./console.js.
JS_CONSOLE = f"{JS_DIR}/console.js"
# The programs' timers, fired in the order they fall due; imported as ./timers.js.
JS_TIMERS = f"{JS_DIR}/timers.js"
NPM_LOCK = f"{JS_DIR}/package-lock.json"
COMPONENTIZE_JS = "@bytecodealliance/componentize-js"
COMPONENTIZE_JS_CLI = f"node_modules/{COMPONENTIZE_JS}/src/cli.js"
# Features of the JS runtime the guest is built without: no outgoing HTTP at all.
DISABLED_FEATURES = ("http", "fetch-event")
# What earlier versions kept in the cache directory for this build: componentize-js's
# install and npm's cache (~500 MB), deleted once the component exists.
JS_LEFTOVERS = ("wasm-js-npm-*", "npm-cache")
MISSING_NODE = (
    "the wasm-js component is built once with Node.js and npm, which are not on PATH "
    "(Debian: apt install nodejs npm); until then, run JavaScript with executor 'deno'"
)


def componentize_js_version() -> str:
    """The componentize-js version package-lock.json pins."""
    return locked_version(JS_DIR, COMPONENTIZE_JS)


def _js_tool_versions() -> dict[str, str]:
    node, _npm = _node_tools()
    try:
        version = subprocess.run(
            [node, "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"node --version failed: {exc}") from exc
    return {"componentize-js": componentize_js_version(), "node": version}


def _node_tools() -> tuple[str, str]:
    try:
        return node_tools()
    except BuildError:
        raise BuildError(MISSING_NODE) from None


def _build_js(work: Path, _cache_dir: Path) -> None:
    node, _npm = _node_tools()
    cli = install_locked(JS_DIR, work, expect=COMPONENTIZE_JS_CLI) / COMPONENTIZE_JS_CLI
    command = [node, str(cli), Path(JS_SOURCE).name, "-w", WORLD_FILE, "-n", WORLD]
    command += ["-d", *DISABLED_FEATURES, "-o", "guest.wasm"]
    run_tool("componentize-js", command, cwd=work, timeout_s=BUILD_TIMEOUT_S)


JS_GUEST = GuestRecipe(
    name="wasm-js",
    sources=(WORLD_FILE, JS_SOURCE, JS_SDK, JS_FS, JS_CONSOLE, JS_TIMERS, NPM_LOCK),
    tool_versions=_js_tool_versions,
    build=_build_js,
    leftovers=JS_LEFTOVERS,
)
