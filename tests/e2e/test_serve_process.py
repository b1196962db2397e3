"""`conduit serve` as a process: start-up messages, SIGHUP reload, SIGTERM drain, a
state directory it refuses, and a flood of idle connections."""

from __future__ import annotations

import json
import resource
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.core.errors import Overloaded, Unauthenticated
from tests.conftest import WAIT_S, RawClient
from tests.e2e.helpers import (
    CONDUIT,
    base_env,
    call,
    conduit_serve,
    execute,
    farewells,
    wait_for_socket,
)
from tests.fixtures.mcp_echo_server import command as echo_command


def _config(tmp_path: Path, concurrency: int) -> Path:
    path = tmp_path / "conduit.toml"
    path.write_text(
        f"[limits]\nmax_concurrent_executions = {concurrency}\n"
        "[executors.deno]\npool_size = 1\n"
        "[server]\ngrace_period_s = 20\n"
    )
    return path


async def test_start_up_says_where_and_how_to_authenticate(tmp_path: Path, short_dir: Path) -> None:
    sock = str(short_dir / "c.sock")
    async with conduit_serve(tmp_path, sock) as daemon:
        assert (await call(sock, "ping"))["result"] == {}
        log = daemon.log()
    assert f"unix:{sock}" in log
    token_file = tmp_path / "state" / "master.token"
    assert str(token_file) in log
    assert token_file.read_text().strip() not in log


async def test_sighup_reloads_and_a_bad_config_keeps_the_old(
    tmp_path: Path, short_dir: Path
) -> None:
    sock = str(short_dir / "c.sock")
    config = _config(tmp_path, 3)
    async with conduit_serve(tmp_path, sock, "--config", str(config)) as daemon:
        status = await call(sock, "daemon/status")
        assert status["result"]["executions"]["capacity"] == 3
        connection = await trio.open_unix_socket(sock)  # must survive the reloads

        config.write_text(config.read_text().replace("= 3", "= 5"))
        daemon.signal(signal.SIGHUP)
        await _wait_for_executions(sock, "capacity", lambda capacity: capacity == 5)

        config.write_text("[limits]\nmax_concurrent_executions = -1\n")
        daemon.signal(signal.SIGHUP)
        reply = await call(sock, "config/reload")
        assert "config not reloaded" in reply["error"]["message"]
        assert "limits.max_concurrent_executions" in reply["error"]["message"]
        assert (await call(sock, "daemon/status"))["result"]["executions"]["capacity"] == 5

        await connection.send_all(b'{"id":9,"method":"ping"}\n')
        with trio.fail_after(10):
            assert b'"id":9' in await connection.receive_some(4096)
        await connection.aclose()
        assert daemon.process.poll() is None


async def _wait_for_executions(sock: str, key: str, predicate: Callable[[int], bool]) -> None:
    """Poll daemon/status until `predicate(executions[key])` holds."""
    with trio.fail_after(20):
        while not predicate((await call(sock, "daemon/status"))["result"]["executions"][key]):
            await trio.sleep(0.02)


async def test_sigterm_drains_running_executions_then_exits_0(
    tmp_path: Path, short_dir: Path
) -> None:
    sock = str(short_dir / "c.sock")
    config = _config(tmp_path, 2)
    async with conduit_serve(tmp_path, sock, "--config", str(config)) as daemon:
        results: list[Any] = []

        async def slow_execution() -> None:
            code = "await new Promise((r) => setTimeout(r, 1000)); return 'finished'"
            results.append(await call(sock, "execute", {"language": "typescript", "code": code}))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow_execution)
            await _wait_for_executions(sock, "running", lambda running: running >= 1)
            daemon.signal(signal.SIGTERM)
        with trio.fail_after(30):
            code = await daemon.process.wait()
    assert results[0]["result"]["status"] == "ok"
    assert results[0]["result"]["result"] == "finished"
    assert code == 0
    assert not Path(sock).exists()
    # The signal came while it ran: what finished was drained, not done before.
    drained = [event for event in _events(daemon) if event.get("msg") == "draining"]
    assert [event["running"] for event in drained] == [1]


