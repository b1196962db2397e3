"""Keeping a running program's working directory under its size limit, from outside.

A program writing through the system's own calls (Deno's) cannot be stopped at the
write that passes `limits.disk_mb`: its directory is measured every DISK_CHECK_S
instead, and once more after the program ends, for a burst between two looks. A
single file is also bounded by RLIMIT_FSIZE where the executor sets it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from conduit.core.files import FileData
from conduit.executors.scratch import Scratch

__all__ = ["DISK_CHECK_S", "DiskWatch"]

# How often a running program's directory is measured against its limit.
DISK_CHECK_S = 0.1


@dataclass(eq=False)
class DiskWatch:
    """Measures a running program's directory every DISK_CHECK_S (in a worker thread,
    as the walk is blocking I/O) and calls `stop` once it takes more than `max_bytes`.
    `run` until `done`; `check` once more after the program."""

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
        """Look every DISK_CHECK_S, from one interval in: the directory starts within
        its limit, and a program done sooner is measured once, after it (`settle`)."""
        with self._scope:
            while True:  # polling: a directory cannot be waited on for its size
                await trio.sleep(DISK_CHECK_S)
                if await self.check():
                    return

    def settle(self, collect: Callable[[], list[FileData]]) -> list[FileData] | None:
        """After the program, in a worker thread: `collect()`'s files, or None if the
        directory is (or was) past the limit; the caller then calls `stop` (on the
        Trio thread: stopping may touch the process). One thread hop for both, as
        every execution pays it."""
        if not self.hit and self.scratch.over(self.max_bytes):
            self.hit = True
        return None if self.hit else collect()

    def done(self) -> None:
        self._scope.cancel()
