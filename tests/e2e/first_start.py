"""Shared by the first-request tests: a daemon whose executor is still starting, on a
machine busy with something else.

`uncompiled_state` gives a fresh state directory the session's built components but
not their compiled forms, so the daemon's start compiles wasm-python (seconds, more
under load) and a request sent at once finds it still starting: deterministic, where a
component loaded from its compiled cache may be ready before the first request lands.
`cpu_hog` keeps a core busy for as long as the test runs, as CI machines often are.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

# Compiling wasm-python takes ~5 s on a quiet two-core machine; a hog and other suites
# beside it can make that several times longer. Only a hang should reach this.
FIRST_START_WAIT_S = 300
# Generous for the same reason; a request's wait for its executor ends with the
# earlier of its timeout and the queue timeout.
REQUEST_TIMEOUT_MS = 240_000
QUEUE_TIMEOUT_S = 240


def uncompiled_state(state_dir: Path, cache: Path) -> Path:
    """`state_dir` holding the components in `cache` without their compiled forms
    (wasm-js keeps its own: only Python's start is slowed)."""
    wasm = state_dir / "wasm"
    if wasm.is_symlink():  # the session's shared cache, linked in by conftest
        wasm.unlink()
    wasm.mkdir(parents=True, exist_ok=True)
    for built in cache.glob("wasm-*"):
        if built.is_dir() and not built.name.startswith("wasm-js-npm"):
            skip = "compiled-*" if built.name.startswith("wasm-python-") else "*.tmp"
            shutil.copytree(built, wasm / built.name, ignore=shutil.ignore_patterns(skip))
    return state_dir


@asynccontextmanager
async def cpu_hog() -> AsyncIterator[None]:
    """A shell spinning on one core until the block ends."""
    hog = await trio.lowlevel.open_process(
        ["sh", "-c", "while :; do :; done"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        hog.kill()
        with trio.CancelScope(shield=True):
            await hog.wait()


async def read_replies(stream: trio.abc.ReceiveStream, count: int) -> dict[Any, Any]:
    """The next `count` JSON-RPC replies (JSON lines) on `stream`, by id."""
    buffer = b""
    with trio.fail_after(FIRST_START_WAIT_S):
        while buffer.count(b"\n") < count:
            chunk = await stream.receive_some(65536)
            assert chunk, f"the other side closed after {buffer!r:.500}"
            buffer += chunk
    return {reply["id"]: reply for reply in map(json.loads, buffer.splitlines())}