def _events(daemon: Any) -> list[dict[str, Any]]:
    """The daemon's log, one JSON object a line."""
    return [json.loads(line) for line in daemon.log().splitlines()]


async def test_executions_arriving_while_draining_are_refused(
    start_daemon: Any, connect: Any
) -> None:
    server, info = await start_daemon()
    client = await connect(info)
    server.executions.draining = True
    reply = await client.request("execute", {"language": "typescript", "code": "1"})
    assert reply["error"]["code"] == Overloaded.code
    assert "shutting down" in reply["error"]["message"]


async def test_until_stdin_closes_stops_when_the_supervisors_pipe_closes(
    tmp_path: Path, short_dir: Path
) -> None:
    sock = str(short_dir / "c.sock")
    log = tmp_path / "daemon.log"
    command = [CONDUIT, "serve", "--socket", sock, "--until-stdin-closes"]
    with log.open("wb") as stderr:
        daemon = await trio.lowlevel.open_process(
            command, env=base_env(tmp_path / "state"), stdin=subprocess.PIPE, stderr=stderr
        )
    try:
        await wait_for_socket(sock, daemon)
        assert daemon.stdin is not None
        await daemon.stdin.send_all(b"anything written is ignored\n")
        assert (await call(sock, "ping"))["result"] == {}
        await daemon.stdin.aclose()  # as when the supervisor dies, however it does
        with trio.fail_after(WAIT_S):
            assert await daemon.wait() == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
    assert "standard input closed" in log.read_text()


async def test_a_stop_asked_while_starting_is_not_lost(tmp_path: Path, short_dir: Path) -> None:
    """Standard input at its end from the start: the daemon stops once it can."""
    command = [CONDUIT, "serve", "--socket", str(short_dir / "c.sock"), "--until-stdin-closes"]
    with trio.fail_after(WAIT_S):
        done = await trio.run_process(
            command, env=base_env(tmp_path / "state"), stdin=b"", capture_stderr=True, check=False
        )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert b"standard input closed" in done.stderr


async def test_bad_config_stops_start_up_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\nsocket_path = '/tmp/x'\n")
    process = await trio.run_process(
        [CONDUIT, "--config", str(bad), "serve"],
        capture_stderr=True,
        check=False,
        env=base_env(tmp_path / "state"),
    )
    assert process.returncode == 2
    lines = process.stderr.decode().strip().splitlines()
    assert lines == [
        f"conduit: configuration error: unknown config key server.socket_path in {bad}: "
        "remove it or check its spelling"
    ]


async def test_a_state_dir_behind_a_symlink_stops_start_up_with_one_line(
    tmp_path: Path,
) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    process = await trio.run_process(
        [CONDUIT, "serve", "--socket", str(tmp_path / "c.sock")],
        capture_stderr=True,
        check=False,
        env=base_env(link),
    )
    assert process.returncode == 2
    assert process.stderr.decode().strip().splitlines() == [
        f"conduit: configuration error: server.state_dir {link} is a symlink: point it at "
        "the real directory, which this user must own"
    ]
    assert list(real.iterdir()) == []


# ---- a flood of idle connections ---------------------------------------------------

FLOOD = 2000
# Long enough to see the flood sit there while the owner works (one execution, its
# upstream started before the flood), short enough to wait out.
FLOOD_AUTH_TIMEOUT_S = 6.0


