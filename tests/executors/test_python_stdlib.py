"""The whole standard library on every Python executor, with the real runtimes.

Every module of the guest's `sys.stdlib_module_names` imports, except those
`python_stdlib.MISSING` lists with a reason; and the modules programs use most do
their work, not just import.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.executors.base import Job, Limits, Outcome, Status
from conduit.executors.python_stdlib import missing_modules
from tests.executors.test_pyodide import SharedPyodide, shared_pyodide
from tests.sandboxes import LOAD_WAIT_S, NoBridge

# Imports every module and answers those that failed, with why.
IMPORT_EVERY_MODULE = """
import importlib, sys
failed = {}
for name in sorted(sys.stdlib_module_names):
    try:
        importlib.import_module(name)
    except BaseException as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
failed
"""

# What a model writes: each module doing its work. The answer says what each gave.
REAL_USE = r"""
import asyncio, logging, sqlite3, zoneinfo, datetime, threading, json, sys
import xml.etree.ElementTree as ET

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
logging.getLogger("agent").info("started")

async def fetch(i):
    await asyncio.sleep(0.01)
    return i * 2

async def main():
    return await asyncio.gather(*(fetch(i) for i in range(5)))

db = sqlite3.connect(":memory:")
db.execute("create table t (x integer)")
db.executemany("insert into t values (?)", [(1,), (2,), (3,)])
paris = datetime.datetime(2026, 7, 1, 12, tzinfo=zoneinfo.ZoneInfo("Europe/Paris"))
try:
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()
    threads = "ran"
except RuntimeError as exc:
    threads = str(exc)
{
    "gathered": asyncio.run(main()),
    "sum": db.execute("select sum(x) from t").fetchone()[0],
    "offset": paris.utcoffset().total_seconds(),
    "xml": ET.fromstring("<a><b>hi</b></a>").find("b").text,
    "threads": threads,
}
"""


async def run(executor: Any, code: str, wait_s: float = LOAD_WAIT_S) -> Outcome:
    with trio.fail_after(wait_s):
        job = Job("ex_stdlib", "python", code, Limits(timeout_ms=60_000))
        return await executor.run(job, NoBridge())


def assert_only_the_listed_gaps(executor: str, outcome: Outcome) -> None:
    assert outcome.status is Status.OK, outcome.error
    failed = outcome.result
    listed = missing_modules(executor)
    unexpected = {name: why for name, why in failed.items() if name not in listed}
    assert unexpected == {}, f"new gaps on {executor}: add a reason or fix them"
    assert sorted(set(listed) - set(failed)) == [], "listed as missing, but imports"


def assert_real_use_works(outcome: Outcome) -> None:
    assert outcome.status is Status.OK, outcome.error
    result = outcome.result
    assert result["gathered"] == [0, 2, 4, 6, 8]
    assert result["sum"] == 6
    assert result["offset"] == 7200.0  # summer time in Paris
    assert result["xml"] == "hi"
    assert result["threads"] in ("ran", "can't start new thread")
    assert "INFO agent started" in outcome.stderr


async def test_wasm_python_imports_the_whole_standard_library(wasm: Any) -> None:
    assert_only_the_listed_gaps("wasm-python", await run(wasm, IMPORT_EVERY_MODULE))


async def test_wasm_python_modules_do_their_work(wasm: Any) -> None:
    assert_real_use_works(await run(wasm, REAL_USE))


async def test_wasm_python_library_is_read_only(wasm: Any) -> None:
    code = (
        "import json, linecache, os\n"
        "try:\n"
        "    open(json.__file__, 'a').write('x')\n"
        "    wrote = True\n"
        "except OSError:\n"
        "    wrote = False\n"
        "[json.__file__, wrote, linecache.getline(os.__file__, 1)]"
    )
    outcome = await run(wasm, code)
    # Frozen modules' sources are there too, for their tracebacks.
    assert outcome.result == [
        "/python/json/__init__.py",
        False,
        'r"""OS routines for NT or Posix depending on what system we\'re on.\n',
    ]


