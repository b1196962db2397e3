"""Files on Pyodide, with real Deno and real Pyodide: a program's working directory
holds its input files and gives back what it left under out/, is empty for the next
program on the same worker, is bounded by limits.disk_mb, and a session's is kept
from step to step and reached between steps by put, get and list.

Slow, so the module's tests share one executor with one worker process (served in a
thread of its own, as in test_pyodide.py).
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.core.files import FileData
from conduit.executors.base import FilesRefused, Job, Limits, Outcome, SessionSpec, Status
from conduit.executors.pyodide import PyodideExecutor
from conduit.executors.pyodide_sessions import PyodideSession
from tests.executors.test_pyodide import pyodide_workers
from tests.sandboxes import LOAD_WAIT_S, NoBridge, start_pyodide
from tests.served import Served, serving_in_a_thread

pytestmark = pytest.mark.slow

MIB = 1024 * 1024
# What each file, directory or link counts for beyond its bytes (shims/pyodide_files.js).
ENTRY_BYTES = 512


def png() -> bytes:
    """A 2x1 PNG: bytes a text round trip would break (NUL, high bytes, CR LF)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", 2, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\xff\x00\x00\x00\r\n")
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


class Files:
    """The shared executor, driven from a test's own Trio run."""

    def __init__(self, served: Served[PyodideExecutor]) -> None:
        self._served = served

    async def run(self, code: str, files: dict[str, bytes] | None = None, **limits: Any) -> Outcome:
        placed = tuple(FileData(path, data) for path, data in (files or {}).items())
        job = Job("ex_files", "python", code, Limits(**limits), files=placed)
        with trio.fail_after(LOAD_WAIT_S):
            return await self._served.call(self._served.value.run, job, NoBridge())

    async def ok(self, code: str, files: dict[str, bytes] | None = None) -> Outcome:
        done = await self.run(code, files)
        assert done.status is Status.OK, done
        return done

    async def open(self, name: str) -> PyodideSession:
        spec = SessionSpec(f"se_{name}", "python", 128)
        opened = await self._served.call(self._served.value.open_session, spec)
        assert isinstance(opened, PyodideSession)
        return opened

    async def step(self, session: PyodideSession, code: str, **limits: Any) -> Outcome:
        job = Job("ex_step", "python", code, Limits(**limits))
        with trio.fail_after(LOAD_WAIT_S):
            return await self._served.call(session.run, job, NoBridge())

    async def call(self, function: Any, *args: Any) -> Any:
        with trio.fail_after(LOAD_WAIT_S):
            return await self._served.call(function, *args)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, pyodide_install: Path) -> Iterator[Files]:
    cache_dir = tmp_path_factory.mktemp("pyodide-files")

    # One process runs every program (none is started beside it while a program is slow
    # on a busy machine), so a test can tell that two programs shared it.
    start = partial(
        start_pyodide,
        cache_dir=cache_dir,
        install_dir=pyodide_install,
        max_sessions=2,
        max_processes=1,
    )
    with serving_in_a_thread(start) as served:
        yield Files(served)


@pytest.fixture
async def session(files: Files) -> AsyncIterator[PyodideSession]:
    opened = await files.open("files")
    yield opened
    await files.call(opened.aclose)


READS = """
import csv, json, os, pathlib
with open("data/in.csv", newline="") as f:
    rows = list(csv.DictReader(f))
with open("data/config.json") as f:
    config = json.load(f)
{
    "rows": rows,
    "config": config,
    "text": pathlib.Path("data/in.csv").read_text().splitlines()[0],
    "listed": sorted(os.listdir("data")),
    "cwd_entries": os.listdir("."),
}
"""


async def test_input_files_are_read_with_relative_paths(files: Files) -> None:
    inputs = {
        "data/in.csv": b"name,n\nada,1\nbob,2\n",
        "data/config.json": json.dumps({"scale": 3}).encode(),
    }
    done = await files.ok(READS, inputs)
    assert done.result == {
        "rows": [{"name": "ada", "n": "1"}, {"name": "bob", "n": "2"}],
        "config": {"scale": 3},
        "text": "name,n",
        "listed": ["config.json", "in.csv"],
        "cwd_entries": ["data"],
    }


