"""Files into and out of a working directory, host-side: links never followed,
special files never opened to block, sizes bounded."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import trio

from conduit.core.files import FileData
from conduit.executors.base import FileInfo, FilesRefused
from conduit.executors.scratch import Scratch
from conduit.executors.workdir import (
    DiskWatch,
    collect_out,
    list_files,
    place_files,
    place_files_within,
    read_file,
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "work").mkdir()
    return tmp_path / "work"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_bytes(b"secret")
    return tmp_path / "outside"


def test_files_are_placed_in_new_directories_and_replaced(root: Path) -> None:
    place_files(root, [FileData("a/b/c.txt", b"one"), FileData("top.bin", b"\x00\xff")])
    place_files(root, [FileData("a/b/c.txt", b"2")])
    assert (root / "a" / "b" / "c.txt").read_bytes() == b"2"
    assert (root / "top.bin").read_bytes() == b"\x00\xff"


def test_placing_never_follows_a_link(root: Path, outside: Path) -> None:
    (root / "dir").symlink_to(outside)
    (root / "file.txt").symlink_to(outside / "secret.txt")
    with pytest.raises(FilesRefused, match=re.escape("'dir/secret.txt'")):
        place_files(root, [FileData("dir/secret.txt", b"overwritten")])
    with pytest.raises(FilesRefused, match=re.escape("'file.txt'")):
        place_files(root, [FileData("file.txt", b"overwritten")])
    assert (outside / "secret.txt").read_bytes() == b"secret"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_placing_refuses_a_directory_or_a_fifo_without_blocking(root: Path) -> None:
    (root / "d").mkdir()
    os.mkfifo(root / "pipe")
    with pytest.raises(FilesRefused, match=re.escape("'d'")):
        place_files(root, [FileData("d", b"x")])
    with pytest.raises(FilesRefused, match=re.escape("'pipe'")):
        place_files(root, [FileData("pipe", b"x")])
    with pytest.raises(FilesRefused, match=re.escape("'../x'")):
        place_files(root, [FileData("../x", b"x")])


def test_placing_within_a_limit_counts_what_is_replaced(root: Path) -> None:
    place_files_within(root, [FileData("a.bin", bytes(40_000))], 50_000)
    place_files_within(root, [FileData("a.bin", bytes(45_000))], 50_000)
    with pytest.raises(FilesRefused, match=re.escape("limits.disk_mb")):
        place_files_within(root, [FileData("b.bin", bytes(10_000))], 50_000)
    assert not (root / "b.bin").exists()


def test_reading_returns_regular_files_only(root: Path, outside: Path) -> None:
    place_files(root, [FileData("in/a.txt", b"abc")])
    (root / "link.txt").symlink_to(outside / "secret.txt")
    (root / "linked").symlink_to(outside)
    os.mkfifo(root / "pipe")
    assert read_file(root, "in/a.txt") == b"abc"
    assert read_file(root, "in/a.txt", max_bytes=2) is None
    for path in ("link.txt", "linked/secret.txt", "pipe", "in", "missing", "../outside/secret.txt"):
        assert read_file(root, path) is None, path


def test_listing_skips_links_special_files_and_unreturnable_names(
    root: Path, outside: Path
) -> None:
    place_files(root, [FileData("b/c.txt", b"12"), FileData("a.txt", b"1")])
    (root / "link.txt").symlink_to(outside / "secret.txt")
    (root / "linked").symlink_to(outside)
    os.mkfifo(root / "pipe")
    (root / "bad\nname").write_bytes(b"x")
    (root / "empty").mkdir()
    assert list_files(root) == [FileInfo("a.txt", 1), FileInfo("b/c.txt", 2)]


def test_collecting_takes_out_only_relative_to_it_and_bounded(root: Path, outside: Path) -> None:
    place_files(
        root,
        [
            FileData("out/a.png", b"\x89PNG"),
            FileData("out/t/b.csv", b"x" * 100),
            FileData("kept.txt", b"not returned"),
        ],
    )
    (root / "out" / "link").symlink_to(outside / "secret.txt")
    assert [(f.path, f.data) for f in collect_out(root, 1000)] == [
        ("a.png", b"\x89PNG"),
        ("t/b.csv", b"x" * 100),
    ]
    assert [f.path for f in collect_out(root, 50)] == ["a.png"]


def test_an_out_that_is_a_link_gives_nothing(root: Path, outside: Path) -> None:
    (root / "out").symlink_to(outside)
    assert collect_out(root, 1000) == []


async def test_the_disk_watch_stops_a_directory_past_its_limit(root: Path) -> None:
    stopped: list[bool] = []
    watch = DiskWatch(Scratch(root), 10_000, lambda: stopped.append(True))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch.run)
        await trio.sleep(0.15)
        assert not watch.hit
        (root / "big").write_bytes(os.urandom(20_000))
        with trio.fail_after(5):
            while not watch.hit:
                await trio.sleep(0.01)
    assert stopped == [True]
    assert await watch.check()
    assert stopped == [True]
