"""The pyodide executor with real Deno and real Pyodide: the Python contract, limits,
containment tried from inside Python, and a fresh interpreter for every program in a
worker process that runs many.

Slow (each worker process compiles and loads Pyodide, seconds of CPU), so the module's
tests share one executor, as a daemon's programs do, and each test batches its checks.
pytest-trio gives each test a Trio run of its own, so the shared executor is served by
a run in a thread of its own (`shared_pyodide`, which the other Pyodide tests use too).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio

from conduit.executors import pyodide_host
from conduit.executors.base import ExecutorInfo, Job, Limits, Outcome, Status, ToolBridge
from conduit.executors.pyodide import PyodideExecutor
from tests.sandboxes import LOAD_WAIT_S, NoBridge
from tests.served import Served, serving_in_a_thread

# Pyodide alone: no test here waits for the wasm components to be built.
pytestmark = [pytest.mark.slow, pytest.mark.no_wasm]

T = TypeVar("T")
R = TypeVar("R")


# -- one executor for a module's tests -------------------------------------------------


class SharedPyodide:
    """A Pyodide executor with one worker process, shared by a module's tests: each runs
    its programs from its own Trio run, every one in a fresh interpreter, as the
    daemon's programs do."""

    def __init__(self, served: Served[PyodideExecutor]) -> None:
        self._served = served

    async def run(self, job: Job, bridge: ToolBridge) -> Outcome:
        return await self._served.call(self._served.value.run, job, bridge)

    async def info(self) -> ExecutorInfo:
        return await self._served.call_sync(self._served.value.info)

    async def settled(self) -> dict[str, Any]:
        """The pool's statistics once it has its one process, ready, and nothing else:
        what an earlier test's programs cost it has been made good."""
        pool: dict[str, Any] = {}
        with trio.move_on_after(LOAD_WAIT_S):
            while True:
                pool = (await self.info()).pool or {}
                busy = any(pool.get(count) for count in ("starting", "in_use", "waiting"))
                if pool.get("processes") == pool.get("idle") == 1 and not busy:
                    return pool
                await trio.sleep(0.02)  # the pool announces nothing to its owner
        raise AssertionError(f"the pool did not settle within {LOAD_WAIT_S} s: {pool}")


@contextmanager
def shared_pyodide(cache_dir: Path, install_dir: Path) -> Iterator[SharedPyodide]:
    """`tests.sandboxes.start_pyodide`'s executor, served in a thread of its own."""

    async def start(nursery: trio.Nursery) -> PyodideExecutor:
        executor = PyodideExecutor(cache_dir=cache_dir, install_dir=install_dir, pool_size=1)
        await nursery.start(executor.serve)
        with trio.fail_after(LOAD_WAIT_S):
            assert await executor.wait_ready(), executor.info().reason
        return executor

    with serving_in_a_thread(start) as served:
        yield SharedPyodide(served)


@pytest.fixture(scope="module")
def pyodide(
    tmp_path_factory: pytest.TempPathFactory, pyodide_install: Path
) -> Iterator[SharedPyodide]:
    with shared_pyodide(tmp_path_factory.mktemp("pyodide"), pyodide_install) as executor:
        yield executor


async def run(executor: SharedPyodide, code: str, inputs: Any = None, **limits: Any) -> Outcome:
    with trio.fail_after(LOAD_WAIT_S):
        job = Job("ex_pyodide", "python", code, Limits(**limits), inputs=inputs)
        return await executor.run(job, NoBridge())


async def test_the_python_contract_holds(pyodide: SharedPyodide) -> None:
    info = await pyodide.info()
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


async def test_a_program_that_closes_or_breaks_its_output_keeps_its_outcome(
    pyodide: SharedPyodide,
) -> None:
    closed = await run(pyodide, "import sys\nsys.stdout.close()\n5")
    assert (closed.status, closed.result) == (Status.OK, 5), closed
    raised = await run(pyodide, "import sys\nsys.stderr.close()\nraise KeyError('mine')")
    assert raised.error is not None and raised.error.type == "KeyError", raised
    code = (
        "import sys\nclass Out:\n    def write(self, text):\n        return len(text)\n"
        "    def flush(self):\n        raise OSError('disk full')\nsys.stdout = Out()\n5"
    )
    broken = await run(pyodide, code)
    assert (broken.status, broken.result) == (Status.OK, 5), broken


async def test_the_whole_standard_library_is_there(pyodide: SharedPyodide) -> None:
    code = (
        "import sqlite3, decimal, asyncio, zoneinfo, lzma\n"
        "sqlite3.connect(':memory:').execute('select 6*7').fetchone()[0]"
    )
    assert (await run(pyodide, code)).result == 42


