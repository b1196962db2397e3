"""Looking at this test process's children, to prove sandboxes leave nothing behind."""

from __future__ import annotations

import os
from pathlib import Path


def deno_children() -> set[int]:
    """Pids of this process's `deno` children, zombies included."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if name == "deno" and ppid == os.getpid():
            found.add(int(entry.name))
    return found
