"""Files with real Deno: a working directory per execution, files in and out, the
disk limit, and a session's directory kept across steps.

What a program can reach outside its directory is tried in
tests/security/test_deno_sandbox.py.
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.core.files import FileData
from conduit.executors.base import FileInfo, FilesRefused, Job, Limits, Outcome, SessionSpec, Status
from conduit.executors.deno import DenoExecutor
from conduit.executors.deno_session import DenoSession
from tests.sandboxes import WAIT_S, NoBridge, wait_for

MIB = 1024 * 1024


def png(width: int, height: int) -> bytes:
    """A valid grey PNG of the given size: real image bytes, NULs and all."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\x00" + bytes((x * 7 + y) % 256 for x in range(width)) for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


@pytest.fixture
async def deno(nursery: trio.Nursery, tmp_path: Path) -> DenoExecutor:
    executor = DenoExecutor(cache_dir=tmp_path / "deno", pool_size=1, max_sessions=2)
    with trio.fail_after(WAIT_S):
        await nursery.start(executor.serve)
    return executor


async def run(
    executor: DenoExecutor, code: str, files: tuple[FileData, ...] = (), **limits: Any
) -> Outcome:
    job = Job("ex_files", "typescript", code, Limits(**limits), files=files)
    with trio.fail_after(WAIT_S):
        return await executor.run(job, NoBridge())


def scratch_root(tmp_path: Path) -> Path:
    """The executor's root of working directories (one `run-*` under `scratch`)."""
    (root,) = (tmp_path / "deno" / "scratch").glob("run-*")
    return root


# -- one execution's directory ------------------------------------------------------------


async def test_input_files_are_read_with_relative_paths(deno: DenoExecutor) -> None:
    files = (FileData("data/in.csv", b"a,b\n1,2\n"), FileData("notes.txt", "é\n".encode()))
    code = (
        "import fs from 'node:fs';\n"
        "const csv = await Deno.readTextFile('data/in.csv');\n"
        "const notes = fs.readFileSync('notes.txt', 'utf8');\n"
        "const names = [...Deno.readDirSync('.')].map((e) => e.name).sort();\n"
        "return {csv, notes, names, cwd: Deno.cwd()}"
    )
    outcome = await run(deno, code, files)
    assert outcome.status is Status.OK, outcome
    result = outcome.result
    assert (result["csv"], result["notes"]) == ("a,b\n1,2\n", "é\n")
    assert result["names"] == ["data", "notes.txt", "out"]
    assert Path(result["cwd"]).parent == scratch_root(deno._cache_dir.parent)


async def test_a_png_written_to_out_comes_back_byte_exact(deno: DenoExecutor) -> None:
    image = png(64, 48)
    code = (
        "const bytes = Uint8Array.from(inputs.png);\n"
        "await Deno.writeFile('out/chart.png', bytes);\n"
        "await Deno.mkdir('out/tables/deep', {recursive: true});\n"
        "await Deno.writeTextFile('out/tables/deep/t.csv', 'x\\n');\n"
        "await Deno.writeTextFile('not-returned.txt', 'scratch');\n"
        "return bytes.length"
    )
    job = Job("ex_png", "typescript", code, Limits(), inputs={"png": list(image)})
    with trio.fail_after(WAIT_S):
        outcome = await deno.run(job, NoBridge())
    assert (outcome.status, outcome.result) == (Status.OK, len(image)), outcome
    returned = {file.path: file.data for file in outcome.files}
    assert returned == {"chart.png": image, "tables/deep/t.csv": b"x\n"}


