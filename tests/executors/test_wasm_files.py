"""Files in and out of the Wasmtime executors, with real components: input files read
by relative paths, what a program leaves under out/ returned byte for byte, the disk
cap, and what a program may plant in its directory (links, FIFOs, deep trees)."""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.core.files import MAX_FILES, FileData
from conduit.executors.base import (
    ExecutorSession,
    FilesRefused,
    Job,
    Limits,
    Outcome,
    Status,
)
from conduit.executors.wasm import WasmExecutor
from conduit.executors.wasm_js import WasmJsExecutor
from conduit.executors.wasm_python import WasmPythonExecutor
from tests.executors.conftest import open_wasm_session
from tests.sandboxes import WAIT_S, NoBridge

MIB = 1024 * 1024


def png_bytes() -> bytes:
    """A real 16x16 greyscale PNG (the same bytes a program below builds)."""
    raw = b"".join(b"\x00" + bytes(range(y * 16, y * 16 + 16)) for y in range(16))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", 16, 16, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


MAKE_PNG = """
import pathlib, struct, zlib
raw = b"".join(b"\\x00" + bytes(range(y * 16, y * 16 + 16)) for y in range(16))
def chunk(kind, data):
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))
header = struct.pack(">IIBBBBB", 16, 16, 8, 0, 0, 0, 0)
png = b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) \\
    + chunk(b"IEND", b"")
pathlib.Path("out").mkdir(exist_ok=True)
pathlib.Path("out/chart.png").write_bytes(png)
"""

INPUTS = (
    FileData("data/in.csv", b"name,n\na,1\nb,2\n"),
    FileData("config.json", b'{"scale": 10}'),
    FileData("notes.txt", "héllo\n".encode()),
    FileData("blob.bin", bytes(range(256))),
)


async def run(
    executor: WasmExecutor, code: str, files: tuple[FileData, ...] = (), **limits: Any
) -> Outcome:
    language = min(executor.languages - getattr(executor, "partly", frozenset()))
    job = Job("ex_files", language, code, Limits(**limits), files=files)
    with trio.fail_after(WAIT_S):
        return await executor.run(job, NoBridge())


# -- wasm-python --------------------------------------------------------------------


async def test_python_reads_input_files_by_relative_paths(wasm: WasmPythonExecutor) -> None:
    code = (
        "import csv, json, os, pathlib\n"
        "with open('data/in.csv', newline='') as f:\n"
        "    rows = list(csv.DictReader(f))\n"
        "scale = json.load(open('config.json'))['scale']\n"
        "[sum(int(r['n']) for r in rows) * scale,\n"
        " pathlib.Path('notes.txt').read_text(encoding='utf-8'),\n"
        " list(pathlib.Path('blob.bin').read_bytes()) == list(range(256)),\n"
        " sorted(os.listdir('.'))]"
    )
    outcome = await run(wasm, code, INPUTS)
    assert outcome.status is Status.OK, outcome.error
    total, notes, blob, listed = outcome.result
    assert (total, notes, blob) == (30, "héllo\n", True)
    assert listed == ["blob.bin", "config.json", "data", "notes.txt"]
    assert outcome.files == []  # nothing under out/: nothing comes back


async def test_python_png_in_out_comes_back_byte_exact(wasm: WasmPythonExecutor) -> None:
    code = MAKE_PNG + (
        "pathlib.Path('out/sub').mkdir()\n"
        "pathlib.Path('out/sub/data.json').write_text('[1, 2]')\n"
        "pathlib.Path('scratch.txt').write_text('not returned')\n"
    )
    outcome = await run(wasm, code)
    assert outcome.status is Status.OK, outcome.error
    expected = [FileData("chart.png", png_bytes()), FileData("sub/data.json", b"[1, 2]")]
    assert outcome.files == expected


async def test_python_input_files_are_gone_for_the_next_execution(
    wasm: WasmPythonExecutor,
) -> None:
    assert (await run(wasm, "len(open('notes.txt').read())", INPUTS)).result == 6
    after = await run(wasm, "import os\nos.listdir('.')")
    assert after.result == [], after


async def test_python_disk_bomb_ends_at_the_disk_limit(wasm: WasmPythonExecutor) -> None:
    code = (
        "import os\nos.mkdir('out')\nchunk = bytes(1 << 20)\n"
        "with open('out/big', 'wb') as f:\n    while True: f.write(chunk)"
    )
    outcome = await run(wasm, code, timeout_ms=60_000, memory_mb=256, disk_mb=4)
    assert outcome.status is Status.DISK_LIMIT, outcome
    assert "limits.disk_mb (4 MB)" in outcome.error.message
    # What is returned stays within the cap, and the executor goes on serving.
    assert sum(len(file.data) for file in outcome.files) <= 4 * MIB
    assert (await run(wasm, "import os\nos.listdir('.')")).result == []


