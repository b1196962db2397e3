"""Shared by the first-request tests: a daemon whose executor is still starting, on a
machine busy with something else.

`compile_held` gives a fresh state directory the session's compiled components and
holds wasm-python's compile lock (the one daemons sharing a state directory take
turns on) until the test lets go: the daemon's start waits for it, so a request sent
meanwhile finds the executor still starting, deterministically and without the CPU a
real compile takes. `cpu_hog` keeps a core busy for as long as the test runs, as CI
machines often are.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import trio

# A daemon's start under a hog and other suites beside it can take many times what it
# takes on a quiet machine. Only a hang should reach this.
FIRST_START_WAIT_S = 300
# Generous for the same reason; a request's wait for its executor ends with the
# earlier of its timeout and the queue timeout.
REQUEST_TIMEOUT_MS = 240_000
QUEUE_TIMEOUT_S = 240


@contextmanager
def compile_held(state_dir: Path, cache: Path) -> Iterator[Callable[[], None]]:
    """`state_dir` holding the components in `cache`, compiled, with wasm-python's
    compile lock held until the `release` this yields is called or the block ends."""
    wasm = state_dir / "wasm"
    if wasm.is_symlink():  # the session's shared cache, linked in by conftest
        wasm.unlink()
    wasm.mkdir(parents=True, exist_ok=True)
    for built in cache.glob("wasm-*"):
        if built.is_dir() and not built.name.startswith("wasm-js-npm"):
            skip = shutil.ignore_patterns("*.tmp", "*.lock")
            shutil.copytree(built, wasm / built.name, ignore=skip)
    compiled = list(wasm.glob("wasm-python-*/compiled-*.cwasm"))
    assert compiled, f"the session's cache {cache} holds no compiled wasm-python"
    with ExitStack() as held:
        for path in compiled:
            lock = held.enter_context(path.with_suffix(".lock").open("w"))
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield held.close


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