async def test_the_next_execution_sees_none_of_it(deno: DenoExecutor, tmp_path: Path) -> None:
    first = await run(
        deno,
        "Deno.writeTextFileSync('left.txt', 'x'); Deno.writeTextFileSync('out/o.txt', 'y');"
        "return Deno.cwd()",
        (FileData("in.txt", b"secret input"),),
    )
    assert first.status is Status.OK, first
    code = (
        "const seen = [...Deno.readDirSync('.')].map((e) => e.name);\n"
        "const out = [...Deno.readDirSync('out')].map((e) => e.name);\n"
        "let old = 'unreadable';\n"
        "try { old = String([...Deno.readDirSync(inputs)]); } catch (e) { old = e.name; }\n"
        "return {seen, out, old, cwd: Deno.cwd()}"
    )
    job = Job("ex_next", "typescript", code, Limits(), inputs=first.result)
    with trio.fail_after(WAIT_S):
        second = await deno.run(job, NoBridge())
    assert second.status is Status.OK, second
    assert second.result["seen"] == ["out"]
    assert second.result["out"] == []
    assert second.result["cwd"] != first.result
    assert second.result["old"] in ("NotFound", "NotCapable")
    assert second.files == []
    # The first worker's directory went with it; only the warm worker's is left.
    await wait_for(lambda: not Path(first.result).exists())
    await wait_for(lambda: len(list(scratch_root(tmp_path).glob("x*"))) == 1)


async def test_files_the_program_leaves_are_returned_after_an_error(deno: DenoExecutor) -> None:
    outcome = await run(
        deno, "Deno.writeTextFileSync('out/log.txt', 'so far'); throw new Error('x')"
    )
    assert outcome.status is Status.ERROR
    assert [(f.path, f.data) for f in outcome.files] == [("log.txt", b"so far")]


async def test_a_hard_link_within_is_fine_and_returned_as_a_file(deno: DenoExecutor) -> None:
    code = "Deno.writeTextFileSync('a.txt', 'linked'); Deno.linkSync('a.txt', 'out/b.txt')"
    outcome = await run(deno, code)
    assert outcome.status is Status.OK, outcome
    assert [(f.path, f.data) for f in outcome.files] == [("b.txt", b"linked")]


# -- the disk limit -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "bomb",
    [
        # Many files, each under the per-file cap: the watch stops it.
        "for (let i = 0; ; i++) Deno.writeFileSync(`f${i}`, new Uint8Array(64 * 1024));",
        # One growing file: the per-file size limit stops it if the watch has not.
        "const f = Deno.openSync('big', {write: true, create: true});\n"
        "for (;;) f.writeSync(new Uint8Array(256 * 1024));",
        # Empty directories: no bytes, but entries.
        "for (let i = 0; ; i++) Deno.mkdirSync(`d${i}`);",
    ],
    ids=["many_files", "one_file", "empty_dirs"],
)
async def test_a_disk_bomb_is_stopped_and_the_executor_serves_on(
    deno: DenoExecutor, bomb: str
) -> None:
    outcome = await run(deno, bomb, disk_mb=2, timeout_ms=20_000)
    assert outcome.status is Status.DISK_LIMIT, outcome
    assert outcome.error is not None
    assert "limits.disk_mb (2 MB)" in outcome.error.message
    assert outcome.files == []
    after = await run(deno, "return [...Deno.readDirSync('.')].length")
    assert (after.status, after.result) == (Status.OK, 1)


async def test_a_burst_past_the_limit_before_the_watch_looks_is_caught(
    deno: DenoExecutor,
) -> None:
    code = (
        # Two files, each under the per-file cap, written within a millisecond.
        "for (let i = 0; i < 2; i++) Deno.writeFileSync(`out/f${i}`, new Uint8Array(700_000));\n"
        "return 'done'"
    )
    outcome = await run(deno, code, disk_mb=1)
    assert outcome.status is Status.DISK_LIMIT, outcome
    assert outcome.files == []


async def test_within_the_limit_nothing_is_stopped(deno: DenoExecutor) -> None:
    code = "Deno.writeFileSync('out/a.bin', new Uint8Array(3 * 1024 * 1024)); return 1"
    outcome = await run(deno, code, disk_mb=4)
    assert (outcome.status, outcome.result) == (Status.OK, 1), outcome
    assert [(f.path, len(f.data)) for f in outcome.files] == [("a.bin", 3 * MIB)]


# -- a session's directory ----------------------------------------------------------------


async def open_session(executor: DenoExecutor) -> DenoSession:
    with trio.fail_after(WAIT_S):
        return await executor.open_session(SessionSpec("ses_files", "typescript", 128))


