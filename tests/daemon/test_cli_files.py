"""`conduit exec --out DIR` saving what a result returned: a hostile daemon or program
cannot make it write outside DIR or through a link."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from conduit.core.files import ReturnedFile
from conduit.core.results import ExecutionResult
from conduit.daemon.cli import _input_files, _save_files


def returned(path: str, data: bytes | None) -> ReturnedFile:
    encoded = None if data is None else base64.b64encode(data).decode()
    size = 0 if data is None else len(data)
    return ReturnedFile(path, size, "text/plain", encoded, truncated=data is None)


def test_files_are_saved_under_the_directory_and_hostile_paths_are_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    outside = tmp_path / "outside"
    outside.mkdir()
    out.mkdir()
    (out / "link").symlink_to(outside, target_is_directory=True)
    (out / "file-link").symlink_to(outside / "target")
    files = (
        returned("chart/a.txt", b"kept"),
        returned("../escape.txt", b"no"),
        returned("/abs.txt", b"no"),
        returned("link/through.txt", b"no"),
        returned("link/made/deep/x.txt", b"no"),
        returned("file-link", b"no"),
        returned("big.bin", None),
    )
    _save_files(ExecutionResult("ex_1", "ok", files=files), out)
    assert (out / "chart" / "a.txt").read_bytes() == b"kept"
    assert list(outside.iterdir()) == []  # not even a directory made through the link
    assert not (tmp_path / "escape.txt").exists()
    errors = capsys.readouterr().err
    for name in (
        "../escape.txt",
        "/abs.txt",
        "link/through.txt",
        "link/made",
        "file-link",
        "big.bin",
    ):
        assert name in errors


def test_input_files_are_read_by_name_or_given_a_path(tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_bytes(b"a,b\n")
    files = _input_files([str(tmp_path / "data.csv"), f"{tmp_path / 'data.csv'}:in/d.csv"])
    assert files == {"data.csv": b"a,b\n", "in/d.csv": b"a,b\n"}
