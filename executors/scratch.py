"""A private, empty directory for each execution's files, capped in size.

A guest that may write files gets one directory of its own, made when its instance
is made (ahead of the execution) and deleted with the instance: nothing a program
writes outlives it or reaches another execution. `Scratch.usage` is what the files
take on disk, counting each entry a little, so neither large files nor many empty
ones pass the cap; a sparse file counts the blocks it really holds. Symbolic links
are never followed, here or by `shutil.rmtree`.

`ScratchDirs` makes them in a root directory of its own, 0700, under a parent that
other daemons sharing the state directory may use too. It holds a lock on its root
while it lives and deletes the root when closed; whatever a daemon that died left
behind is deleted by the next one to start, once no one holds its lock.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = ["ENTRY_BYTES", "Scratch", "ScratchDirs"]

# What each file, directory or link counts for besides its blocks: an inode and a
# directory entry.
ENTRY_BYTES = 512
BLOCK_BYTES = 512  # the unit of st_blocks
# Under the parent: each owner's root, its lock inside it, and the lock for sweeping.
ROOT_PREFIX = "run-"
OWNER_LOCK = ".owner"
SWEEP_LOCK = ".sweep.lock"


@dataclass(frozen=True, slots=True)
class Scratch:
    """One execution's directory."""

    path: Path

    def usage(self, stop_past: int | None = None) -> int:
        """Bytes the directory's contents take (see the module doc); counting stops
        once past `stop_past`. A directory that vanished or cannot be read counts 0."""
        total = 0
        pending = [str(self.path)]
        while pending:
            try:
                entries = list(os.scandir(pending.pop()))
            except OSError:
                continue
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += ENTRY_BYTES + info.st_blocks * BLOCK_BYTES
                if stat.S_ISDIR(info.st_mode):
                    pending.append(entry.path)
                if stop_past is not None and total > stop_past:
                    return total
        return total

    def over(self, max_bytes: int) -> bool:
        return self.usage(stop_past=max_bytes) > max_bytes

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


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

    def new(self) -> Scratch:
        return Scratch(Path(tempfile.mkdtemp(prefix="x", dir=self.root)))

    def close(self) -> None:
        """Delete the root and everything in it. Idempotent."""
        if self._owner is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self._owner.close()
            self._owner = None


def _sweep(parent: Path, keep: Path) -> None:
    """Delete what is under `parent` but `keep`, the lock, and roots still owned."""
    for entry in os.scandir(parent):
        path = Path(entry.path)
        if path == keep or entry.name == SWEEP_LOCK:
            continue
        if entry.name.startswith(ROOT_PREFIX) and _owned(path):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(path, ignore_errors=True)
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
