"""Sessions on every executor (issue 25): a session's step (`x += 1`), p50 and p99; a
1 MB file in and the same file back out, in a fresh sandbox (each run once the
executor's pool is full, as the trivial figures are taken: back to back, a run would
also wait for the pool to start the sandbox the last one used up); and the memory each
idle session holds, as the daemon's process tree's resident memory grows with them.
Beside the file figure, its reference: the same round trip through `wire_echo.py`,
which decodes, writes, reads and encodes the file as the daemon does and runs nothing.

Run in the agent daemon (`bench/agent_bench.py`), every executor on. Memory is read
from /proc (the daemon and every process under it), before and after opening
IDLE_SESSIONS sessions that each ran one step, then idled.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from bench.client import Client, RpcError
from bench.latency import wait_pool_full
from bench.stats import percentiles

# Each executor's language, and the step that counts (its first step defines x).
LANGUAGES = {
    "wasm-python": "python",
    "pyodide": "python",
    "wasm-js": "javascript",
    "deno": "typescript",
}
FIRST = {"python": "x = 0", "javascript": "let x = 0;", "typescript": "let x: number = 0;"}
STEP = {"python": "x += 1\nx", "javascript": "x += 1; x", "typescript": "x += 1; x"}
# Untimed steps first: a session's first steps compile what later ones reuse.
WARMUP = 5
# The targets for a step's p50, ms.
TARGETS_MS = {"wasm-python": 1.0, "wasm-js": 1.0, "deno": 3.0, "pyodide": 10.0}
FILE_BYTES = 1 << 20
FILE_TARGET_MS = 10.0
COPY = {
    "python": "import shutil, os\nos.makedirs('out', exist_ok=True)\n"
    "shutil.copy('in.bin', 'out/in.bin')",
    "javascript": "fs.mkdirSync('out', { recursive: true });\n"
    "fs.writeFileSync('out/in.bin', fs.readFileSync('in.bin'));",
    "typescript": "await Deno.mkdir('out', { recursive: true });\n"
    "await Deno.copyFile('in.bin', 'out/in.bin');",
}
IDLE_SESSIONS = 4
SETTLE_S = 2.0
WIRE_ECHO = Path(__file__).with_name("wire_echo.py")
# How long the reference server may take to start.
WIRE_ECHO_START_S = 30


async def figures(
    path: str, pools: dict[str, int], steps: int, file_runs: int, workdir: Path
) -> dict[str, Any]:
    """The figures of each executor in `pools` (name: its pool's size, 0 for none),
    and the wire form's reference (its server's socket in `workdir`)."""
    client = await Client.open(path)
    try:
        results: dict[str, Any] = {
            "targets_ms": TARGETS_MS,
            "file_target_ms": FILE_TARGET_MS,
            "wire_reference": await wire_reference(workdir, file_runs),
        }
        for name, pool in pools.items():
            results[name] = {
                "step": await _guarded(_steps(client, name, steps)),
                "file": await _guarded(_file_round_trip(client, name, pool, file_runs)),
                "idle_mb": await _guarded(_idle_memory(client, name)),
            }
        return results
    finally:
        await client.aclose()


async def _guarded(measuring: Any) -> Any:
    """The figures, or why they could not be had (an executor lacking a feature)."""
    try:
        return await measuring
    except (RpcError, AssertionError) as exc:
        return {"not_measured": str(exc)[:200]}


async def _steps(client: Client, executor: str, steps: int) -> dict[str, Any]:
    language = LANGUAGES[executor]
    session = await client.call("sessions/create", {"language": language, "executor": executor})
    session_id = session["session_id"]
    try:
        await _step(client, session_id, FIRST[language])
        for _ in range(WARMUP):
            await _step(client, session_id, STEP[language])
        samples = []
        for _ in range(steps):
            began = time.perf_counter()
            await _step(client, session_id, STEP[language])
            samples.append(time.perf_counter() - began)
        return percentiles(samples)
    finally:
        await client.call("sessions/close", {"session_id": session_id})


async def _step(client: Client, session_id: str, code: str) -> Any:
    result = await client.call("execute", {"session_id": session_id, "code": code})
    if result["status"] != "ok":
        raise AssertionError(f"a step ended {result['status']}: {result['error']}")
    return result["result"]


async def _file_round_trip(client: Client, executor: str, pool: int, runs: int) -> dict[str, Any]:
    return percentiles(await file_samples(client, executor, pool, runs))


async def file_samples(client: Client, executor: str, pool: int, runs: int) -> list[float]:
    """Seconds each of `runs` round trips of a 1 MB file took, after one untimed, each
    once the executor's pool (of `pool`) is full."""
    language = LANGUAGES[executor]
    data = os.urandom(FILE_BYTES)
    request = {
        "language": language,
        "executor": executor,
        "code": COPY[language],
        "files": [{"path": "in.bin", "base64": base64.b64encode(data).decode()}],
        "limits": {"result_bytes": 4 * FILE_BYTES},
    }
    samples = []
    for run in range(runs + 1):
        if pool:
            await wait_pool_full(client, pool, executor)
        began = time.perf_counter()
        result = await client.call("execute", request)
        elapsed = time.perf_counter() - began
        files = result.get("files") or []
        back = base64.b64decode(files[0]["base64"]) if files and files[0]["base64"] else b""
        if result["status"] != "ok" or back != data:
            raise AssertionError(f"the file did not come back whole: {result['status']}")
        if run:  # the first is a warm-up
            samples.append(elapsed)
    return samples


async def wire_reference(workdir: Path, runs: int) -> dict[str, Any]:
    """The 1 MB round trip through `wire_echo.py`: the wire form's own cost."""
    async with _wire_echo(workdir / "wire.sock") as path:
        client = await Client.open(path)
        try:
            return percentiles(await file_samples(client, "wasm-python", 0, runs))
        finally:
            await client.aclose()


@asynccontextmanager
async def _wire_echo(path: Path) -> AsyncIterator[str]:
    """The reference server, running for the block; its socket path."""
    process = await trio.lowlevel.open_process(
        [sys.executable, str(WIRE_ECHO), str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        with trio.fail_after(WIRE_ECHO_START_S):
            started = await process.stdout.receive_some()
        if started.strip() != b"ready":
            raise RuntimeError("the wire echo server did not start")
        yield str(path)
    finally:
        process.kill()
        await process.wait()


async def _idle_memory(client: Client, executor: str) -> dict[str, Any]:
    """Resident MB the daemon's process tree gains per idle session."""
    language = LANGUAGES[executor]
    pid = (await client.call("daemon/status"))["pid"]
    await trio.sleep(SETTLE_S)
    before = _tree_rss_bytes(pid)
    opened = []
    try:
        for _ in range(IDLE_SESSIONS):
            params = {"language": language, "executor": executor}
            session_id = (await client.call("sessions/create", params))["session_id"]
            opened.append(session_id)
            await _step(client, session_id, FIRST[language])
        await trio.sleep(SETTLE_S)
        after = _tree_rss_bytes(pid)
    finally:
        for session_id in opened:
            await client.call("sessions/close", {"session_id": session_id})
    return {"per_session_mb": (after - before) / IDLE_SESSIONS / (1 << 20), "n": IDLE_SESSIONS}


def _tree_rss_bytes(root: int) -> int:
    """Resident bytes of `root` and every process under it (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    total, pending = 0, [root]
    while pending:
        pid = pending.pop()
        pending.extend(children.get(pid, ()))
        try:
            pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
        total += pages * os.sysconf("SC_PAGE_SIZE")
    return total