async def test_a_png_written_to_out_comes_back_byte_exact(files: Files) -> None:
    image = png()
    code = (
        "import os\nos.makedirs('out/charts', exist_ok=True)\n"
        "open('out/charts/chart.png', 'wb').write(bytes(inputs['png']))\n"
        "open('notes.txt', 'w').write('not returned')"
    )
    job = Job("ex_png", "python", code, inputs={"png": list(image)})
    done = await files.call(files._served.value.run, job, NoBridge())
    assert done.status is Status.OK, done
    assert done.files == [FileData("charts/chart.png", image)]


async def test_the_next_execution_on_the_worker_sees_none_of_the_files(files: Files) -> None:
    code = (
        "import os\nos.makedirs('out', exist_ok=True)\nopen('out/a.txt', 'w').write('a')\n"
        "open('/tmp/left.txt', 'w').write('left')\nopen('/home/pyodide/left', 'w').write('x')\n"
        "sorted(os.listdir('.'))"
    )
    first = await files.ok(code, {"input.txt": b"in"})
    assert first.result == ["input.txt", "out"]
    # Taken after a program, so the pool is done replacing any worker an earlier test
    # broke: the next program goes to this one, the only one.
    before = pyodide_workers()
    later = await files.ok(
        "import os\n[os.listdir('.'), os.path.exists('/tmp/left.txt'), "
        "os.path.exists('/home/pyodide/left')]"
    )
    assert later.result == [[], False, False]
    assert later.files == []
    # The same worker process ran both: its next interpreter's file system is new.
    assert pyodide_workers() == before and len(before) == 1


async def test_a_disk_bomb_ends_with_disk_limit_and_the_executor_goes_on(files: Files) -> None:
    bomb = (
        "chunk = b'x' * (1 << 20)\n"
        "with open('/tmp/bomb', 'wb') as f:\n"
        "    while True:\n        f.write(chunk)"
    )
    done = await files.run(bomb, disk_mb=2)
    assert done.status is Status.DISK_LIMIT, done
    assert done.error is not None and "limits.disk_mb (2 MB)" in done.error.message
    # A sparse file is no way round it, nor is a program that catches the error.
    sparse = (
        "try:\n    f = open('big', 'wb'); f.truncate(1 << 30)\n"
        "except OSError as exc:\n    print(exc.errno)\n"
    )
    done = await files.run(sparse, disk_mb=2)
    assert done.status is Status.DISK_LIMIT, done
    # Nor are many empty files.
    empties = "for n in range(10_000):\n    open(f'e{n}', 'w').close()"
    done = await files.run(empties, disk_mb=1)
    assert done.status is Status.DISK_LIMIT, done
    # Files written and deleted do not count; the executor serves the next program.
    churn = (
        "import os\nfor _ in range(5):\n    open('f', 'wb').write(b'x' * (1 << 20))\n"
        "    os.remove('f')\n'done'"
    )
    done = await files.run(churn, disk_mb=2)
    assert (done.status, done.result) == (Status.OK, "done"), done


async def test_a_link_in_out_is_not_followed(files: Files) -> None:
    code = (
        "import os\nos.makedirs('out/sub')\nopen('secret', 'w').write('secret')\n"
        "os.symlink('../secret', 'out/link')\nos.symlink('/tmp', 'out/dirlink')\n"
        "open('/tmp/x', 'w').write('x')\nopen('out/sub/real', 'w').write('real')"
    )
    done = await files.ok(code)
    assert done.files == [FileData("sub/real", b"real")]


