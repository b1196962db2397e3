"""A working directory's files, read and written from the host, never through a link.

An execution's working directory is its scratch directory (`scratch`), which the
program writes as it likes: a link or a FIFO there is the program's, and the host,
reading or writing a file in it, must never follow the one nor block on the other.
So every path is walked from the directory's descriptor, one name at a time, each
directory opened with O_NOFOLLOW, each file opened with O_NOFOLLOW and O_NONBLOCK and
taken only if `fstat` says it is a regular file. Paths are `core.files` paths
(already checked): relative, plain names joined by "/".

Walks are iterative and go no deeper than `core.files.MAX_DEPTH` (no path deeper can
cross the boundary anyway), so a program's deep tree costs neither recursion nor more
than MAX_DEPTH + 1 open descriptors. A file is read only up to the bytes the caller
allows: a sparse file may claim a size far past what it holds.

Everything here blocks: call it in the thread that owns the directory.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from conduit.core.files import MAX_DEPTH, MAX_FILES, OUT_DIR, FileData, PathRefused, checked_path
from conduit.executors.base import FilesRefused
from conduit.executors.scratch import BLOCK_BYTES, ENTRY_BYTES, OPEN_DIR, Scratch, listing

__all__ = [
    "Entry",
    "collect",
    "cost",
    "open_dir",
    "put",
    "read",
    "regular_files",
    "stat_at",
    "untouched",
    "write",
]

OPEN_FILE = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
READ_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class Entry:
    """A regular file found by a walk: its path under the walked directory, and size."""

    path: str
    size: int


def cost(info: os.stat_result) -> int:
    """What an entry counts for against the disk cap (as `Scratch.usage` counts it)."""
    return ENTRY_BYTES + info.st_blocks * BLOCK_BYTES


def untouched(root: Path) -> bool:
    """Whether `root` holds nothing but an empty `out/` (or nothing at all), as a
    program that wrote no file leaves it: then there is nothing to collect and
    nothing over any cap. Reads at most one batch of entries of each of the two
    directories, so it may run on the event loop; False when in doubt."""
    try:
        fd = os.open(root, OPEN_DIR)
        try:
            with os.scandir(fd) as entries:
                first, second = next(entries, None), next(entries, None)
            if first is None or second is not None:
                return first is None and second is None
            if first.name != OUT_DIR:
                return False
            inside = os.open(OUT_DIR, OPEN_DIR, dir_fd=fd)  # never through a link
        finally:
            os.close(fd)
        try:
            with os.scandir(inside) as entries:
                return next(entries, None) is None
        finally:
            os.close(inside)
    except OSError:
        return False


def open_dir(
    root: Path, parts: Sequence[str], *, create: bool = False, made: list[int] | None = None
) -> int:
    """A descriptor of the directory `parts` under `root`, made (0700) where missing
    if `create` (the `cost` of each one made appended to `made`). Raises OSError:
    ENOENT, ENOTDIR, or ELOOP for a link on the way."""
    fd = os.open(root, OPEN_DIR)
    try:
        for part in parts:
            try:
                child = os.open(part, OPEN_DIR, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o700, dir_fd=fd)
                child = os.open(part, OPEN_DIR, dir_fd=fd)
                if made is not None:
                    made.append(cost(os.fstat(child)))
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def stat_at(root: Path, path: str) -> os.stat_result | None:
    """What is at `path` (a link is itself, never its target), or None if nothing."""
    *parents, name = path.split("/")
    try:
        fd = open_dir(root, parents)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None
    finally:
        os.close(fd)


def write(root: Path, path: str, data: bytes, *, append: bool = False) -> int:
    """Write `data` to the regular file at `path`, making it and its directories as
    needed; the change in what they count for (`cost`). Raises OSError: EISDIR for a
    directory there, ELOOP for a link, EINVAL for a special file."""
    *parents, name = path.split("/")
    made: list[int] = []
    fd = open_dir(root, parents, create=True, made=made)
    try:
        before = _cost_of(fd, name)
        flags = os.O_WRONLY | os.O_CREAT | OPEN_FILE | (os.O_APPEND if append else 0)
        file = os.open(name, flags, 0o600, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        _require_regular(os.fstat(file), path)
        if not append:
            os.ftruncate(file, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(file, view) :]
        return cost(os.fstat(file)) - before + sum(made)
    finally:
        os.close(file)


def put(root: Path, files: Sequence[FileData], disk_bytes: int) -> None:
    """Write `files` (replacing any by the same path), all or none: `FilesRefused`
    naming the path if one is taken by a directory, a link or a special file (or a
    directory on its way is not one), or naming the cap if the directory would then
    hold more than `disk_bytes`."""
    usage = Scratch(root).usage()
    for file in files:
        existing = _placeable(root, file.path)
        usage += ENTRY_BYTES + -(-len(file.data) // BLOCK_BYTES) * BLOCK_BYTES
        usage -= cost(existing) if existing is not None else 0
    if usage > disk_bytes:
        raise FilesRefused(
            f"the working directory would hold {usage} bytes, more than limits.disk_mb "
            f"({disk_bytes // (1024 * 1024)} MB)"
        )
    for file in files:
        try:
            write(root, file.path, file.data)
        except OSError as exc:
            raise FilesRefused(f"file {file.path!r} could not be placed: {exc}") from None


def read(root: Path, path: str, max_bytes: int) -> bytes | None:
    """The bytes of the regular file at `path`; None if there is none (a directory, a
    link or a special file is none). Raises OSError(EFBIG) past `max_bytes`."""
    *parents, name = path.split("/")
    try:
        fd = open_dir(root, parents)
    except OSError:
        return None
    try:
        file = os.open(name, os.O_RDONLY | OPEN_FILE, dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        info = os.fstat(file)
        if not stat.S_ISREG(info.st_mode):
            return None
        if info.st_size > max_bytes:
            raise OSError(errno.EFBIG, f"{path} is larger than {max_bytes} bytes")
        return _read_all(file, max_bytes)
    finally:
        os.close(file)


def regular_files(root: Path, under: Sequence[str] = ()) -> list[Entry]:
    """Every regular file under the directory `under` of `root`, as paths relative to
    it, in path order; [] if it is not a directory. Links and special files are left
    out, as are names no `core.files` path may have and files deeper than MAX_DEPTH."""
    try:
        top = open_dir(root, under)
    except OSError:
        return []
    found = [Entry(path, info.st_size) for path, info in _walk(top)]
    found.sort(key=lambda entry: entry.path)
    return found


def collect(root: Path, max_bytes: int) -> list[FileData]:
    """The regular files under `out/`, paths relative to it, in path order: at most
    MAX_FILES, and only while their bytes add up to no more than `max_bytes`."""
    collected: list[FileData] = []
    left = max_bytes
    for entry in regular_files(root, (OUT_DIR,))[:MAX_FILES]:
        if entry.size > left:
            continue
        try:
            data = read(root, f"{OUT_DIR}/{entry.path}", left)
        except OSError:
            continue
        if data is not None:
            left -= len(data)
            collected.append(FileData(entry.path, data))
    return collected


def _walk(top: int) -> Iterator[tuple[str, os.stat_result]]:
    """(path, stat) of each regular file under the directory `top` (a descriptor,
    closed here). Depth first, with one descriptor open per level."""
    stack: list[tuple[int, str, Iterator[os.DirEntry[str]]]] = []
    try:
        stack.append((top, "", iter(listing(top))))
        while stack:
            fd, prefix, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                os.close(fd)
                stack.pop()
                continue
            path = prefix + entry.name
            try:
                checked_path(path)
            except PathRefused:
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                yield path, info
            elif stat.S_ISDIR(info.st_mode) and len(stack) < MAX_DEPTH:
                try:
                    child = os.open(entry.name, OPEN_DIR, dir_fd=fd)
                except OSError:
                    continue
                stack.append((child, path + "/", iter(listing(child))))
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _placeable(root: Path, path: str) -> os.stat_result | None:
    """What is at `path` now (a regular file, or None); `FilesRefused` if something
    else is there, or on its way."""
    parts = path.split("/")
    for depth in range(1, len(parts)):
        info = stat_at(root, "/".join(parts[:depth]))
        if info is None:
            return None
        if not stat.S_ISDIR(info.st_mode):
            raise FilesRefused(f"file {path!r}: {'/'.join(parts[:depth])!r} is not a directory")
    info = stat_at(root, path)
    if info is not None and not stat.S_ISREG(info.st_mode):
        kind = "directory" if stat.S_ISDIR(info.st_mode) else "link or special file"
        raise FilesRefused(f"file {path!r}: the path is taken by a {kind}")
    return info


def _cost_of(dir_fd: int, name: str) -> int:
    try:
        return cost(os.stat(name, dir_fd=dir_fd, follow_symlinks=False))
    except FileNotFoundError:
        return 0


def _require_regular(info: os.stat_result, path: str) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", path)
    if not stat.S_ISREG(info.st_mode):
        raise OSError(errno.EINVAL, "is not a regular file", path)


def _read_all(file: int, max_bytes: int) -> bytes:
    chunks = []
    total = 0
    while chunk := os.read(file, min(READ_CHUNK, max_bytes + 1 - total)):
        chunks.append(chunk)
        total += len(chunk)
        if total > max_bytes:
            raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes")
    return b"".join(chunks)
