"""`conduit serve` under systemd's protocols: socket activation, readiness, watchdog, stop;
and the first request, the one that starts the daemon, getting its answer."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from tests.e2e.first_start import (
    QUEUE_TIMEOUT_S,
    REQUEST_TIMEOUT_MS,
    compile_held,
    cpu_hog,
    read_replies,
)
from tests.e2e.helpers import CONDUIT, base_env

# What systemd does between fork and exec: the listening socket becomes fd 3 and
# LISTEN_PID names the process that will run the daemon.
ACTIVATE = """
import os, sys
os.dup2(int(sys.argv[1]), 3)
os.environ["LISTEN_PID"] = str(os.getpid())
os.execv(sys.argv[2], sys.argv[2:])
"""


async def _activate(listener: socket.socket, env: dict[str, str], log: Path) -> trio.Process:
    """`conduit serve` handed `listener` as systemd hands it (fd 3), its stderr in `log`."""
    with log.open("wb") as log_file:
        return await trio.lowlevel.open_process(
            [sys.executable, "-c", ACTIVATE, str(listener.fileno()), CONDUIT, "serve"],
            env=env,
            pass_fds=[listener.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
        )


async def _next_state(notify: trio.socket.SocketType, wanted: str) -> list[str]:
    """Datagrams from the daemon until one carries `wanted`."""
    seen: list[str] = []
    with trio.fail_after(30):
        while True:
            datagram = (await notify.recv(4096)).decode()
            seen.append(datagram)
            if wanted in datagram.splitlines():
                return seen


async def test_socket_activation_readiness_watchdog_and_stop(
    tmp_path: Path, short_dir: Path
) -> None:
    listen_path = short_dir / "activated.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(listen_path))
    listener.listen()
    notify = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    await notify.bind(str(short_dir / "notify.sock"))
    env = base_env(tmp_path / "state") | {
        "LISTEN_FDS": "1",
        "LISTEN_FDNAMES": "conduit",
        "NOTIFY_SOCKET": str(short_dir / "notify.sock"),
        "WATCHDOG_USEC": "200000",
    }
    process = await _activate(listener, env, tmp_path / "daemon.log")
    listener.close()  # the daemon holds its own copy now, as under systemd
    try:
        await _next_state(notify, "READY=1")
        stream = await trio.open_unix_socket(str(listen_path))
        async with stream:
            await stream.send_all(
                b'{"id":1,"method":"execute","params":{"language":"ts","code":"7*6"}}\n'
            )
            with trio.fail_after(30):
                reply = json.loads(await stream.receive_some(65536))
        assert reply["result"]["result"] == 42
        await _next_state(notify, "WATCHDOG=1")
        process.send_signal(signal.SIGTERM)
        await _next_state(notify, "STOPPING=1")
        with trio.fail_after(30):
            assert await process.wait() == 0
    finally:
        if process.poll() is None:
            process.kill()
            await process.wait()
        notify.close()
    # The socket belongs to systemd's socket unit: the daemon must leave it in place.
    assert listen_path.exists()
    log = (tmp_path / "daemon.log").read_text()
    assert f"unix:{listen_path}" in log
    assert "LISTEN_FDS" not in os.environ


@pytest.mark.slow
async def test_the_first_request_starts_the_daemon_and_gets_its_result(
    tmp_path: Path, short_dir: Path, wasm_cache: Path
) -> None:
    """As under systemd: the request waits in the socket's backlog, its daemon starts
    with wasm-python still loading, and it gets its result rather than -32006."""
    listen_path = short_dir / "activated.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(listen_path))
    listener.listen()
    config = tmp_path / "conduit.toml"
    config.write_text(f"[limits]\nqueue_timeout_s = {QUEUE_TIMEOUT_S}\n")
    execute = {"language": "python", "code": "6 * 7", "limits": {"timeout_ms": REQUEST_TIMEOUT_MS}}
    with compile_held(tmp_path / "fresh", wasm_cache) as release:
        env = base_env(tmp_path / "fresh") | {"LISTEN_FDS": "1", "CONDUIT_CONFIG": str(config)}
        async with cpu_hog():
            client = await trio.open_unix_socket(str(listen_path))  # in the backlog
            async with client:
                # The listing comes after the request on the line: once it is answered,
                # the request has been read, and waits for the executor.
                await client.send_all(
                    json.dumps({"id": "run", "method": "execute", "params": execute}).encode()
                    + b"\n"
                    + json.dumps({"id": "list", "method": "executors/list"}).encode()
                    + b"\n"
                )
                process = await _activate(listener, env, tmp_path / "daemon.log")
                listener.close()
                try:
                    replies = await read_replies(client, 1)
                    release()
                    replies |= await read_replies(client, 1)
                finally:
                    process.send_signal(signal.SIGTERM)
                    with trio.move_on_after(30):
                        await process.wait()
                    if process.poll() is None:
                        process.kill()
                        await process.wait()
    listed = {e["name"]: e for e in replies["list"]["result"]["executors"]}
    assert listed["wasm-python"]["available"] is False  # it was still starting
    result = replies["run"].get("result")
    assert result is not None, (replies["run"], (tmp_path / "daemon.log").read_text()[-3000:])
    assert (result["status"], result["result"], result["executor"]) == ("ok", 42, "wasm-python")
    assert result["queue_ms"] > 0  # the wait for the executor is queueing
