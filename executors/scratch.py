"""A private, empty directory for each execution's files, capped in size.

A guest that may write files gets one directory of its own, made when its instance
is made (ahead of the execution) and deleted with the instance: nothing a program
writes outlives it or reaches another execution. `Scratch.usage` is what the files
take on disk, counting each entry a little, so neither large files nor many empty
ones pass the cap; a sparse file counts the blocks it really holds. A program nests
its directories as deep as it likes (each opened from its parent, a guest spells no
path whole), so the tree is walked the same way, from descriptors, never by path nor
by recursion: past the longest path or the interpreter's recursion limit, its files
are still counted and removed. Symbolic links are never followed.

`ScratchDirs` makes them in a root directory of its own, 0700, under a parent that
other daemons sharing the state directory may use too. It holds a lock on its root
while it lives and deletes the root when closed; whatever a daemon that died left
behind is deleted by the next one to start, once no one holds its lock. A directory
released once nothing can write to it any more is deleted, or, when it is empty, kept
for the next execution: nothing was left in it, and making and deleting a directory
each time costs more than running a small program, most of it spent waiting on the
root's lock when several runners finish at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

__all__ = ["ENTRY_BYTES", "Scratch", "ScratchDirs", "listing"]

# What each file, directory or link counts for besides its blocks: an inode and a
# directory entry.
ENTRY_BYTES = 512
BLOCK_BYTES = 512  # the unit of st_blocks
# Under the parent: each owner's root, its lock inside it, and the lock for sweeping.
ROOT_PREFIX = "run-"
OWNER_LOCK = ".owner"
SWEEP_LOCK = ".sweep.lock"
# How a directory is opened to be walked: never through a link.
OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Empty directories kept for the next executions: one per runner that may finish at once.
SPARE_DIRS = 16


@dataclass(frozen=True, slots=True)
class Scratch:
    """One execution's directory, and the `ScratchDirs` that made it, if one did."""

    path: Path
    home: ScratchDirs | None = field(default=None, compare=False)

    def usage(self, stop_past: int | None = None) -> int:
        """Bytes the directory's contents take (see the module doc); counting stops
        once past `stop_past`. A directory that vanished or cannot be read counts 0."""
        total = 0
        try:
            for _, entry in _walk(self.path):
                if isinstance(entry, str):
                    continue
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += ENTRY_BYTES + info.st_blocks * BLOCK_BYTES
                if stop_past is not None and total > stop_past:
                    return total
        except OSError:
            pass
        return total

    def over(self, max_bytes: int) -> bool:
        return self.usage(stop_past=max_bytes) > max_bytes

    def remove(self) -> None:
        """Delete it and everything in it (once: a second call, its directory perhaps
        another execution's by then, does nothing)."""
        if self.home is None or self.home.forget(self)[0]:
            _remove(self.path)

    def release(self) -> None:
        """Done with it, and nothing can write to it any more: deleted, or given back
        to its home for another execution if it is empty (see `ScratchDirs.release`)."""
        if self.home is not None:
            self.home.release(self)
        else:
            self.remove()