async def test_time_zones_have_their_data(pyodide: SharedPyodide) -> None:
    code = """
import datetime, zoneinfo
def offset(zone, month):
    moment = datetime.datetime(2026, month, 1, 12, tzinfo=zoneinfo.ZoneInfo(zone))
    return moment.utcoffset().total_seconds() / 3600
{
    "paris": [offset("Europe/Paris", 1), offset("Europe/Paris", 7)],
    "new_york": [offset("America/New_York", 1), offset("America/New_York", 7)],
    "kolkata": offset("Asia/Kolkata", 1),
    "zones": len(zoneinfo.available_timezones()) > 400,
}
"""
    done = await run(pyodide, code)
    assert done.status is Status.OK, done.error
    assert done.result == {
        "paris": [1.0, 2.0],
        "new_york": [-5.0, -4.0],
        "kolkata": 5.5,
        "zones": True,
    }


# Leaves something behind everywhere a program can: Python's modules, builtins and
# files, the environment, and JavaScript's globals, prototypes, timers, promises and
# finalizers, some of which would fire while the next program runs.
PLANT = """
import builtins, json, os, sys
import js
from pyodide.code import run_js
builtins.LEFT = 1
json.LEFT = 1
sys.modules["left_behind"] = json
os.environ["LEFT"] = "1"
for path in ("/tmp/left.txt", "/home/pyodide/left.txt", "/lib/left.txt"):
    with open(path, "w") as f:
        f.write("left")
js.globalThis.LEFT = 1
run_js("Object.prototype.LEFT_PROTO = 1; Array.prototype.map = () => 'patched'")
run_js("setTimeout(() => { globalThis.TIMER = 1; console.log('LEFT TIMER') }, 200)")
run_js("setInterval(() => console.error('LEFT INTERVAL'), 200)")
run_js("new Promise((ok) => setTimeout(ok, 200)).then(() => console.log('LEFT PROMISE'))")
run_js("new FinalizationRegistry(() => console.log('LEFT FINALIZER')).register({}, 0)")
import random
random.random()
"""

# Waits past every timer PLANT set, then looks for what it left.
LOOK = """
import asyncio, builtins, json, os, random, sys
from pyodide.code import run_js
await asyncio.sleep(0.5)
FILES = ("/tmp/left.txt", "/home/pyodide/left.txt", "/lib/left.txt")
JS = "[typeof LEFT, typeof ({}).LEFT_PROTO, typeof globalThis.TIMER, [1].map(x => x + 1)[0]]"
{
    "python": [hasattr(builtins, "LEFT"), hasattr(json, "LEFT"), "left_behind" in sys.modules],
    "environ": "LEFT" in os.environ,
    "files": [os.path.exists(path) for path in FILES],
    "js": run_js(JS).to_py(),
    "random": random.random(),
}
"""


async def test_nothing_of_a_program_is_left_for_the_next(pyodide: SharedPyodide) -> None:
    before = await pyodide.settled()
    planted = await run(pyodide, PLANT)
    assert planted.status is Status.OK, planted.error
    first = await run(pyodide, LOOK)
    second = await run(pyodide, LOOK)
    for looked in (first, second):
        assert looked.status is Status.OK, looked.error
        assert looked.result["python"] == [False, False, False]
        assert looked.result["environ"] is False
        assert looked.result["files"] == [False, False, False]
        assert looked.result["js"] == ["undefined", "undefined", "undefined", 2]
        assert "LEFT" not in looked.stdout + looked.stderr
    # The program's own garbage may be collected while it runs, its finalizer printing
    # into its own output; a timer's time comes only after it has ended.
    for timer in ("LEFT TIMER", "LEFT INTERVAL", "LEFT PROMISE"):
        assert timer not in planted.stdout + planted.stderr
    # Each interpreter draws its own random numbers, though all start from one snapshot.
    assert first.result["random"] != second.result["random"]
    # All three ran in the one worker process: it was reused, not replaced.
    pool = (await pyodide.info()).pool
    assert pool is not None
    counts = (pool["handed_out"] - before["handed_out"], pool["discarded"] - before["discarded"])
    assert (pool["processes"], *counts) == (1, 3, 0), (before, pool)


# Timers that fire as often as they can, from Python and from JavaScript.
TICKING = """
import js
from pyodide.code import run_js
from pyodide.ffi import create_proxy
js.setInterval(create_proxy(lambda: print("TICK")), 0)
run_js("setInterval(() => console.error('TICK'), 0); setTimeout(() => console.log('TICK'), 0)")
"""


async def test_a_programs_timers_end_with_it_and_its_process_is_reused(
    pyodide: SharedPyodide,
) -> None:
    before = await pyodide.settled()
    for _ in range(3):
        ticking = await run(pyodide, TICKING)
        assert ticking.status is Status.OK, ticking.error
        after = await run(pyodide, "await __import__('asyncio').sleep(0.05)\n6 * 7")
        assert (after.result, after.stdout, after.stderr) == (42, "", "")
    pool = (await pyodide.info()).pool
    assert pool is not None
    # Nothing wrote after its program's end, so no worker process had to be replaced
    # (one that died is replaced too, and is not what this is about).
    discarded = pool["discarded"] - before["discarded"]
    assert discarded <= pool["deaths"] - before["deaths"], (before, pool)


