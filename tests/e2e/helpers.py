"""Shared by the end-to-end tests: real daemons, programs, upstreams.

`conduit_serve()` runs `conduit serve` as a real process, as systemd or a person
would; `execute()` and `wait_upstreams()` serve the tests that run it in-process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from conduit.daemon.config import load_config
from conduit.daemon.server import Daemon, ServingInfo
from tests.conftest import MASTER_TOKEN, WAIT_S, RawClient
from tests.served import Served, serving_in_a_thread

CONDUIT = str(Path(sys.executable).parent / "conduit")
START_TIMEOUT_S = 30
# A cold Python importing the MCP SDK for each upstream, on a loaded two-core machine.
UPSTREAM_WAIT_S = 60

# For a daemon that runs no program: started without the executors' processes and
# components.
NO_EXECUTORS = """\
[executors.deno]
enabled = false
[executors.wasm_python]
enabled = false
[executors.wasm_js]
enabled = false
"""


@dataclass
class RunningDaemon:
    process: trio.Process
    socket_path: str
    stderr_path: Path

    def log(self) -> str:
        return self.stderr_path.read_text()

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)


def base_env(state_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONDUIT_", "LISTEN_"))}
    env["CONDUIT_STATE_DIR"] = str(state_dir)
    return env


async def wait_for_socket(path: str, process: trio.Process) -> None:
    with trio.fail_after(START_TIMEOUT_S):
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"conduit serve exited with {process.returncode}")
            try:
                stream = await trio.open_unix_socket(path)
            except OSError:
                await trio.sleep(0.02)
                continue
            await stream.aclose()
            return


@asynccontextmanager
async def conduit_serve(
    tmp_path: Path, socket_path: str, *args: str, env: dict[str, str] | None = None
) -> AsyncIterator[RunningDaemon]:
    """Start `conduit serve`, wait until it accepts, and stop it (SIGKILL) on exit."""
    stderr_path = tmp_path / "daemon.log"
    command = [CONDUIT, *args, "serve", "--socket", socket_path]
    with stderr_path.open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            command,
            env=env or base_env(tmp_path / "state"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        await wait_for_socket(socket_path, process)
        yield RunningDaemon(process, socket_path, stderr_path)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await process.wait()


async def call(socket_path: str, method: str, params: Any = None) -> Any:
    """One request on a fresh connection; returns the whole reply."""
    client = RawClient(await trio.open_unix_socket(socket_path))
    try:
        return await client.request(method, params or {})
    finally:
        await client.aclose()


async def wait_available(socket_path: str, executor: str) -> None:
    """Return once the daemon's `executor` can run (a Wasmtime one loads its component
    after the daemon accepts; until then its language falls back to another)."""
    with trio.fail_after(120):
        while True:
            executors = (await call(socket_path, "executors/list"))["result"]["executors"]
            if any(e["name"] == executor and e["available"] for e in executors):
                return
            await trio.sleep(0.05)  # nothing announces readiness to a client


async def farewells(streams: list[trio.SocketStream], wait_s: float) -> list[Any]:
    """Each stream's one JSON line before the daemon closed it (None where it was reset
    before the line reached us), in the order they closed; fails after `wait_s`."""
    told: list[Any] = []

    async def read(stream: trio.SocketStream) -> None:
        data = b""
        try:
            while chunk := await stream.receive_some():
                data += chunk
        except trio.BrokenResourceError:
            pass
        told.append(json.loads(data) if data else None)

    with trio.fail_after(wait_s):
        async with trio.open_nursery() as nursery:
            for stream in streams:
                nursery.start_soon(read, stream)
    return told


async def execute(client: RawClient, code: str, **params: Any) -> dict[str, Any]:
    """The `execute` result of TypeScript `code`; fails the test on an error reply."""
    return await client.call("execute", {"language": "typescript", "code": code, **params})


async def wait_upstreams(
    server: Any, *names: str, state: str = "ready", restarts: int = 0
) -> list[Any]:
    """The statuses of an in-process daemon's upstreams `names`, once all are in `state`
    having restarted at least `restarts` times.

    Waiting for a restart matters after a crash: until the daemon has seen the server
    exit, the upstream still reads as ready. Fails the test after UPSTREAM_WAIT_S.
    """
    with trio.fail_after(UPSTREAM_WAIT_S):
        while True:
            reached = {
                s.name: s
                for s in server.tools.catalogue.statuses()
                if s.state == state and s.restarts >= restarts
            }
            if set(names) <= reached.keys():
                return [reached[name] for name in names]
            await trio.sleep(0.05)  # nothing announces a state change to the daemon's owner


@contextmanager
def daemon_in_a_thread(
    state_dir: Path, settings: dict[str, Any], *, upstreams: tuple[str, ...] = ()
) -> Iterator[Served[ServingInfo]]:
    """A real daemon for a module's tests, served in a thread of its own: its state in
    `state_dir` (give it the session's builds first), its socket in a short directory
    of its own, the master token, a free metrics port, and `settings` (dotted keys) on
    top. Yields once its executors are ready and the `upstreams` named are up."""
    with daemon_object_in_a_thread(state_dir, settings, upstreams=upstreams) as served:
        yield dataclasses.replace(served, value=served.value[0])  # type: ignore[arg-type]


@contextmanager
def daemon_object_in_a_thread(
    state_dir: Path, settings: dict[str, Any], *, upstreams: tuple[str, ...] = ()
) -> Iterator[Served[tuple[ServingInfo, Daemon]]]:
    """`daemon_in_a_thread`, serving the daemon's `ServingInfo` and the `Daemon` itself
    (for tests that look inside it, in its own thread: `Served.call_sync`)."""
    socket_dir = Path(tempfile.mkdtemp(prefix="cd-", dir="/tmp"))  # socket paths are short
    config = load_config(
        environ={},
        overrides={
            "server.socket": str(socket_dir / "conduit.sock"),
            "server.state_dir": str(state_dir),
            "auth.token": MASTER_TOKEN,
            "metrics.listen": "127.0.0.1:0",
            **settings,
        },
    )

    async def start(nursery: trio.Nursery) -> tuple[ServingInfo, Daemon]:
        daemon = Daemon(config)
        with trio.fail_after(WAIT_S):
            info: ServingInfo = await nursery.start(daemon.serve)
            await daemon.registry.wait_ready()
        if upstreams:
            await wait_upstreams(daemon, *upstreams)
        return info, daemon

    try:
        with serving_in_a_thread(start) as served:
            yield served
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)
