"""The pyodide executor: Python programs in Pyodide (CPython 3.14 on WebAssembly) under Deno.

Each execution runs in a fresh `deno run` process, exactly as on the Deno executor
(`deno.DenoExecutor`, whose warm pool, limits and nonce-marked result protocol this
reuses): no permission but the callback address and read access to Pyodide's own
files and the program contract. Read access to those files is revoked once they are
loaded; the callback address is used once, to connect as the worker warms up, and
every permission is revoked before it reports ready (see `deno` for why). The worker
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
import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import trio

from conduit.executors.base import ErrorInfo, ExecutorInfo, Job, python_request
from conduit.executors.deno import DENO_ENV, SANDBOX_FLAGS, DenoExecutor
from conduit.executors.npm import install_locked, locked_version
from conduit.executors.process import kill_process_group, minimal_env, sandbox_process_options
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
BOOT_SCRIPT = "pyodide_boot.js"
SNAPSHOT_SCRIPT = "pyodide_snapshot.js"
# Building the snapshot loads Pyodide once (seconds); past this it is hung.
SNAPSHOT_TIMEOUT_S = 180
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
        self._snapshot: Path | None = None
        self._boot_scripts = tuple(shim_path(name) for name in (BOOT_SCRIPT, SNAPSHOT_SCRIPT))

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
            self._settled.set()
            await trio.sleep_forever()
        self._pyodide_dir = installed / "node_modules" / PACKAGE
        self._snapshot = await self._ensure_snapshot()
        await super().serve()

    async def _ensure_snapshot(self) -> Path | None:
        """A memory snapshot of a loaded worker, built once; None to load cold.

        Restoring one takes ~0.2 s against ~2 s for a cold load, which is what a pool
        refill costs. Built by a trusted Deno process that may write only the new file;
        keyed by everything it holds (Pyodide, the contract, the boot script).
        """
        deno = self._deno
        if deno is None:
            return None  # the Deno executor's own start-up says why
        digest = hashlib.sha256()
        for part in (
            shim_path(f"{SHIM_DIR}/package-lock.json"),
            self._program,
            *self._boot_scripts,
        ):
            digest.update(part.read_bytes())
        target = self._install_dir / f"snapshot-{digest.hexdigest()[:16]}.bin"
        if target.is_file():
            return target
        partial_file = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        command = [
            deno,
            "run",
            *SANDBOX_FLAGS,
            f"--allow-read={','.join(self._readable(snapshot=None))}",
            f"--allow-write={partial_file}",
            str(shim_path(SNAPSHOT_SCRIPT)),
            str(self._pyodide_dir),
            str(self._program),
            str(partial_file),
        ]
        started = trio.current_time()
        try:
            with trio.fail_after(SNAPSHOT_TIMEOUT_S):
                done = await trio.run_process(
                    command,
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                    deliver_cancel=kill_process_group,
                    **sandbox_process_options(cwd=self._install_dir, env=minimal_env(DENO_ENV)),
                )
            if done.returncode != 0:
                raise OSError(done.stderr.decode("utf-8", "replace").strip()[-500:])
            os.replace(partial_file, target)
            for superseded in self._install_dir.glob("snapshot-*.bin"):
                if superseded != target:
                    superseded.unlink(missing_ok=True)
        except (OSError, trio.TooSlowError) as exc:
            partial_file.unlink(missing_ok=True)
            log.warning("no Pyodide snapshot (workers load cold, ~2 s each): %s", exc)
            return None
        log.info("Pyodide snapshot built in %.1f s", trio.current_time() - started)
        return target

    def info(self) -> ExecutorInfo:
        info = super().info()
        deno = f" on Deno {info.version}" if info.version else ""
        pool = dict(info.pool or {}, snapshot=str(self._snapshot) if self._snapshot else None)
        version = f"Pyodide {self._pyodide_version}{deno}"
        return dataclasses.replace(info, version=version, pool=pool)

    def _readable(self, snapshot: Path | None) -> list[str]:
        """What a worker may read while it loads (it revokes that before any program)."""
        assert self._pyodide_dir is not None
        readable = [str(self._pyodide_dir / name) for name in PYODIDE_FILES]
        readable.append(str(self._program))
        if snapshot is not None:
            readable.append(str(snapshot))
        if any("," in path for path in readable):
            raise ValueError("Pyodide's path must not contain commas (Deno's flag separator)")
        return readable

    def extra_flags(self) -> list[str]:
        return [f"--allow-read={','.join(self._readable(self._snapshot))}"]

    def shim_args(self) -> list[str]:
        snapshot = str(self._snapshot) if self._snapshot is not None else ""
        return [
            str(self._pyodide_dir),
            str(self._program),
            snapshot,
            *self._readable(self._snapshot),
        ]

    def program_fields(self, job: Job) -> dict[str, Any]:
        return {"program": python_request(job)}

    def is_out_of_memory(self, error: ErrorInfo) -> bool:
        return error.type == "MemoryError"


def _package_file(name: str) -> str:
    return f"node_modules/{PACKAGE}/{name}"