def _flood_config(tmp_path: Path) -> Path:
    echo = echo_command()
    path = tmp_path / "conduit.toml"
    path.write_text(
        '[server]\ntcp = "127.0.0.1:0"\n'
        f"auth_timeout_s = {FLOOD_AUTH_TIMEOUT_S}\n"
        # Past max_connections (1024), so the TCP budget itself is what fills.
        f"max_unauthenticated_per_peer = {FLOOD}\n"
        '[metrics]\nlisten = "127.0.0.1:0"\n'
        "[executors.deno]\npool_size = 1\n"
        "[executors.wasm_python]\nenabled = false\n"
        "[executors.wasm_js]\nenabled = false\n"
        '[[upstreams]]\nname = "echo"\ntransport = "stdio"\n'
        f"command = {json.dumps(echo[0])}\nargs = {json.dumps(echo[1:])}\n"
    )
    return path


async def _tcp_address(daemon: Any) -> tuple[str, int]:
    """The port the daemon picked, from its start-up line (stderr is JSON lines)."""
    with trio.fail_after(30):
        while True:
            for event in _events(daemon):
                if event.get("msg") == "conduit listening":
                    tcp = next(x for x in event["listeners"].split(", ") if x.startswith("tcp:"))
                    host, port = tcp.removeprefix("tcp:").rsplit(":", 1)
                    return host, int(port)
            await trio.sleep(0.05)  # the log is a file; nothing announces a new line


async def _connect(address: tuple[str, int]) -> trio.SocketStream:
    """A bare TCP connection: the flood opens thousands, and `open_tcp_stream`'s name
    lookup and racing of addresses, meant for hostnames, would be most of their cost."""
    sock = trio.socket.socket()
    try:
        await sock.connect(address)
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)


async def _wait_upstream_ready(sock: str, name: str) -> None:
    """Return once the upstream `name` has started (a cold Python importing the MCP SDK)."""
    with trio.fail_after(60):
        while True:
            upstreams = (await call(sock, "upstreams/list"))["result"]["upstreams"]
            if any(u["name"] == name and u["state"] == "ready" for u in upstreams):
                return
            await trio.sleep(0.05)  # nothing announces a state change to a client


@pytest.mark.slow
async def test_2000_idle_tcp_connections_leave_the_owner_served_then_are_closed(
    tmp_path: Path, short_dir: Path
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    assert hard > FLOOD + 100, f"ulimit -Hn is {hard}: too low for this test"
    sock = str(short_dir / "c.sock")
    config = _flood_config(tmp_path)
    flood: list[trio.SocketStream] = []
    async with conduit_serve(tmp_path, sock, "--config", str(config)) as daemon:
        address = await _tcp_address(daemon)
        await _wait_upstream_ready(sock, "echo")  # before the auth timeouts start
        try:
            flooded_at = trio.current_time()
            with trio.fail_after(60):
                for _ in range(FLOOD):
                    flood.append(await _connect(address))
                while (await call(sock, "daemon/status"))["result"]["connections"] < 1024:
                    await trio.sleep(0.05)  # accepted by the daemon, in its own time

            assert (await call(sock, "ping"))["result"] == {}
            owner = RawClient(await trio.open_unix_socket(sock))
            try:
                code = "return (await tools.echo.add({ a: 2, b: 3 })).sum"
                result = await execute(owner, code)
                assert (result["status"], result["result"], result["tool_calls"]) == ("ok", 5, 1)
                status = await owner.call("daemon/status")
            finally:
                await owner.aclose()
            if trio.current_time() - flooded_at < FLOOD_AUTH_TIMEOUT_S:
                assert status["connections"] >= 1024 + 1  # the flood was still there

            told = await farewells(flood, FLOOD_AUTH_TIMEOUT_S + 60)
        finally:
            with trio.CancelScope(shield=True):
                for stream in flood:
                    await stream.aclose()
        codes = [line["error"]["code"] if line else None for line in told]
        # Each admitted one (1024, the budget) timed out; the rest were refused.
        assert codes.count(Unauthenticated.code) >= 1024
        assert len(codes) == FLOOD
        assert set(codes) <= {Unauthenticated.code, Overloaded.code, None}
        assert (await call(sock, "daemon/status"))["result"]["connections"] == 1
        assert daemon.process.poll() is None
