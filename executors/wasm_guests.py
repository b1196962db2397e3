"""The two Wasmtime guests and how each is built (see `wasm_build` for the cache).

Both target the one WIT world in `shims/world.wit`:

- `PYTHON_GUEST`: CPython 3.14 plus `shims/wasm_python/guest.py`, built and
  pre-initialised by componentize-py (a pinned Python dependency of Conduit). The
  guest's top level, which imports the standard-library modules it lists in
  PRELOADED, runs at build time.
- `JS_GUEST`: SpiderMonkey plus `shims/wasm_js/guest.js`, built by npm's
  `@bytecodealliance/componentize-js`. Its exact version and every transitive
  dependency are pinned, with integrity hashes, by `shims/wasm_js/package-lock.json`;
  `npm install` installs them once into the cache (the machine's Node.js and npm run it;
  install scripts are off, so nothing but registry tarballs arrives). The component
  is built without the `http` and `fetch-event` features: the guest has no `fetch`.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from conduit.executors.wasm_build import BuildError, GuestRecipe, run_tool, shim_path

__all__ = ["JS_GUEST", "PYTHON_GUEST", "componentize_js_version", "preloaded_modules"]

WORLD_FILE = "world.wit"
WORLD = "guest"
# A build takes ~5 s here, the npm install ~10 s; anything past these is hung.
BUILD_TIMEOUT_S = 300
INSTALL_TIMEOUT_S = 600

# -- wasm-python ------------------------------------------------------------------------

PYTHON_SOURCE = "wasm_python/guest.py"
# The program contract every Python executor shares.
PYTHON_PROGRAM = "python_program.py"
# Runs componentize-py's console entry point with this interpreter, wherever pip put
# its script.
COMPONENTIZE_PY = (
    "import sys; from componentize_py import script; sys.argv[0] = 'componentize-py'; script()"
)


def _componentize_py_version() -> dict[str, str]:
    try:
        return {"componentize-py": importlib.metadata.version("componentize-py")}
    except importlib.metadata.PackageNotFoundError:
        raise BuildError("componentize-py is not installed; reinstall conduit") from None


def _build_python(work: Path, _cache_dir: Path) -> None:
    # No VIRTUAL_ENV: componentize-py would add its site-packages to the guest's path.
    env = {key: value for key, value in os.environ.items() if key != "VIRTUAL_ENV"}
    module = Path(PYTHON_SOURCE).stem
    command = [sys.executable, "-c", COMPONENTIZE_PY, "-q", "-d", WORLD_FILE, "-w", WORLD]
    command += ["componentize", "-p", ".", module, "-o", "guest.wasm"]
    run_tool("componentize-py", command, cwd=work, env=env, timeout_s=BUILD_TIMEOUT_S)


PYTHON_GUEST = GuestRecipe(
    name="wasm-python",
    sources=(WORLD_FILE, PYTHON_SOURCE, PYTHON_PROGRAM),
    tool_versions=_componentize_py_version,
    build=_build_python,
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

JS_SOURCE = "wasm_js/guest.js"
NPM_MANIFEST = "wasm_js/package.json"
NPM_LOCK = "wasm_js/package-lock.json"
COMPONENTIZE_JS = "@bytecodealliance/componentize-js"
COMPONENTIZE_JS_CLI = f"node_modules/{COMPONENTIZE_JS}/src/cli.js"
# Features of the JS runtime the guest is built without: no outgoing HTTP at all.
DISABLED_FEATURES = ("http", "fetch-event")
MISSING_NODE = (
    "the wasm-js component is built once with Node.js and npm, which are not on PATH "
    "(Debian: apt install nodejs npm); until then, run JavaScript with executor 'deno'"
)


def componentize_js_version() -> str:
    """The componentize-js version package-lock.json pins."""
    lock = json.loads(shim_path(NPM_LOCK).read_text(encoding="utf-8"))
    return str(lock["packages"][f"node_modules/{COMPONENTIZE_JS}"]["version"])


def _node_tools() -> tuple[str, str]:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise BuildError(MISSING_NODE)
    return node, npm


def _js_tool_versions() -> dict[str, str]:
    node, _npm = _node_tools()
    try:
        version = subprocess.run(
            [node, "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"node --version failed: {exc}") from exc
    return {"componentize-js": componentize_js_version(), "node": version}


def _installed_tools(cache_dir: Path) -> Path:
    """The directory whose node_modules holds the pinned componentize-js, installed once.

    Keyed by the lock file's hash; installed in a temporary directory renamed into
    place when the install succeeds, so a broken install is never reused.
    """
    lock = shim_path(NPM_LOCK).read_bytes()
    tools = cache_dir / f"componentize-js-{hashlib.sha256(lock).hexdigest()[:16]}"
    if (tools / COMPONENTIZE_JS_CLI).is_file():
        return tools
    _node, npm = _node_tools()
    staging = Path(tempfile.mkdtemp(prefix=".npm-", dir=cache_dir))
    try:
        shutil.copyfile(shim_path(NPM_MANIFEST), staging / "package.json")
        (staging / "package-lock.json").write_bytes(lock)
        env = dict(os.environ, npm_config_cache=str(cache_dir / "npm-cache"))
        # Not `npm ci`: it refuses this lock because some optional per-platform packages
        # that jco lists were never published. `npm install` installs exactly the
        # locked versions, integrity-checked, and skips those.
        command = [npm, "install", "--ignore-scripts", "--no-audit", "--no-fund"]
        run_tool("npm install", command, cwd=staging, env=env, timeout_s=INSTALL_TIMEOUT_S)
        try:
            os.replace(staging, tools)
        except OSError:
            if not (tools / COMPONENTIZE_JS_CLI).is_file():  # else another install won
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return tools


def _build_js(work: Path, cache_dir: Path) -> None:
    node, _npm = _node_tools()
    cli = _installed_tools(cache_dir) / COMPONENTIZE_JS_CLI
    command = [node, str(cli), Path(JS_SOURCE).name, "-w", WORLD_FILE, "-n", WORLD]
    command += ["-d", *DISABLED_FEATURES, "-o", "guest.wasm"]
    run_tool("componentize-js", command, cwd=work, timeout_s=BUILD_TIMEOUT_S)


JS_GUEST = GuestRecipe(
    name="wasm-js",
    sources=(WORLD_FILE, JS_SOURCE, NPM_LOCK),
    tool_versions=_js_tool_versions,
    build=_build_js,
)
