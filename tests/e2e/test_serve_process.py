"""`conduit serve` as a process: start-up messages, SIGHUP reload, SIGTERM drain."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from conduit.daemon.errors import Overloaded
from tests.e2e.helpers import CONDUIT, base_env, call, conduit_serve


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
            code = "await new Promise((r) => setTimeout(r, 1500)); return 'finished'"
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


async def test_executions_arriving_while_draining_are_refused(
    start_daemon: Any, connect: Any
) -> None:
    server, info = await start_daemon()
    client = await connect(info)
    server.executions.draining = True
    reply = await client.request("execute", {"language": "typescript", "code": "1"})
    assert reply["error"]["code"] == Overloaded.code
    assert "shutting down" in reply["error"]["message"]


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
