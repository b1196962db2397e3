"""The host side of a working directory (`workdir`, `wasm_fs`): what a program may
plant there (links out, FIFOs, sparse files, deep trees) is never followed, blocked
on or read past the cap."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from conduit.core.files import FileData
from conduit.executors import workdir
from conduit.executors.base import FilesRefused
from conduit.executors.scratch import Scratch
from conduit.executors.wasm_fs import FsError, GuestFiles


def _b64(data: bytes) -> str:
    """A write's data as the wasm-js guest sends it."""
    return base64.b64encode(data).decode("ascii")


MIB = 1024 * 1024


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the working directory, with a secret in it."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret").write_text("secret")
    return path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


def test_collect_takes_regular_files_under_out_only(root: Path, outside: Path) -> None:
    out = root / "out"
    (out / "sub").mkdir(parents=True)
    (out / "a.txt").write_bytes(b"a")
    (out / "sub" / "b.bin").write_bytes(bytes(range(256)))
    (root / "not-out.txt").write_bytes(b"n")
    os.symlink(outside / "secret", out / "link")
    os.symlink(outside, out / "dirlink")
    os.symlink("/etc/passwd", out / "passwd")
    os.mkfifo(out / "fifo")
    with open(out / "sparse", "wb") as sparse:
        sparse.truncate(1 << 40)  # claims a terabyte, holds nothing
    collected = workdir.collect(root, 16 * MIB)  # a FIFO opened to be read would block
    assert collected == [FileData("a.txt", b"a"), FileData("sub/b.bin", bytes(range(256)))]


def test_collect_stops_at_the_cap(root: Path) -> None:
    (root / "out").mkdir()
    for name in "abc":
        (root / "out" / name).write_bytes(bytes(400))
    assert [f.path for f in workdir.collect(root, 1000)] == ["a", "b"]


def test_collect_is_empty_if_out_is_a_link(root: Path, outside: Path) -> None:
    os.symlink(outside, root / "out")
    assert workdir.collect(root, MIB) == []


def test_write_never_goes_through_a_link(root: Path, outside: Path) -> None:
    os.symlink(outside / "secret", root / "file")
    os.symlink(outside, root / "dir")
    with pytest.raises(OSError, match=r"symbolic links|Not a directory"):
        workdir.write(root, "file", b"changed")
    with pytest.raises(OSError, match=r"symbolic links|Not a directory"):
        workdir.write(root, "dir/new", b"changed")
    assert (outside / "secret").read_text() == "secret"
    assert sorted(os.listdir(outside)) == ["secret"]


def test_read_refuses_links_fifos_and_files_past_the_bound(root: Path, outside: Path) -> None:
    os.symlink(outside / "secret", root / "link")
    os.mkfifo(root / "fifo")
    (root / "big").write_bytes(bytes(100))
    assert workdir.read(root, "link", MIB) is None
    assert workdir.read(root, "fifo", MIB) is None
    with pytest.raises(OSError, match="larger than 99 bytes"):
        workdir.read(root, "big", 99)
    assert workdir.read(root, "big", 100) == bytes(100)