async def test_python_many_empty_files_end_at_the_disk_limit(wasm: WasmPythonExecutor) -> None:
    code = "import itertools\nfor i in itertools.count():\n    open(f'f{i}', 'w').close()"
    outcome = await run(wasm, code, timeout_ms=60_000, disk_mb=1)
    assert outcome.status is Status.DISK_LIMIT, outcome


async def test_python_links_in_out_are_never_followed(wasm: WasmPythonExecutor) -> None:
    code = (
        "import os\nos.mkdir('out')\nopen('secret', 'w').write('inside')\n"
        "open('out/real.txt', 'w').write('real')\n"
        "tried = {}\n"
        "for name, target in [('etc', '/etc/passwd'), ('up', '../../../etc/passwd'),\n"
        "                     ('inside', '../secret'), ('dir', '..')]:\n"
        "    try:\n"
        "        os.symlink(target, 'out/' + name)\n"
        "        tried[name] = 'made'\n"
        "    except OSError as exc:\n"
        "        tried[name] = type(exc).__name__\n"
        "tried"
    )
    outcome = await run(wasm, code)
    assert outcome.status is Status.OK, outcome.error
    # WASI refuses an absolute target, but makes relative ones, even leading out.
    assert outcome.result["inside"] == outcome.result["up"] == "made", outcome.result
    assert outcome.files == [FileData("real.txt", b"real")], outcome.result


async def test_python_deep_trees_and_many_files_are_handled(wasm: WasmPythonExecutor) -> None:
    code = (
        "import os\n"
        "os.makedirs('out/many')\n"
        "for i in range(1500):\n    open(f'out/many/{i:04}', 'w').write(str(i))\n"
        "path = 'out'\n"
        "for i in range(300):\n"
        "    os.mkdir(path := path + '/d')\n"
        "open(path + '/deepest', 'w').write('x')\n"
        "open('out/d/shallow', 'w').write('y')\n"
    )
    outcome = await run(wasm, code, timeout_ms=60_000)
    assert outcome.status is Status.OK, outcome.error
    paths = [file.path for file in outcome.files]
    assert len(paths) == MAX_FILES
    assert paths[0] == "d/shallow" and paths[1] == "many/0000"
    assert not any(path.endswith("deepest") for path in paths)  # deeper than a path may be
    assert (await run(wasm, "import os\nos.listdir('.')")).result == []


# -- wasm-js --------------------------------------------------------------------------


async def test_js_reads_input_files_and_writes_out(wasm_js: WasmJsExecutor) -> None:
    code = """
const rows = fs.readFileSync("data/in.csv", "utf8").trim().split("\\n").slice(1);
const total = rows.map((row) => Number(row.split(",")[1])).reduce((a, b) => a + b, 0);
const { scale } = JSON.parse(fs.readFileSync("./config.json", { encoding: "utf8" }));
const blob = fs.readFileSync("blob.bin");
fs.mkdirSync("out/sub", { recursive: true });
fs.writeFileSync("out/report.txt", `total ${total * scale}`);
fs.writeFileSync("out/sub/copy.bin", blob.subarray(250));
fs.appendFileSync("out/report.txt", "!");
fs.writeFileSync("tmp.txt", "x");
fs.rmSync("tmp.txt");
return [blob instanceof Uint8Array, blob.length, fs.existsSync("tmp.txt"),
        fs.readdirSync("."), fs.statSync("out").isDirectory(),
        fs.readFileSync("notes.txt", "utf8")];
"""
    outcome = await run(wasm_js, code, INPUTS)
    assert outcome.status is Status.OK, outcome.error
    assert outcome.result == [
        True,
        256,
        False,
        ["blob.bin", "config.json", "data", "notes.txt", "out"],
        True,
        "héllo\n",
    ]
    assert outcome.files == [
        FileData("report.txt", b"total 30!"),
        FileData("sub/copy.bin", bytes(range(250, 256))),
    ]


async def test_js_binary_out_file_is_byte_exact(wasm_js: WasmJsExecutor) -> None:
    png = png_bytes()
    code = (
        "const png = fs.readFileSync('in.png');\n"
        "fs.mkdirSync('out');\n"
        "fs.writeFileSync('out/chart.png', png);\n"
        "fs.writeFileSync('out/all.bin', new Uint8Array(Array.from({length: 256}, (_, i) => i)));\n"
    )
    outcome = await run(wasm_js, code, (FileData("in.png", png),))
    assert outcome.status is Status.OK, outcome.error
    assert outcome.files == [FileData("all.bin", bytes(range(256))), FileData("chart.png", png)]