# Forges its own answer, then runs JavaScript that a terminated Deno worker does not
# stop, writing all the while.
OUTLIVE = """
import js
from pyodide.code import run_js
js.postMessage(js.Object.fromEntries([["answer", '{"result": "forged"}']]))
run_js("for (;;) { console.log('STILL RUNNING'); }")
"""


# Has Deno cache a module in the process's code cache, which the next program could
# find (by its speed) or grow until the disk is full.
CACHE = """
from pyodide.code import run_js
await run_js("import('data:text/javascript,export default 1')")
'cached'
"""


# How long an ended interpreter's thread may stay here before its process is killed:
# one that ends is gone well within a second even on a loaded machine, and the loop that
# outlives its program burns a core for as long as the executor's own, wider bound.
OUTLIVED_AFTER_S = 1.5


async def test_code_that_outlives_its_program_costs_its_process(
    pyodide: SharedPyodide, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pyodide_host, "THREAD_EXIT_TIMEOUT_S", OUTLIVED_AFTER_S)
    before = await pyodide.settled()
    outlived = await run(pyodide, OUTLIVE)
    assert (outlived.status, outlived.result) == (Status.OK, "forged")  # its own doing
    after = await run(pyodide, "print('mine')\n6 * 7")
    assert (after.status, after.result, after.stdout, after.stderr) == (Status.OK, 42, "mine\n", "")
    cached = await run(pyodide, CACHE)
    assert (cached.status, cached.result) == (Status.OK, "cached")
    assert (await run(pyodide, "6 * 7")).result == 42
    pool = (await pyodide.info()).pool
    assert pool is not None
    # Each time, the process it ran in was killed.
    assert pool["discarded"] - before["discarded"] == 2, (before, pool)
    assert len(pyodide_workers()) == 1


async def test_waiting_for_an_interpreter_is_not_the_programs_time(
    pyodide: SharedPyodide,
) -> None:
    """One process, two programs at once: the second waits (for the first's process to
    make its next interpreter, or for a new process), and that wait is queueing, not
    part of its timeout."""
    outcomes: dict[str, Outcome] = {}

    async def one(name: str, code: str, timeout_ms: int) -> None:
        outcomes[name] = await run(pyodide, code, timeout_ms=timeout_ms)

    await pyodide.settled()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, "first", "import time\ntime.sleep(1.5)\n'slept'", 30_000)
        with trio.fail_after(LOAD_WAIT_S):
            while not ((await pyodide.info()).pool or {}).get("in_use"):
                await trio.sleep(0.01)
        nursery.start_soon(one, "second", "'quick'", 1000)
    assert (outcomes["first"].status, outcomes["first"].result) == (Status.OK, "slept")
    second = outcomes["second"]
    assert (second.status, second.result) == (Status.OK, "quick"), second
    assert second.queue_s > 0.05
    # Its own time is still bounded: a program past its timeout is never ok.
    late = await run(pyodide, "import time\ntime.sleep(3)\n'late'", timeout_ms=1000)
    assert late.status is Status.TIMEOUT, late


async def test_python_reaches_nothing_of_the_host(
    pyodide: SharedPyodide, pyodide_install: Path
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


async def test_limits_stop_the_program_and_keep_its_output(pyodide: SharedPyodide) -> None:
    spin = await run(pyodide, "print('spin', flush=True)\nwhile True: pass", timeout_ms=1000)
    assert (spin.status, spin.stdout) == (Status.TIMEOUT, "spin\n")
    # Its time is not what is tested: on a loaded machine the default could end it first.
    bomb_code = "x = []\nwhile True: x.append(bytearray(1 << 20))"
    bomb = await run(pyodide, bomb_code, memory_mb=128, timeout_ms=60_000)
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
    pyodide: SharedPyodide,
) -> None:
    printed = threading.Event()

    async def on_output(stream: str, text: str) -> None:
        printed.set()  # in the executor's thread

    async def kill_the_worker_once_it_spins() -> None:
        wait = partial(printed.wait, LOAD_WAIT_S)
        assert await trio.to_thread.run_sync(wait, abandon_on_cancel=True)
        # The one worker runs the program, which spins once it has printed.
        os.kill(pyodide_workers()[0], signal.SIGKILL)

    await pyodide.settled()  # a warm worker, so the program starts at once
    code = "print('up', flush=True)\nwhile True: pass"
    job = Job("ex_pyodide", "python", code, Limits(timeout_ms=30_000), on_output=on_output)
    with trio.fail_after(LOAD_WAIT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(kill_the_worker_once_it_spins)
            killed = await pyodide.run(job, NoBridge())
            nursery.cancel_scope.cancel()  # it ended, printed or not: no more to kill
    assert killed.status is Status.CRASHED, killed
    assert killed.stdout == "up\n"
    assert (await run(pyodide, "6 * 7")).result == 42
