"""Files between the daemon and a Pyodide worker process, as its protocol carries them.

Each interpreter runs its program in a working directory of its own, in Pyodide's
in-memory file system (`shims/pyodide_files.js`): files go in with the job, and what
the program left under `out/` comes back on the line after its answer, base64-encoded
(the protocol is line-delimited JSON). That file system lives in the worker's memory,
so the interpreter bounds what a program's files take by `limits.disk_mb` and says
whether the program hit it; this module turns that into the outcome.

The bytes are the program's: paths coming back are checked as any file path crossing
the boundary (`core.files.checked_path`), and a path that fails is dropped.
"""

from __future__ import annotations

import binascii
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from conduit.core import b64, jsontext
from conduit.core.files import MAX_FILES, MAX_PATH_CHARS, FileData, PathRefused, checked_path
from conduit.core.jsontext import JsonTextError
from conduit.executors.base import FileInfo, Limits

__all__ = [
    "MIB",
    "OutFiles",
    "files_line_bytes",
    "on_the_wire",
    "out_files",
    "stored_files",
]

MIB = 1024 * 1024
# Per file, beyond its base64: its path (JSON may escape each character into six) and
# the keys around it.
_PER_FILE_BYTES = 6 * MAX_PATH_CHARS + 64


@dataclass(slots=True)
class OutFiles:
    """What the interpreter sent after a program's answer."""

    files: list[FileData] = field(default_factory=list)
    disk_full: bool = False


def on_the_wire(files: Iterable[FileData]) -> list[dict[str, str]]:
    """`files` as a job or a `put` carries them."""
    return [{"path": file.path, "base64": b64.encode(file.data)} for file in files]


def files_line_bytes(limits: Limits) -> int:
    """The longest files line a program within `limits` can have sent."""
    return (4 * limits.disk_mb * MIB) // 3 + 4 + MAX_FILES * _PER_FILE_BYTES + 64


def out_files(line: bytes) -> OutFiles | None:
    """The files line as sent, or None if it is not one."""
    try:
        message = jsontext.loads(line)
    except JsonTextError:
        return None
    if not isinstance(message, dict) or not isinstance(message.get("files"), list):
        return None
    decoded = OutFiles(disk_full=message.get("disk_full") is True)
    for entry in message["files"][:MAX_FILES]:
        file = _file_of(entry)
        if file is not None:
            decoded.files.append(file)
    return decoded


def _file_of(entry: Any) -> FileData | None:
    if not isinstance(entry, dict):
        return None
    try:
        path = checked_path(entry.get("path"))
        data = b64.decode(str(entry.get("base64")))
    except (PathRefused, binascii.Error, ValueError):
        return None
    return FileData(path, data)


def stored_files(listed: Any) -> list[FileInfo]:
    """A `list` answer's files, in path order; entries that are not files are dropped."""
    infos = []
    for entry in listed if isinstance(listed, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("path"), str):
            size = entry.get("size")
            if type(size) is int and size >= 0:
                infos.append(FileInfo(entry["path"], size))
    return sorted(infos, key=lambda info: info.path)
