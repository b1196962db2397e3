"""Files into and out of a sandbox's working directory, from the host's side.

A program's working directory (a `scratch.Scratch`) is the program's to shape: by the
time the host reads it, any name in it may be a link, a directory, a FIFO. So every
path is followed from a descriptor of the directory, one name at a time, with
O_NOFOLLOW: a link anywhere on the way refuses the path rather than leading out of the
directory, and only regular files are ever read or written (a FIFO is opened
non-blocking and then refused, so it cannot stall the daemon). Paths are
`core.files.checked_path` ones: relative, plain names, bounded in depth, so a walk
holds at most MAX_DEPTH descriptors.

The functions do blocking file I/O: callers run them in a worker thread.
`DiskWatch` keeps a running program's directory under its size limit.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio

from conduit.core.files import MAX_DEPTH, MAX_FILES, OUT_DIR, FileData, PathRefused, checked_path
from conduit.executors.base import FileInfo, FilesRefused
from conduit.executors.scratch import Scratch

__all__ = [
    "DiskWatch",
    "collect_out",
    "list_files",
    "place_files",
    "place_files_within",
    "read_file",
]

OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
OPEN_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
OPEN_WRITE = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# How often a running program's directory is measured against its limit.
DISK_CHECK_S = 0.1
FILE_MODE = 0o600
DIR_MODE = 0o700


def place_files(root: Path, files: Sequence[FileData]) -> None:
    """Write each of `files` at its path under `root`, making the directories on the
    way and replacing a regular file already there. Raises `FilesRefused` naming the
    path if a directory, link or special file has it, or a link is on the way."""
    for file in files:
        try:
            _place(root, checked_path(file.path), file.data)
        except PathRefused as exc:
            raise FilesRefused(str(exc)) from exc
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise FilesRefused(
                f"file path {file.path!r} cannot be written: it, or a directory on the way, "
                f"is taken by a directory, a link or a special file ({reason})"
            ) from exc


def read_file(root: Path, path: str, max_bytes: int | None = None) -> bytes | None:
    """The bytes of the regular file at `path` under `root`; None if there is none (a
    link, directory or special file is none) or it holds more than `max_bytes`."""
    try:
        parts = checked_path(path).split("/")
        with _opened_dir(root, parts[:-1], create=False) as parent:
            fd = os.open(parts[-1], OPEN_READ, dir_fd=parent)
    except (OSError, PathRefused):
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        return None
    with os.fdopen(fd, "rb") as file:
        if max_bytes is None:
            return file.read()
        data = file.read(max_bytes + 1)  # it may grow while it is read
        return None if len(data) > max_bytes else data


def list_files(root: Path) -> list[FileInfo]:
    """Every regular file under `root` whose path `checked_path` takes, in path order
    (at most MAX_FILES)."""
    found = [FileInfo(path, info.st_size) for path, info in _regular_files(root)]
    return sorted(found, key=lambda f: f.path)[:MAX_FILES]


def collect_out(root: Path, max_bytes: int) -> list[FileData]:
    """The regular files under `root`'s OUT_DIR, paths relative to it, in path order:
    at most MAX_FILES and `max_bytes` in all (those past either are left out)."""
    out = root / OUT_DIR
    collected: list[FileData] = []
    left = max_bytes
    for info in list_files(out):
        if info.size > left:
            continue
        data = read_file(out, info.path, max_bytes=left)
        if data is None or len(data) > left:
            continue
        left -= len(data)
        collected.append(FileData(info.path, data))
    return collected


def place_files_within(root: Path, files: Sequence[FileData], max_bytes: int) -> None:
    """`place_files`, refused (`FilesRefused`) if `root` would then take more than
    `max_bytes` on disk."""
    total = _usage_after(root, files)
    if total > max_bytes:
        raise FilesRefused(
            f"the files would make the working directory take {total} bytes, more than "
            f"its limit of {max_bytes} bytes (limits.disk_mb)"
        )
    place_files(root, files)


def _usage_after(root: Path, files: Sequence[FileData]) -> int:
    """What `root` would take on disk once `files` are placed: its usage now (see
    `Scratch.usage`), less the regular files they replace, plus their bytes."""
    replaced = 0
    for file in files:
        with contextlib.suppress(OSError, PathRefused):
            parts = checked_path(file.path).split("/")
            with _opened_dir(root, parts[:-1], create=False) as parent:
                info = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
            if stat.S_ISREG(info.st_mode):
                replaced += info.st_size
    added = sum(len(file.data) for file in {f.path: f for f in files}.values())
    return max(0, Scratch(root).usage() - replaced) + added


def _place(root: Path, path: str, data: bytes) -> None:
    parts = path.split("/")
    with _opened_dir(root, parts[:-1], create=True) as parent:
        fd = os.open(parts[-1], OPEN_WRITE, FILE_MODE, dir_fd=parent)
    with os.fdopen(fd, "wb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        file.truncate(0)
        file.write(data)


@contextlib.contextmanager
def _opened_dir(root: Path, parts: Sequence[str], *, create: bool) -> Iterator[int]:
    """A descriptor of the directory `root/parts...`, each part opened from its parent
    without following a link (made on the way if `create`)."""
    fd = os.open(root, OPEN_DIR)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, DIR_MODE, dir_fd=fd)
            child = os.open(part, OPEN_DIR, dir_fd=fd)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _regular_files(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """(path, stat) of each regular file under `root`, never through a link, no
    deeper than a checked path may be; nothing if `root` is not a directory."""
    try:
        fd = os.open(root, OPEN_DIR)
    except OSError:
        return
    try:
        yield from _walk(fd, "", 1)
    finally:
        os.close(fd)


def _walk(fd: int, prefix: str, depth: int) -> Iterator[tuple[str, os.stat_result]]:
    try:
        with os.scandir(fd) as listing:
            entries = list(listing)
    except OSError:
        return
    for entry in entries:
        path = prefix + entry.name
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode):
            if _is_checked(path):
                yield path, info
        elif stat.S_ISDIR(info.st_mode) and depth < MAX_DEPTH:
            try:
                child = os.open(entry.name, OPEN_DIR, dir_fd=fd)
            except OSError:
                continue
            try:
                yield from _walk(child, path + "/", depth + 1)
            finally:
                os.close(child)


def _is_checked(path: str) -> bool:
    try:
        checked_path(path)
    except PathRefused:
        return False
    return True


@dataclass(eq=False)
class DiskWatch:
    """Measures a running program's directory every DISK_CHECK_S (in a worker thread,
    as the walk is blocking I/O) and calls `stop` once it takes more than `max_bytes`.
    `run` until `done`; `check` once more after the program, for a burst written
    between two looks."""

    scratch: Scratch
    max_bytes: int
    stop: Callable[[], None]
    hit: bool = False
    _scope: trio.CancelScope = field(default_factory=trio.CancelScope)

    async def check(self) -> bool:
        """Whether the directory is (or was) past the limit; stops the program if so."""
        if not self.hit and await trio.to_thread.run_sync(self.scratch.over, self.max_bytes):
            self.hit = True
            self.stop()
        return self.hit

    async def run(self) -> None:
        with self._scope:
            while True:  # polling: a directory cannot be waited on for its size
                if await self.check():
                    return
                await trio.sleep(DISK_CHECK_S)

    def done(self) -> None:
        self._scope.cancel()
