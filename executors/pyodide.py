"""The pyodide executor: Python programs in Pyodide (CPython 3.14 on WebAssembly) under Deno.

Each execution runs in a fresh `deno run` process, exactly as on the Deno executor
(`deno.DenoExecutor`, whose warm pool, limits and nonce-marked result protocol this
reuses): no permission but the callback address and read access to Pyodide's own
files and the program contract, revoked again once they are loaded. The worker
(`shims/pyodide_worker.js`) loads Pyodide before it reports ready, so the ~2 s load is
paid by the pool, off the request path, and runs `shims/python_program.py`: the same
contract as wasm-python, plus top-level `await`. Tool calls from Python are
synchronous; they wait on the daemon's answer through JSPI (`run_sync`).

Pyodide comes from npm, pinned with integrity by `shims/pyodide/package-lock.json`,
installed once with the machine's npm into `<cache_dir>` (see `npm.install_locked`);
the executor is unavailable, with the reason, until that is done or if it fails.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import trio

from conduit.executors.base import ErrorInfo, ExecutorInfo, Job
from conduit.executors.deno import DenoExecutor
from conduit.executors.npm import install_locked, locked_version
from conduit.executors.wasm_build import BuildError, shim_path

__all__ = ["PyodideExecutor"]

log = logging.getLogger(__name__)

SHIM_DIR = "pyodide"
PACKAGE = "pyodide"
# The files Pyodide reads while it loads; nothing else of the package is needed.
PYODIDE_FILES = (
    "pyodide.mjs",
    "pyodide.asm.mjs",
    "pyodide.asm.wasm",
    "python_stdlib.zip",
    "pyodide-lock.json",
)
PROGRAM_MODULE = "python_program.py"
# Loading Pyodide takes ~2 s on an idle machine and several on a loaded one.
START_TIMEOUT_S = 60.0


class PyodideExecutor(DenoExecutor):
    """Runs Python programs in one-shot Pyodide-in-Deno sandboxes."""

    name = "pyodide"
    languages = frozenset({"python"})
    shim = "pyodide_worker.js"

    def __init__(
        self, *, cache_dir: str | Path, install_dir: str | Path | None = None, **options: Any
    ) -> None:
        """As `DenoExecutor`; Pyodide is installed under `install_dir` (`cache_dir`)."""
        options.setdefault("start_timeout_s", START_TIMEOUT_S)
        super().__init__(cache_dir=cache_dir, **options)
        self._install_dir = Path(install_dir) if install_dir is not None else Path(cache_dir)
        self._pyodide_dir: Path | None = None
        self._program = shim_path(PROGRAM_MODULE)
        self._pyodide_version = locked_version(SHIM_DIR, PACKAGE)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Install Pyodide (once), then run like the Deno executor.

        Calls `task_status.started()` at once; the executor is unavailable while
        Pyodide installs, and stays so if it cannot be installed.
        """
        self._reason = "Pyodide is being installed (seconds, on first start only)"
        task_status.started()
        try:
            installed = await trio.to_thread.run_sync(
                lambda: install_locked(
                    SHIM_DIR, self._install_dir, expect=_package_file("pyodide.mjs")
                )
            )
        except (BuildError, OSError) as exc:
            self._reason = f"Pyodide could not be installed: {exc}"
            log.warning("pyodide executor unavailable: %s", self._reason)
            await trio.sleep_forever()
        self._pyodide_dir = installed / "node_modules" / PACKAGE
        await super().serve()

    def info(self) -> ExecutorInfo:
        info = super().info()
        deno = f" on Deno {info.version}" if info.version else ""
        return dataclasses.replace(info, version=f"Pyodide {self._pyodide_version}{deno}")

    def _readable(self) -> list[str]:
        """What a worker may read while it loads (it revokes that before any program)."""
        assert self._pyodide_dir is not None
        readable = [str(self._pyodide_dir / name) for name in PYODIDE_FILES]
        readable.append(str(self._program))
        if any("," in path for path in readable):
            raise ValueError("Pyodide's path must not contain commas (Deno's flag separator)")
        return readable

    def extra_flags(self) -> list[str]:
        return [f"--allow-read={','.join(self._readable())}"]

    def shim_args(self) -> list[str]:
        return [str(self._pyodide_dir), str(self._program), *self._readable()]

    def program_fields(self, job: Job) -> dict[str, Any]:
        request = {"code": job.code, "inputs": job.inputs, "timeout_ms": job.limits.timeout_ms}
        return {"program": request}

    def is_out_of_memory(self, error: ErrorInfo) -> bool:
        return error.type == "MemoryError"


def _package_file(name: str) -> str:
    return f"node_modules/{PACKAGE}/{name}"