async def test_a_session_keeps_its_files_between_steps(
    files: Files, session: PyodideSession
) -> None:
    done = await files.step(session, "import os\nos.makedirs('out')\nopen('kept', 'w').write('k')")
    assert done.status is Status.OK, done
    done = await files.step(session, "import os\nos.chdir('/tmp')\nopen('out/b', 'w')")
    assert done.status is Status.ERROR, done  # it left its working directory...
    done = await files.step(session, "open('out/b', 'w').write('b')\nopen('kept').read()")
    assert (done.status, done.result) == (Status.OK, "k"), done  # ...for that step only
    assert done.files == [FileData("b", b"b")]


async def test_put_get_and_list_between_steps(files: Files, session: PyodideSession) -> None:
    await files.call(session.put_files, [FileData("data/a.txt", b"A" * 10)], MIB)
    done = await files.step(session, "open('data/a.txt').read()")
    assert (done.status, done.result) == (Status.OK, "A" * 10), done
    step = "open('data/a.txt', 'a').write('B')\nopen('made.bin', 'wb').write(b'\\x00\\xff')"
    assert (await files.step(session, step)).status is Status.OK
    listed = await files.call(session.list_files)
    assert [(f.path, f.size) for f in listed] == [("data/a.txt", 11), ("made.bin", 2)]
    assert await files.call(session.get_file, "made.bin") == b"\x00\xff"
    assert await files.call(session.get_file, "missing") is None
    assert await files.call(session.get_file, "data") is None
    # Replacing a file counts its new bytes only; every entry counts ENTRY_BYTES.
    replaced = [FileData("made.bin", b"z" * 100)]
    held = 3 * ENTRY_BYTES + len("A" * 10 + "B") + 100  # data/, data/a.txt, made.bin
    with pytest.raises(FilesRefused, match=r"limits\.disk_mb"):
        await files.call(session.put_files, replaced, held - 1)
    assert await files.call(session.get_file, "made.bin") == b"\x00\xff"
    await files.call(session.put_files, replaced, held)
    assert await files.call(session.get_file, "made.bin") == b"z" * 100


async def test_put_refuses_directories_links_and_too_much(
    files: Files, session: PyodideSession
) -> None:
    code = (
        "import os\nos.makedirs('dir')\nos.symlink('/tmp', 'link')\nopen('/tmp/t', 'w').write('t')"
    )
    assert (await files.step(session, code)).status is Status.OK
    for path in ("dir", "link", "link/t"):
        with pytest.raises(FilesRefused, match=f"'{path}'"):
            await files.call(session.put_files, [FileData(path, b"x")], MIB)
    assert await files.call(session.get_file, "link/t") is None
    with pytest.raises(FilesRefused, match=r"limits\.disk_mb"):
        await files.call(session.put_files, [FileData("big", b"x" * 2000)], 1000)
    # A put is placed whole or not at all: no directory is made for a refused one.
    with pytest.raises(FilesRefused, match="'dir'"):
        await files.call(session.put_files, [FileData("new/a", b"x"), FileData("dir", b"x")], MIB)
    listed = await files.call(session.list_files)
    assert [f.path for f in listed] == []
    looked = await files.step(session, "import os\n[os.path.exists('new'), open('/tmp/t').read()]")
    assert looked.result == [False, "t"], looked


async def test_a_session_reset_starts_with_an_empty_directory(
    files: Files, session: PyodideSession
) -> None:
    await files.call(session.put_files, [FileData("kept.txt", b"k")], MIB)
    done = await files.step(
        session, "while True: pass", timeout_ms=500
    )  # times out: the session resets
    assert done.session_reset
    done = await files.step(session, "import os\nos.listdir('.')")
    assert (done.status, done.result) == (Status.OK, []), done


async def test_out_files_come_back_from_a_program_that_broke_javascript(files: Files) -> None:
    code = (
        "import os\nfrom pyodide.code import run_js\nos.makedirs('out')\n"
        "open('out/kept.txt', 'w').write('kept')\n"
        "run_js('Array.prototype.map = () => 1; Array.prototype.filter = () => 1; "
        "Object.keys = () => []; Uint8Array.prototype.slice = () => null')"
    )
    done = await files.run(code, timeout_ms=5000)
    assert done.status is Status.OK, done
    assert done.files == [FileData("kept.txt", b"kept")]