async def test_js_copies_a_megabyte_within_the_default_limits(wasm_js: WasmJsExecutor) -> None:
    # Bytes cross as base64, turned by the engine: a loop in JavaScript took seconds
    # and ran out of memory here. A program that replaces the engine's functions
    # changes nothing of what `fs` does.
    data = os.urandom(MIB)
    code = (
        "Uint8Array.prototype.toBase64 = () => 'AAAA';\n"
        "Uint8Array.fromBase64 = () => new Uint8Array(1);\n"
        "fs.mkdirSync('out');\n"
        "fs.writeFileSync('out/copy.bin', fs.readFileSync('in.bin'));\n"
        "fs.readFileSync('out/copy.bin').length"
    )
    outcome = await run(wasm_js, code, (FileData("in.bin", data),), result_bytes=4 * MIB)
    assert outcome.status is Status.OK, outcome.error
    assert outcome.result == MIB
    assert outcome.files == [FileData("copy.bin", data)]


async def test_js_writes_keep_the_programs_output_its_own(wasm_js: WasmJsExecutor) -> None:
    # A write's bytes go out on stdout, taken by the host before the program's output:
    # what the program prints around it is all there is of it, whatever it replaced.
    code = (
        "const log = console.log;\n"
        "log('before');\n"
        "console.log = () => { throw new Error('replaced'); };\n"
        "fs.mkdirSync('out');\n"
        "fs.writeFileSync('out/empty.bin', new Uint8Array(0));\n"
        "fs.writeFileSync('out/text.txt', 'AAAA\\n');\n"
        "fs.appendFileSync('out/text.txt', new Uint8Array([0, 255]));\n"
        "log('after');\n"
    )
    outcome = await run(wasm_js, code)
    assert outcome.status is Status.OK, outcome.error
    assert outcome.stdout == "before\nafter\n"
    assert outcome.files == [FileData("empty.bin", b""), FileData("text.txt", b"AAAA\n\x00\xff")]


async def test_js_writes_up_to_the_disk_limit_and_no_further(wasm_js: WasmJsExecutor) -> None:
    data = os.urandom(2 * MIB - 64 * 1024)  # it and its copy, with their entries: within 4 MB
    code = "fs.mkdirSync('out');\nfs.writeFileSync('out/big.bin', fs.readFileSync('in.bin'));"
    files = (FileData("in.bin", data),)
    outcome = await run(wasm_js, code, files, disk_mb=4, result_bytes=4 * MIB)
    assert outcome.status is Status.OK, outcome.error
    assert outcome.files == [FileData("big.bin", data)]
    over = await run(wasm_js, code.replace("out/big.bin", "out/a.bin") + "1", files, disk_mb=3)
    assert over.status is Status.DISK_LIMIT, over


async def test_js_cannot_reach_outside_its_directory(wasm_js: WasmJsExecutor) -> None:
    code = """
const codes = {};
for (const path of ["/etc/passwd", "../x", "a/../../x", "missing.txt"]) {
  try { fs.readFileSync(path, "utf8"); codes[path] = "read"; }
  catch (error) { codes[path] = error.code; }
}
try { fs.readFileSync("data", "utf8"); } catch (error) { codes.data = error.code; }
try { fs.rmSync("data"); } catch (error) { codes.rm = error.code; }
codes
"""
    outcome = await run(wasm_js, code, (FileData("data/x", b"1"),))
    assert outcome.status is Status.OK, outcome.error
    assert outcome.result == {
        "/etc/passwd": "EACCES",
        "../x": "EACCES",
        "a/../../x": "EACCES",
        "missing.txt": "ENOENT",
        "data": "EISDIR",
        "rm": "EISDIR",
    }


async def test_js_disk_bomb_ends_at_the_disk_limit(wasm_js: WasmJsExecutor) -> None:
    code = """
const chunk = "x".repeat(1 << 20);
for (let i = 0; ; i++) {
  try { fs.writeFileSync(`f${i}`, chunk); } catch (error) { /* ignored: still stopped */ }
}
"""
    outcome = await run(wasm_js, code, timeout_ms=60_000, disk_mb=3)
    assert outcome.status is Status.DISK_LIMIT, outcome
    assert "limits.disk_mb (3 MB)" in outcome.error.message
    after = await run(wasm_js, "fs.readdirSync('.')")
    assert (after.status, after.result) == (Status.OK, []), after


