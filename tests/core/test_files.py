"""File paths that may cross the sandbox boundary, files' kinds, and returned files
within the result's budget."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conduit.core.files import (
    MAX_PATH_CHARS,
    FileData,
    PathRefused,
    ReturnedFile,
    checked_path,
    mime_of,
    returned_files,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32


@pytest.mark.parametrize(
    "path",
    [
        "..",
        "../etc/passwd",
        "a/../../b",
        "/etc/passwd",
        "\\\\server\\share",
        "C:/Windows",
        "a//b",
        "./a",
        "a/.",
        "a/",
        "",
        "a\x00b",
        "a\nb",
        "a\\b",
        "x" * (MAX_PATH_CHARS + 1),
        "/".join(["d"] * 40),
        "n" * 300,
    ],
)
def test_a_path_that_could_leave_the_directory_or_confuse_it_is_refused(path: str) -> None:
    with pytest.raises(PathRefused) as refused:
        checked_path(path)
    # The message names the path (its head, if long) and why.
    assert str(refused.value).startswith(f"file path {repr(path[:10])[:-1]}")
    assert refused.value.reason in str(refused.value)


@pytest.mark.parametrize("path", ["a.csv", "data/input.csv", "out/chart.png", "é/ünï côde.txt"])
def test_plain_relative_paths_pass_unchanged(path: str) -> None:
    assert checked_path(path) == path


@given(st.text(max_size=80))
def test_no_accepted_path_escapes_or_is_absolute(path: str) -> None:
    try:
        checked = checked_path(path)
    except PathRefused:
        return
    parts = checked.split("/")
    assert not checked.startswith("/") and ".." not in parts and "." not in parts
    assert all(parts) and "\x00" not in checked


def test_non_strings_are_refused() -> None:
    for value in (None, 3, b"a", ["a"]):
        with pytest.raises(PathRefused):
            checked_path(value)


def test_an_image_is_told_by_its_bytes_not_its_name() -> None:
    assert mime_of("chart.png", PNG) == "image/png"
    assert mime_of("chart.bin", PNG) == "image/png"
    assert mime_of("fake.png", b"not an image") == "application/octet-stream"
    assert mime_of("photo.jpg", b"\xff\xd8\xff\xe0rest") == "image/jpeg"
    assert mime_of("plot.svg", b'<?xml version="1.0"?><svg xmlns="x"></svg>') == "image/svg+xml"
    assert mime_of("plot.svg", b"MZ\x90\x00") == "application/octet-stream"
    assert mime_of("table.csv", b"a,b\n1,2\n") == "text/csv"
    assert mime_of("blob", b"\x00\x01") == "application/octet-stream"


def test_files_past_the_budget_are_listed_truncated_never_dropped() -> None:
    files = [FileData("b.txt", b"b" * 30), FileData("a.png", PNG), FileData("c.txt", b"c" * 3)]
    # Room for a.png's base64 (56 bytes) and c.txt's (4), not b.txt's (40).
    returned = returned_files(files, budget_bytes=62)
    assert [f.path for f in returned] == ["a.png", "b.txt", "c.txt"]
    whole = {f.path: f for f in returned if not f.truncated}
    assert set(whole) == {"a.png", "c.txt"}
    assert whole["a.png"].data == PNG and whole["a.png"].mime == "image/png"
    [cut] = [f for f in returned if f.truncated]
    assert (cut.path, cut.size, cut.base64) == ("b.txt", 30, None)
    assert base64.b64decode(whole["c.txt"].base64 or "") == b"ccc"


def test_a_returned_file_that_is_not_base64_has_no_bytes() -> None:
    assert ReturnedFile("a", 3, "text/plain", "!!!").data is None
    assert ReturnedFile("a", 3, "text/plain", "YWJj").data == b"abc"
