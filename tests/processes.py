"""Finding the processes a test started in /proc, to prove none outlives it.

Sandboxes are found as this process's `deno` children (or its `bwrap`s'); upstream
servers by a marker the test puts on their command line (`--tag WORD`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import trio

__all__ = ["deno_children", "leftovers", "leftovers_beyond", "namespaced_pids", "processes_with"]

# A SIGKILLed process is gone once its parent reaps it; that takes milliseconds.
REAP_WAIT_S = 5


def _processes() -> Iterator[tuple[int, str, str, int]]:
    """(pid, name, state, ppid) of every process, skipping any that exits as we look."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The name is parenthesised and may itself contain spaces and parentheses.
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        yield int(entry.name), name, state, int(ppid)


def deno_children() -> set[int]:
    """Pids of this process's `deno` children, zombies included: its own, and those
    inside the operating-system sandboxes it started (children of its `bwrap`s)."""
    me = os.getpid()
    processes = list(_processes())
    parents = {me} | {pid for pid, name, _, ppid in processes if name == "bwrap" and ppid == me}
    return {pid for pid, name, _, ppid in processes if name == "deno" and ppid in parents}


def namespaced_pids(pid: int) -> list[int]:
    """Process `pid`'s pid in each PID namespace it is in, outermost first (`NSpid`):
    two numbers for a process inside a sandbox's own namespace, the second 1 for its
    first process."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return [int(word) for word in line.split()[1:]]
    return [pid]


def processes_with(marker: str) -> list[int]:
    """Pids of live processes whose command line contains `marker` (zombies excluded)."""
    found = []
    for pid, _, state, _ in _processes():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # exited while we looked
        if marker.encode() in argv and state != "Z":
            found.append(pid)
    return found


async def leftovers_beyond(marker: str, expected: int) -> list[int]:
    """Processes marked `marker`, once at most `expected` remain (or REAP_WAIT_S passed)."""
    with trio.move_on_after(REAP_WAIT_S):
        while len(processes_with(marker)) > expected:
            await trio.sleep(0.02)
    return processes_with(marker)


async def leftovers(marker: str) -> list[int]:
    """Processes marked `marker` still alive after a moment for SIGKILLs to land."""
    return await leftovers_beyond(marker, 0)