async def test_js_files_are_the_executions_own(wasm_js: WasmJsExecutor) -> None:
    assert (await run(wasm_js, "fs.writeFileSync('a', 'b'); 1")).result == 1
    assert (await run(wasm_js, "fs.existsSync('a')")).result is False


# -- sessions -------------------------------------------------------------------------


async def step(session: ExecutorSession, language: str, code: str, **limits: Any) -> Outcome:
    job = Job("ex_step", language, code, Limits(**limits))
    with trio.fail_after(WAIT_S):
        return await session.run(job, NoBridge())


def _scratch_holding(executor: WasmExecutor, marker: str) -> Path:
    """The host directory of the session whose program wrote `marker`."""
    assert executor._scratch is not None
    found = [path for path in executor._scratch.root.iterdir() if (path / marker).exists()]
    assert len(found) == 1, found
    return found[0]


async def test_session_files_persist_and_move_in_and_out(
    wasm: WasmPythonExecutor, py_session: ExecutorSession
) -> None:
    await py_session.put_files([FileData("data/in.csv", b"a,b\n1,2\n")], 64 * MIB)
    first = await step(
        py_session,
        "python",
        "import os\nos.makedirs('out', exist_ok=True)\n"
        "row = open('data/in.csv').readlines()[1]\n"
        "open('out/sum.txt', 'w').write(str(sum(map(int, row.split(',')))))",
    )
    assert first.status is Status.OK, first.error
    assert first.files == [FileData("sum.txt", b"3")]
    second = await step(py_session, "python", "open('out/sum.txt').read()")
    assert second.result == "3", second
    assert await py_session.get_file("out/sum.txt") == b"3"
    assert await py_session.get_file("nothing") is None
    assert await py_session.get_file("data") is None  # a directory is no file
    listed = await py_session.list_files()
    assert [(f.path, f.size) for f in listed] == [("data/in.csv", 8), ("out/sum.txt", 1)]
    await py_session.put_files([FileData("data/in.csv", b"a,b\n5,5\n")], 64 * MIB)
    third = await step(py_session, "python", "open('data/in.csv').read()")
    assert third.result == "a,b\n5,5\n", third


async def test_session_put_refuses_dirs_links_and_the_cap(
    wasm: WasmPythonExecutor, py_session: ExecutorSession
) -> None:
    made = await step(py_session, "python", "import os\nos.makedirs('d/e')\nopen('marker', 'w')")
    assert made.status is Status.OK, made.error
    host = _scratch_holding(wasm, "marker")
    (host / "secret").write_bytes(b"s")
    os.symlink("/etc/passwd", host / "link")
    os.symlink(host / "d", host / "dlink")
    os.mkfifo(host / "fifo")
    for path in ("d", "link", "fifo", "dlink/x", "marker/x"):
        with pytest.raises(FilesRefused, match=repr(path)):
            await py_session.put_files([FileData(path, b"x")], 64 * MIB)
    with pytest.raises(FilesRefused, match="disk_mb"):
        await py_session.put_files([FileData("big", bytes(2 * MIB))], MIB)
    assert await py_session.get_file("link") is None
    assert await py_session.get_file("fifo") is None
    assert os.readlink(host / "link") == "/etc/passwd"  # untouched, not written through
    assert [f.path for f in await py_session.list_files()] == ["marker", "secret"]


async def test_session_reset_starts_an_empty_directory(py_session: ExecutorSession) -> None:
    await py_session.put_files([FileData("kept.txt", b"k")], 64 * MIB)
    assert (await step(py_session, "python", "open('kept.txt').read()")).result == "k"
    timed_out = await step(py_session, "python", "while True: pass", timeout_ms=200)
    assert timed_out.session_reset, timed_out
    assert await py_session.list_files() == []
    assert (await step(py_session, "python", "import os\nos.listdir('.')")).result == []


async def test_js_session_keeps_files_between_steps(wasm_js: WasmJsExecutor) -> None:
    session = await open_wasm_session(wasm_js)
    try:
        await session.put_files([FileData("in.json", json.dumps([1, 2]).encode())], 64 * MIB)
        first = await step(
            session,
            "javascript",
            "const xs = JSON.parse(fs.readFileSync('in.json', 'utf8'));\n"
            "fs.writeFileSync('total', String(xs[0] + xs[1]))",
        )
        assert first.status is Status.OK, first.error
        second = await step(session, "javascript", "fs.readFileSync('total', 'utf8')")
        assert second.result == "3", second
        assert await session.get_file("total") == b"3"
    finally:
        await session.aclose()