class ScratchDirs:
    """Makes `Scratch` directories in a root of its own under `parent`, and deletes
    what owners that are gone left there. `close()` deletes its root."""

    def __init__(self, parent: Path) -> None:
        parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(parent, 0o700)
        # Making a root and sweeping go one at a time, so no sweep finds a root whose
        # owner has not locked it yet.
        with open(parent / SWEEP_LOCK, "a") as sweeping:
            fcntl.flock(sweeping, fcntl.LOCK_EX)
            self.root = Path(tempfile.mkdtemp(prefix=ROOT_PREFIX, dir=parent))
            self._owner: IO[str] | None = open(self.root / OWNER_LOCK, "a")  # noqa: SIM115
            fcntl.flock(self._owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _sweep(parent, keep=self.root)
        # Directories handed out, each with how it looked then (`_looks`), and those
        # given back untouched, for `new`; runner threads make and release them at once.
        self._out: dict[Path, tuple[Scratch, _Looks | None]] = {}
        self._spare: list[Path] = []
        self._closed = False
        self._lock = threading.Lock()

    def new(self) -> Scratch:
        """An empty directory, private to its execution."""
        with self._lock:
            path = self._spare.pop() if self._spare else None
        if path is None:
            path = Path(tempfile.mkdtemp(prefix="x", dir=self.root))
        scratch = Scratch(path, self)
        looks = _looks(path)
        with self._lock:
            self._out[path] = (scratch, looks)
        return scratch

    def release(self, scratch: Scratch) -> None:
        """The execution is done with `scratch` (one of these), and nothing can write
        to it any more: it is kept for another if it was never touched (empty, and
        every field of its own `stat` as when it was handed out, but its access
        time, which is reset), deleted otherwise. A directory released twice is
        let go of once."""
        path = scratch.path
        out, looked = self.forget(scratch)
        if not out:
            return  # released already: it may be another execution's now
        if looked is not None and _looks(path) == looked and _is_empty(path):
            with contextlib.suppress(OSError):
                # What a program may have set the access time to goes with it.
                os.utime(path, ns=(looked.mtime_ns, looked.mtime_ns), follow_symlinks=False)
                with self._lock:
                    if not self._closed and len(self._spare) < SPARE_DIRS:
                        self._spare.append(path)
                        return
        _remove(path)

    def forget(self, scratch: Scratch) -> tuple[bool, _Looks | None]:
        """`scratch` is no longer out: whether it was (False: let go of already), and
        how it looked when handed out (None if that could not be read)."""
        with self._lock:
            holder, looked = self._out.get(scratch.path, (None, None))
            if holder is not scratch:
                return False, None
            del self._out[scratch.path]
        return True, looked

    def close(self) -> None:
        """Delete the root and everything in it. Idempotent."""
        with self._lock:
            self._closed = True
            self._spare.clear()
        if self._owner is not None:
            _remove(self.root)
            self._owner.close()
            self._owner = None


@dataclass(frozen=True, slots=True)
class _Looks:
    """What a program can see of its directory itself, but the access time (which
    reading it moves): a directory that looks the same had nothing done to it, and
    passes nothing on. The change time moves with any change, even one undone."""

    inode: int
    device: int
    mode: int
    links: int
    owner: int
    group: int
    size: int
    blocks: int
    mtime_ns: int
    ctime_ns: int


def _looks(path: Path) -> _Looks | None:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return _Looks(
        info.st_ino,
        info.st_dev,
        info.st_mode,
        info.st_nlink,
        info.st_uid,
        info.st_gid,
        info.st_size,
        info.st_blocks,
        info.st_mtime_ns,
        info.st_ctime_ns,
    )


def _is_empty(path: Path) -> bool:
    """Whether the directory `path` has no entries (False if it cannot be read)."""
    try:
        with os.scandir(path) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def _sweep(parent: Path, keep: Path) -> None:
    """Delete what is under `parent` but `keep`, the lock, and roots still owned."""
    for entry in os.scandir(parent):
        path = Path(entry.path)
        if path == keep or entry.name == SWEEP_LOCK:
            continue
        if entry.name.startswith(ROOT_PREFIX) and _owned(path):
            continue
        if entry.is_dir(follow_symlinks=False):
            _remove(path)
        else:
            path.unlink(missing_ok=True)


def _owned(root: Path) -> bool:
    try:
        owner = open(root / OWNER_LOCK, "a")  # noqa: SIM115
    except OSError:
        return False
    with owner:
        try:
            fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False


def _remove(top: Path) -> None:
    """Delete the directory `top` and everything in it, as far as it can."""
    try:
        for fd, entry in _walk(top):
            try:
                if isinstance(entry, str):
                    os.rmdir(entry, dir_fd=fd)
                elif not entry.is_dir(follow_symlinks=False):
                    os.unlink(entry.name, dir_fd=fd)
            except OSError:
                continue
        os.rmdir(top)
    except OSError:
        pass


def _walk(top: Path) -> Iterator[tuple[int, os.DirEntry[str] | str]]:
    """Every entry under the directory `top`, depth first, with the descriptor of the
    directory holding it; once a directory's entries are done, its name (a str) with
    its parent's descriptor. A descriptor is valid until the next item.

    Links are never followed, and at most two descriptors are open however deep the
    tree: a directory is left by its `..`, checked to be the one it was entered from
    (the walk ends there if it is not: something moved the tree). Raises OSError if
    `top` cannot be opened.
    """
    fd = os.open(top, OPEN_DIR)
    # From `top` down to the directory being walked: each one's identity, the name
    # it was entered by, and its subdirectories not yet walked.
    levels: list[tuple[os.stat_result, str, list[str]]] = []
    entered = ""
    try:
        while True:
            subdirs = []
            for entry in listing(fd):
                yield fd, entry
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append(entry.name)
            levels.append((os.fstat(fd), entered, subdirs))
            # On to the next directory not yet walked, here or further up.
            while True:
                if pending := levels[-1][2]:
                    entered = pending.pop()
                    try:
                        child = os.open(entered, OPEN_DIR, dir_fd=fd)
                    except OSError:  # gone, or no longer a directory
                        continue
                    os.close(fd)
                    fd = child
                    break
                _, left, _ = levels.pop()
                if not levels:
                    return
                parent = os.open("..", OPEN_DIR, dir_fd=fd)
                os.close(fd)
                fd = parent
                if not os.path.samestat(os.fstat(fd), levels[-1][0]):
                    return
                yield fd, left
    finally:
        os.close(fd)


def listing(fd: int) -> list[os.DirEntry[str]]:
    """The entries of the directory `fd` (left open); none if it cannot be read."""
    try:
        with os.scandir(fd) as entries:
            return list(entries)
    except OSError:
        return []
