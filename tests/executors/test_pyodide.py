"""The pyodide executor with real Deno and real Pyodide: the Python contract, limits,
and containment tried from inside Python.

Slow (each worker loads Pyodide, ~2-3 s of CPU), so each test batches its checks.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.executors.base import Job, Limits, Outcome, Status
from conduit.executors.pyodide import PyodideExecutor
from tests.sandboxes import LOAD_WAIT_S, NoBridge, start_pyodide

pytestmark = pytest.mark.slow


@pytest.fixture
async def pyodide(nursery: trio.Nursery, tmp_path: Path, pyodide_install: Path) -> PyodideExecutor:
    return await start_pyodide(nursery, tmp_path, pyodide_install)


async def run(executor: PyodideExecutor, code: str, inputs: Any = None, **limits: Any) -> Outcome:
    with trio.fail_after(LOAD_WAIT_S):
        job = Job("ex_pyodide", "python", code, Limits(**limits), inputs=inputs)
        return await executor.run(job, NoBridge())


async def test_the_python_contract_holds(pyodide: PyodideExecutor) -> None:
    info = pyodide.info()
    assert info.version is not None and info.version.startswith("Pyodide 314")
    assert info.pool is not None and info.pool["snapshot"], info  # workers restore, not load
    code = "import sys\nprint('hi', inputs['n'])\nprint('e', file=sys.stderr)\ninputs['n'] * 2"
    done = await run(pyodide, code, inputs={"n": 21})
    assert (done.status, done.result, done.stdout, done.stderr) == (Status.OK, 42, "hi 21\n", "e\n")
    awaited = await run(pyodide, "import asyncio\nawait asyncio.sleep(0.01)\nreturn {1, 2}")
    assert (awaited.status, awaited.result) == (Status.OK, "{1, 2}")
    failed = await run(pyodide, "def f(x):\n    return 1 / x\n\nf(0)\n")
    assert failed.status is Status.ERROR and failed.error is not None
    assert failed.error.type == "ZeroDivisionError"
    assert 'File "<program>", line 2, in f' in failed.error.traceback
    assert "pyodide" not in failed.error.traceback.lower()


async def test_the_whole_standard_library_is_there(pyodide: PyodideExecutor) -> None:
    code = (
        "import sqlite3, decimal, asyncio, zoneinfo, lzma\n"
        "sqlite3.connect(':memory:').execute('select 6*7').fetchone()[0]"
    )
    assert (await run(pyodide, code)).result == 42


async def test_python_reaches_nothing_of_the_host(
    pyodide: PyodideExecutor, pyodide_install: Path
) -> None:
    code = """
import js, os
from pyodide.code import run_js
refused = {}
attempts = {
    "read": lambda: js.Deno.readTextFileSync("/etc/passwd"),
    "read its own files": lambda: js.Deno.readTextFileSync(inputs["lock"]),
    "env": lambda: js.Deno.env.get("HOME"),
    "run": lambda: js.Deno.Command.new("/bin/sh").outputSync(),
    "exit": lambda: run_js("Deno.exit(3)"),
    "process.exit": lambda: js.process.exit(4),
    "close": lambda: js.close(),
}
for name, attempt in attempts.items():
    try:
        attempt()
        refused[name] = False
    except Exception as exc:
        refused[name] = type(exc).__name__
try:
    open("/etc/passwd").read()
    refused["open"] = False
except OSError as exc:
    refused["open"] = type(exc).__name__
try:
    await js.fetch("http://127.0.0.1:9/")
    refused["fetch"] = False
except Exception as exc:
    refused["fetch"] = type(exc).__name__
refused["host env"] = sorted(set(os.environ) & {"PYTEST_CURRENT_TEST", "VIRTUAL_ENV", "PATH"})
refused
"""
    lock = next(pyodide_install.glob("pyodide-npm-*/node_modules/pyodide/pyodide-lock.json"))
    done = await run(pyodide, code, inputs={"lock": str(lock)})
    assert done.status is Status.OK, done
    refused = done.result
    host_env = refused.pop("host env")
    assert all(refused.values()), refused
    assert host_env in ([], ["PATH"]), host_env  # Pyodide's own made-up environment
    assert (await run(pyodide, "'still serving'")).result == "still serving"


async def test_limits_stop_the_program_and_keep_its_output(pyodide: PyodideExecutor) -> None:
    spin = await run(pyodide, "print('spin', flush=True)\nwhile True: pass", timeout_ms=1000)
    assert (spin.status, spin.stdout) == (Status.TIMEOUT, "spin\n")
    bomb = await run(pyodide, "x = []\nwhile True: x.append(bytearray(1 << 20))", memory_mb=128)
    assert bomb.status is Status.MEMORY_LIMIT, bomb
    flood = await run(pyodide, "while True: print('x' * 99)", output_bytes=10_000)
    assert flood.status is Status.OUTPUT_LIMIT and len(flood.stdout) == 10_000


def pyodide_workers() -> list[int]:
    """Pids of this process's Pyodide workers (deno children running the worker),
    oldest first."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            parent, started = int(fields[1]), int(fields[19])
        except (OSError, ValueError, IndexError):
            continue
        if b"pyodide_worker.js" in command and parent == os.getpid():
            found.append((started, int(entry.name)))
    return [pid for _, pid in sorted(found)]


async def test_a_killed_worker_is_a_crash_and_the_executor_keeps_serving(
    pyodide: PyodideExecutor,
) -> None:
    async def kill_workers_soon() -> None:
        with trio.fail_after(LOAD_WAIT_S):
            while not (pyodide.info().pool or {}).get("in_use"):
                await trio.sleep(0.02)  # until a worker has taken the program
        await trio.sleep(1.0)  # it is spinning by then
        # The oldest worker runs the program; the pool's refill started after it.
        os.kill(pyodide_workers()[0], signal.SIGKILL)

    with trio.fail_after(LOAD_WAIT_S):
        while not (pyodide.info().pool or {}).get("idle"):
            await trio.sleep(0.02)  # a warm worker, so the program starts at once
    async with trio.open_nursery() as nursery:
        nursery.start_soon(kill_workers_soon)
        killed = await run(pyodide, "print('up', flush=True)\nwhile True: pass", timeout_ms=30_000)
    assert killed.status is Status.CRASHED, killed
    assert killed.stdout == "up\n"
    assert (await run(pyodide, "6 * 7")).result == 42
