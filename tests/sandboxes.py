"""Shared by executor tests: a bridge that must not be called, and the sandboxes left behind."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# Generous: real Deno on a loaded two-core machine.
WAIT_S = 30


class NoBridge:
    """Programs here make no tool calls; the executor must not need the bridge."""

    session_token = "unused"
    callback = None

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        raise AssertionError("the Deno executor does not call the bridge yet")


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