def test_deep_trees_and_many_files_need_no_recursion(root: Path) -> None:
    fd = os.open(root, os.O_RDONLY)
    try:
        for _ in range(1200):  # far deeper than a path may be, past the recursion limit
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.close(os.open("deepest", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    finally:
        os.close(fd)
    for i in range(2000):
        (root / f"f{i}").touch()
    found = workdir.regular_files(root)
    assert len(found) == 2000
    Scratch(root).remove()
    assert not root.exists()


def test_put_is_all_or_none(root: Path) -> None:
    (root / "taken").mkdir()
    with pytest.raises(FilesRefused, match="'taken'"):
        workdir.put(root, [FileData("first", b"1"), FileData("taken", b"2")], MIB)
    assert not (root / "first").exists()
    with pytest.raises(FilesRefused, match="disk_mb"):
        workdir.put(root, [FileData("a", bytes(600)), FileData("b", bytes(600))], 2000)
    assert sorted(os.listdir(root)) == ["taken"]
    workdir.put(root, [FileData("x/y", b"1")], MIB)
    workdir.put(root, [FileData("x/y", b"22")], MIB)  # replaced
    assert (root / "x" / "y").read_bytes() == b"22"


def _guest_files(root: Path, disk_bytes: int = MIB) -> tuple[GuestFiles, list[bool]]:
    stopped: list[bool] = []
    return GuestFiles(Scratch(root), disk_bytes, lambda: stopped.append(True)), stopped


def test_guest_paths_are_relative_and_checked(root: Path) -> None:
    files, _ = _guest_files(root)
    files.call("fs/write", {"path": "./a//b.txt", "base64": _b64(b"x")})
    assert (root / "a" / "b.txt").read_text() == "x"
    assert files.call("fs/readdir", {"path": "."}) == ["a"]
    for path in ("/etc/passwd", "../x", "a/../../x", "a\\b"):
        with pytest.raises(FsError) as refused:
            files.call("fs/read", {"path": path, "encoding": "utf8"})
        assert refused.value.code == "EACCES", path


def test_guest_writes_stop_the_program_past_the_cap(root: Path) -> None:
    files, stopped = _guest_files(root, disk_bytes=64 * 1024)
    files.call("fs/write", {"path": "a", "base64": "AAAA"})
    for _ in range(3):  # rewriting the same file does not add up
        files.call("fs/write", {"path": "b", "base64": _b64(b"x" * 30_000)})
    assert stopped == []
    with pytest.raises(FsError) as full:
        files.call("fs/write", {"path": "c", "base64": _b64(b"x" * 60_000)})
    assert full.value.code == "ENOSPC" and stopped == [True]


def _pipe(files: GuestFiles, data: bytes, *pieces: bytes) -> None:
    """Announce `data`'s base64 for a write, then send it on stdout in `pieces` (all of
    it and its newline when none are given)."""
    text = _b64(data).encode()
    files.call("fs/pipe", {"path": "x", "length": len(text)})
    for piece in pieces or (text[:5], text[5:] + b"\n"):
        assert files.piped_output(piece) == len(piece)


@pytest.mark.parametrize("data", [b"", bytes(range(256)) * 3, os.urandom(100_001)])
def test_guest_piped_writes_are_byte_exact(root: Path, data: bytes) -> None:
    files, _ = _guest_files(root)
    _pipe(files, data)
    files.call("fs/write", {"path": "out/x.bin", "piped": True})
    assert (root / "out" / "x.bin").read_bytes() == data
    assert not files.piped_output(b"later\n")  # the write shut the pipe


def test_guest_pipe_takes_no_more_than_announced(root: Path) -> None:
    files, _ = _guest_files(root)
    _pipe(files, b"abc", b"YWJj\n")
    assert files.piped_output(b"more\n") == 0  # the program's output, not the file's
    files.call("fs/write", {"path": "x", "piped": True})
    assert (root / "x").read_bytes() == b"abc"


def test_guest_pipe_is_shut_by_any_call(root: Path) -> None:
    files, _ = _guest_files(root)
    _pipe(files, b"abc", b"YWJj\n")
    files.call("fs/stat", {"path": "."})
    assert not files.piped_output(b"output\n")
    with pytest.raises(FsError) as missing:  # what was piped is gone with it
        files.call("fs/write", {"path": "x", "piped": True})
    assert missing.value.code == "EIO"


def test_guest_pipe_is_refused_a_length_past_the_cap(root: Path) -> None:
    files, stopped = _guest_files(root, disk_bytes=64 * 1024)
    for length in (-4, 6, "8", None):
        with pytest.raises(FsError) as invalid:
            files.call("fs/pipe", {"path": "x", "length": length})
        assert invalid.value.code == "ERR_INVALID_ARG_TYPE"
    with pytest.raises(FsError) as full:
        files.call("fs/pipe", {"path": "x", "length": 4 * 30_000})
    assert full.value.code == "ENOSPC" and stopped == [True]
    assert not files.piped_output(b"AAAA\n")


def test_guest_rm_does_not_follow_links_inside(root: Path, outside: Path) -> None:
    (root / "d").mkdir()
    os.symlink(outside, root / "d" / "link")
    files, _ = _guest_files(root)
    files.call("fs/rm", {"path": "d", "recursive": True})
    assert not (root / "d").exists()
    assert (outside / "secret").read_text() == "secret"


def test_guest_usage_follows_mkdir_and_rm(root: Path) -> None:
    files, stopped = _guest_files(root, disk_bytes=64 * 1024)
    files.call("fs/write", {"path": "a", "base64": _b64(b"x" * 40_000)})
    with pytest.raises(FsError):  # a second one does not fit
        files.call("fs/write", {"path": "b", "base64": _b64(b"x" * 40_000)})
    files.call("fs/rm", {"path": "a"})  # it does once the first is gone
    files.call("fs/write", {"path": "b", "base64": _b64(b"x" * 40_000)})
    assert files.usage == Scratch(root).usage()
    codes = []
    for i in range(10):  # each directory counts too
        try:
            files.call("fs/mkdir", {"path": f"d/{i}", "recursive": True})
        except FsError as exc:
            codes.append(exc.code)
    assert codes and set(codes) == {"ENOSPC"}, codes
    assert stopped[:2] == [True, True]
    assert files.usage == Scratch(root).usage()


def test_untouched_is_only_an_empty_out(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    assert workdir.untouched(root)
    (root / "out").mkdir()
    assert workdir.untouched(root)
    (root / "out" / "a.txt").write_text("x")
    assert not workdir.untouched(root)
    (root / "out" / "a.txt").unlink()
    (root / "b.txt").write_text("")  # an empty file still counts against the cap
    assert not workdir.untouched(root)
    assert not workdir.untouched(tmp_path / "missing")


def test_untouched_never_follows_a_link_named_out(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    (root / "out").symlink_to(elsewhere, target_is_directory=True)
    assert not workdir.untouched(root)
    (root / "out").unlink()
    (root / "out").write_text("a file named out")
    assert not workdir.untouched(root)