@pytest.fixture(scope="module")
def pyodide(
    tmp_path_factory: pytest.TempPathFactory, pyodide_install: Path
) -> Iterator[SharedPyodide]:
    """One executor for both tests, as a daemon's: each program in a fresh interpreter."""
    with shared_pyodide(tmp_path_factory.mktemp("pyodide"), pyodide_install) as executor:
        yield executor


@pytest.mark.slow
async def test_pyodide_imports_the_whole_standard_library(pyodide: SharedPyodide) -> None:
    assert_only_the_listed_gaps("pyodide", await run(pyodide, IMPORT_EVERY_MODULE))


@pytest.mark.slow
async def test_pyodide_modules_do_their_work(pyodide: SharedPyodide) -> None:
    assert_real_use_works(await run(pyodide, REAL_USE))


# Files: a directory of the execution's own, empty at start, capped, gone afterwards.
FILES = """
import os, pathlib, tempfile
start = sorted(os.listdir("."))
pathlib.Path("notes.txt").write_text("hello")
with tempfile.NamedTemporaryFile("w", delete=False, suffix=".csv") as f:
    f.write("a,b\\n1,2\\n")
os.makedirs("out/deep", exist_ok=True)
open("out/deep/x.bin", "wb").write(bytes(1000))
{
    "start": start,
    "cwd": os.getcwd(),
    "read": pathlib.Path("notes.txt").read_text(),
    "temp": open(f.name).read(),
    "listed": sorted(p.name for p in pathlib.Path(".").rglob("*")),
    "host": [os.path.exists(p) for p in ("/etc/passwd", "../etc/passwd", "/proc/self")],
}
"""


async def test_wasm_python_files_are_the_executions_own(wasm: Any) -> None:
    first = await run(wasm, FILES)
    assert first.status is Status.OK, first.error
    result = first.result
    assert result["start"] == [] and result["cwd"] == "/tmp"
    assert result["read"] == "hello" and result["temp"] == "a,b\n1,2\n"
    assert {"notes.txt", "deep", "x.bin"} <= set(result["listed"])
    assert result["host"] == [False, False, False]  # nothing else of the host
    second = await run(wasm, FILES)  # the same names again: nothing was left behind
    assert second.result["start"] == [], second.error
    leftovers = [path for path in wasm._scratch.root.iterdir() if path.is_dir()]
    assert len(leftovers) <= 8  # the instances made ahead; each execution's went with it


async def test_wasm_python_files_count_against_the_disk_limit(wasm: Any) -> None:
    code = "chunk = bytes(1 << 20)\nwith open('big', 'wb') as f:\n    while True: f.write(chunk)"
    with trio.fail_after(LOAD_WAIT_S):
        limits = Limits(timeout_ms=60_000, memory_mb=256, disk_mb=8)
        outcome = await wasm.run(Job("ex_files", "python", code, limits), NoBridge())
    assert outcome.status is Status.DISK_LIMIT, outcome
    assert "limits.disk_mb (8 MB)" in outcome.error.message
    assert (await run(wasm, "import os\nos.listdir('.')")).result == []


async def test_wasm_python_cannot_link_the_library_into_its_files(wasm: Any) -> None:
    code = (
        "import os\n"
        "tried = {}\n"
        "for how in ('link', 'symlink'):\n"
        "    try:\n"
        "        getattr(os, how)('/python/json/__init__.py', how)\n"
        "        open(how, 'a').write('# changed')\n"
        "        tried[how] = 'wrote'\n"
        "    except OSError as exc:\n"
        "        tried[how] = type(exc).__name__\n"
        "tried"
    )
    outcome = await run(wasm, code)
    assert outcome.status is Status.OK, outcome.error
    assert "wrote" not in outcome.result.values(), outcome.result
    stdlib = next(wasm._cache_dir.glob("wasm-python-*/stdlib"))
    assert b"# changed" not in (stdlib / "json" / "__init__.py").read_bytes()
