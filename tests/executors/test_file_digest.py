"""Digests reused only for the very bytes they were computed from."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import BinaryIO

import pytest

from conduit.executors import file_digest
from conduit.executors.file_digest import file_version, sha256_hex


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files actually read for their digest."""
    read: list[str] = []
    real = file_digest._hash

    def spy(file: BinaryIO) -> str:
        read.append(Path(file.name).name)  # type: ignore[arg-type]
        return real(file)

    monkeypatch.setattr(file_digest, "_hash", spy)
    return read


def settle(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files look as if written long ago (the kernel's coarse times cannot blur them)."""
    later = time.time_ns() + 3600 * 10**9
    monkeypatch.setattr(file_digest, "_now_ns", lambda: later)


def test_the_digest_is_sha256_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    data = os.urandom(3 * 1024 * 1024 + 17)  # several reads' worth
    path.write_bytes(data)
    assert sha256_hex(path) == hashlib.sha256(data).hexdigest()


def test_a_settled_file_is_read_once(
    tmp_path: Path, hashed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    settle(monkeypatch)
    path = tmp_path / "settled"
    path.write_bytes(b"a" * 4096)
    assert sha256_hex(path) == sha256_hex(path) == hashlib.sha256(b"a" * 4096).hexdigest()
    assert hashed == ["settled"]


def test_a_file_just_written_is_read_every_time(tmp_path: Path, hashed: list[str]) -> None:
    path = tmp_path / "fresh"
    path.write_bytes(b"a")
    sha256_hex(path)
    sha256_hex(path)
    assert hashed == ["fresh", "fresh"]


def test_a_file_written_in_place_is_hashed_again_even_with_its_times_put_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settle(monkeypatch)
    path = tmp_path / "blob"
    path.write_bytes(b"a" * 4096)
    before = os.stat(path)
    first = sha256_hex(path)
    with open(path, "r+b") as file:  # same inode, same size
        file.seek(2048)
        file.write(b"b")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    if os.stat(path).st_ctime_ns == before.st_ctime_ns:
        pytest.skip("this file system kept the change time through a write")
    assert sha256_hex(path) == hashlib.sha256(path.read_bytes()).hexdigest() != first


def test_a_replaced_file_is_hashed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settle(monkeypatch)
    path = tmp_path / "blob"
    path.write_bytes(b"first")
    first = sha256_hex(path)
    other = tmp_path / "other"
    other.write_bytes(b"other")
    os.replace(other, path)
    assert sha256_hex(path) == hashlib.sha256(b"other").hexdigest() != first


def test_a_version_follows_links_and_changes_with_the_file(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    path.write_bytes(b"x")
    link = tmp_path / "link"
    link.symlink_to(path)
    assert file_version(link) == file_version(path)
    before = file_version(path)
    path.write_bytes(b"yy")
    assert file_version(path) != before