async def step(session: DenoSession, code: str, **limits: Any) -> Outcome:
    job = Job("ex_step", "typescript", code, Limits(**limits))
    with trio.fail_after(WAIT_S):
        return await session.run(job, NoBridge())


async def test_a_session_keeps_its_files_across_steps(deno: DenoExecutor) -> None:
    session = await open_session(deno)
    try:
        wrote = await step(session, "Deno.writeTextFileSync('state.txt', 'one'); return 1")
        assert wrote.status is Status.OK, wrote
        await session.put_files([FileData("data/in.csv", b"a,b\n")], 64 * MIB)
        read = await step(
            session,
            "const s = Deno.readTextFileSync('state.txt');\n"
            "const c = Deno.readTextFileSync('data/in.csv');\n"
            "Deno.writeTextFileSync('out/r.txt', s + c); return s + c",
        )
        assert (read.status, read.result, read.session_reset) == (Status.OK, "onea,b\n", False)
        assert [(f.path, f.data) for f in read.files] == [("r.txt", b"onea,b\n")]
        assert await session.get_file("out/r.txt") == b"onea,b\n"
        assert await session.list_files() == [
            FileInfo("data/in.csv", 4),
            FileInfo("out/r.txt", 7),
            FileInfo("state.txt", 3),
        ]
        assert await session.get_file("missing.txt") is None
        assert await session.get_file("out") is None
    finally:
        await session.aclose()


async def test_put_files_replaces_and_refuses_what_it_must(deno: DenoExecutor) -> None:
    session = await open_session(deno)
    try:
        await session.put_files([FileData("a.txt", b"first")], 64 * MIB)
        await session.put_files([FileData("a.txt", b"2nd")], 64 * MIB)
        assert await session.get_file("a.txt") == b"2nd"
        with pytest.raises(FilesRefused, match=re.escape("'out'")):
            await session.put_files([FileData("out", b"x")], 64 * MIB)
        with pytest.raises(FilesRefused, match=re.escape("limits.disk_mb")):
            await session.put_files([FileData("big.bin", bytes(2 * MIB))], MIB)
        assert await session.get_file("big.bin") is None
        outcome = await step(session, "Deno.linkSync('a.txt', 'hard.txt')")
        assert outcome.status is Status.OK, outcome
        workdir = session._worker.workdir  # type: ignore[union-attr]
        os.symlink("/etc/hostname", workdir / "link.txt")
        os.symlink("/etc", workdir / "etc")
        with pytest.raises(FilesRefused, match=re.escape("'link.txt'")):
            await session.put_files([FileData("link.txt", b"x")], 64 * MIB)
        with pytest.raises(FilesRefused, match=re.escape("'etc/passwd'")):
            await session.put_files([FileData("etc/passwd", b"x")], 64 * MIB)
        assert await session.get_file("link.txt") is None
        assert await session.get_file("etc/hostname") is None
        assert [f.path for f in await session.list_files()] == ["a.txt", "hard.txt"]
    finally:
        await session.aclose()


async def test_a_reset_starts_with_an_empty_directory(deno: DenoExecutor) -> None:
    session = await open_session(deno)
    try:
        await session.put_files([FileData("kept.txt", b"x")], 64 * MIB)
        assert [f.path for f in await session.list_files()] == ["kept.txt"]
        ended = await step(session, "Deno.exit(3)")
        assert ended.session_reset is True
        assert await session.list_files() == []
        after = await step(session, "return [...Deno.readDirSync('.')].map((e) => e.name)")
        assert (after.status, after.result, after.session_reset) == (Status.OK, ["out"], False)
    finally:
        await session.aclose()


async def test_a_session_step_past_its_disk_limit_resets(deno: DenoExecutor) -> None:
    session = await open_session(deno)
    try:
        bomb = "for (let i = 0; ; i++) Deno.writeFileSync(`f${i}`, new Uint8Array(65536));"
        outcome = await step(session, bomb, disk_mb=1)
        assert (outcome.status, outcome.session_reset) == (Status.DISK_LIMIT, True), outcome
        after = await step(session, "return [...Deno.readDirSync('.')].length")
        assert (after.status, after.result) == (Status.OK, 1)
    finally:
        await session.aclose()
