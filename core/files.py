"""Files in and out of an execution: which paths a program's files may have, what a
returned file looks like on the wire, and what kind of file it is.

An execution's working directory starts empty; `execute {files: [...]}` places files
in it before the program runs, and whatever the program leaves under `out/` comes back
in the result. Every path crossing the boundary, either way, is a relative path of
plain names (`data/input.csv`), checked here: no absolute path, no `..`, no empty or
`.` part, no NUL or control character, bounded in length and depth. Symbolic links and
special files are the executors' to refuse where they read a directory.

This module does no I/O and imports nothing of the project's but `core`.
"""

from __future__ import annotations

import binascii
import mimetypes
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

from conduit.core import b64

__all__ = [
    "MAX_FILES",
    "MAX_PATH_CHARS",
    "OUT_DIR",
    "FileData",
    "PathRefused",
    "ReturnedFile",
    "checked_path",
    "mime_of",
    "returned_files",
]

# Where a program puts the files it wants back, under its working directory.
OUT_DIR = "out"
# Bounds on one path: far past what a program needs, well within every file system's.
MAX_PATH_CHARS = 1024
MAX_PART_BYTES = 255
MAX_DEPTH = 32
# Files one execution may take in, or give back.
MAX_FILES = 1000

# The kinds a program's image may be, told from its first bytes: a file's name is
# the program's to choose, its bytes are what a client will decode.
_SIGNATURES = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)
_WEBP = (b"RIFF", b"WEBP")


class PathRefused(ValueError):
    """A file path that may not cross the boundary; the message names it and why."""

    def __init__(self, path: object, reason: str) -> None:
        super().__init__(f"file path {path!r} {reason}")
        self.path = path
        self.reason = reason


def checked_path(path: object) -> str:
    """`path` as a relative path of plain names joined by `/`; `PathRefused` otherwise."""
    if not isinstance(path, str) or not path:
        raise PathRefused(path, "is not a non-empty string")
    if len(path) > MAX_PATH_CHARS:
        raise PathRefused(path[:64] + "…", f"is longer than {MAX_PATH_CHARS} characters")
    if path.startswith(("/", "\\")) or (len(path) > 1 and path[1] == ":"):
        raise PathRefused(path, "is absolute; give a path relative to the working directory")
    if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in path):
        raise PathRefused(path, "holds a control character")
    parts = path.split("/")
    if len(parts) > MAX_DEPTH:
        raise PathRefused(path, f"is deeper than {MAX_DEPTH} directories")
    for part in parts:
        if part in ("", ".", ".."):
            raise PathRefused(path, "has an empty, '.' or '..' part")
        if "\\" in part:
            raise PathRefused(path, "holds a backslash; separate directories with '/'")
        if len(part.encode()) > MAX_PART_BYTES:
            raise PathRefused(path, f"has a name longer than {MAX_PART_BYTES} bytes")
    return path


@dataclass(frozen=True, slots=True)
class FileData:
    """A file's path (as `checked_path` gives it) and bytes."""

    path: str
    data: bytes

    def __repr__(self) -> str:
        return f"<FileData {self.path} {len(self.data)} bytes>"


def mime_of(path: str, data: bytes) -> str:
    """What kind of file it is: an image by its first bytes (or SVG by its name and
    text), else by its name, else `application/octet-stream`."""
    for signature, mime in _SIGNATURES:
        if data.startswith(signature):
            return mime
    if data[:4] == _WEBP[0] and data[8:12] == _WEBP[1]:
        return "image/webp"
    guessed, _ = mimetypes.guess_type(path, strict=False)
    if guessed == "image/svg+xml" and b"<svg" not in data[:4096]:
        return "application/octet-stream"
    if guessed is not None and guessed.startswith("image/") and guessed != "image/svg+xml":
        return "application/octet-stream"  # an image by name only: its bytes say otherwise
    return guessed or "application/octet-stream"


@dataclass(frozen=True, slots=True)
class ReturnedFile:
    """A file the program left under `out/`, as the result carries it. `base64` is
    None when `truncated`: the file did not fit in what was left of the result's
    bytes, so only its name, size and kind are sent."""

    path: str
    size: int
    mime: str
    base64: str | None = None
    truncated: bool = False

    def to_wire(self) -> dict[str, object]:
        return {
            "path": self.path,
            "size": self.size,
            "mime": self.mime,
            "base64": self.base64,
            "truncated": self.truncated,
        }

    @property
    def data(self) -> bytes | None:
        """The file's bytes; None when they were not sent, or are not valid base64."""
        if self.base64 is None:
            return None
        try:
            return b64.decode(self.base64)
        except (binascii.Error, ValueError):
            return None


def returned_files(files: Iterable[FileData], budget_bytes: int) -> tuple[ReturnedFile, ...]:
    """`files` as the result carries them, in path order, each whole while its base64
    fits in what is left of `budget_bytes`; the rest listed `truncated`, never
    dropped. At most MAX_FILES are listed."""
    returned = []
    left = budget_bytes
    for file in sorted(files, key=lambda f: f.path)[:MAX_FILES]:
        mime = mime_of(file.path, file.data)
        encoded_size = 4 * ((len(file.data) + 2) // 3)
        if encoded_size <= left:
            left -= encoded_size
            encoded = b64.encode(file.data)
            returned.append(ReturnedFile(file.path, len(file.data), mime, encoded))
        else:
            returned.append(ReturnedFile(file.path, len(file.data), mime, truncated=True))
    return tuple(returned)
