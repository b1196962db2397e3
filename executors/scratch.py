"""A private, empty directory for each execution's files, capped in size.

A guest that may write files gets one directory of its own, made when its instance
is made (ahead of the execution) and deleted with the instance: nothing a program
writes outlives it or reaches another execution. `Scratch.usage` is what the files
take on disk, counting each entry a little, so neither large files nor many empty
ones pass the cap; a sparse file counts the blocks it really holds. Symbolic links
are never followed, here or by `shutil.rmtree`.

`ScratchDirs` owns a root directory of such directories, 0700, emptied when it is
made: whatever a crash left behind is deleted on the next start.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ENTRY_BYTES", "Scratch", "ScratchDirs"]

# What each file, directory or link counts for besides its blocks: an inode and a
# directory entry.
ENTRY_BYTES = 512
BLOCK_BYTES = 512  # the unit of st_blocks


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
    """Makes `Scratch` directories under `root` (emptied now)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(root, 0o700)

    def new(self) -> Scratch:
        return Scratch(Path(tempfile.mkdtemp(prefix="x", dir=self.root)))
