"""The Unix socket's and the state directory's permissions, stale sockets, live daemons."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.core.errors import ConfigError
from conduit.daemon.listeners import open_unix_listener, remove_socket_file
from conduit.daemon.server import Daemon

# Framing and listeners need no sandbox: no executor is started.
NO_EXECUTORS = {
    "executors": {
        "deno": {"enabled": False},
        "wasm_python": {"enabled": False},
        "wasm_js": {"enabled": False},
    }
}


async def test_socket_is_0600_in_a_0700_directory(start_daemon: Any, short_dir: Path) -> None:
    path = short_dir / "fresh" / "conduit.sock"
    _, info = await start_daemon(server={"socket": str(path)}, **NO_EXECUTORS)
    assert info.unix_path == str(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


async def test_stale_socket_file_is_replaced(
    start_daemon: Any, short_dir: Path, connect: Any
) -> None:
    path = short_dir / "conduit.sock"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(path))
    dead.close()  # the file stays, nobody listens: a daemon killed with -9
    _, info = await start_daemon(server={"socket": str(path)}, **NO_EXECUTORS)
    client = await connect(info)
    assert (await client.request("ping"))["result"] == {}


async def test_live_daemon_on_the_same_path_is_refused(daemon: Any) -> None:
    _, info = daemon
    with pytest.raises(ConfigError, match="another daemon is already listening"):
        await open_unix_listener(info.unix_path)


async def test_a_non_socket_file_is_not_clobbered(short_dir: Path) -> None:
    path = short_dir / "precious"
    path.write_text("data")
    with pytest.raises(ConfigError, match="is not a socket"):
        await open_unix_listener(str(path))
    assert path.read_text() == "data"


async def test_socket_file_is_removed_on_shutdown(start_daemon: Any, short_dir: Path) -> None:
    path = short_dir / "conduit.sock"
    server, _ = await start_daemon(server={"socket": str(path)}, **NO_EXECUTORS)
    assert path.exists()
    server.shutdown()
    with trio.fail_after(10):
        while path.exists():
            await trio.sleep(0.01)


async def test_a_stopping_daemon_leaves_the_socket_of_the_one_replacing_it(
    short_dir: Path,
) -> None:
    # A restart: the old daemon stops listening, the new one binds the same path, and
    # the old one's clean-up (which may run again, or late) must not remove the new file.
    path = short_dir / "conduit.sock"
    old = await open_unix_listener(str(path))
    remove_socket_file(old)
    await old.listener.aclose()
    new = await open_unix_listener(str(path))
    remove_socket_file(old)
    assert path.exists()
    late = await open_unix_listener(str(short_dir / "late.sock"))
    (short_dir / "late.sock").unlink()  # replaced behind its back before its clean-up
    other = await open_unix_listener(str(short_dir / "late.sock"))
    remove_socket_file(late)
    assert (short_dir / "late.sock").exists()
    for listener in (new, late, other):
        remove_socket_file(listener)
        await listener.listener.aclose()
    assert not path.exists()
    assert not (short_dir / "late.sock").exists()


async def test_an_existing_state_dir_is_made_0700(
    make_config: Callable[..., Any], tmp_path: Path
) -> None:
    state = tmp_path / "state"  # made by the fixtures with the umask's mode
    state.chmod(0o755)
    Daemon(make_config(**NO_EXECUTORS))
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    fresh = tmp_path / "new" / "state"
    Daemon(make_config(server={"state_dir": str(fresh)}, **NO_EXECUTORS))
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700


def _foreign_directory(tmp_path: Path) -> Path:
    """A directory that belongs to another uid than this process's."""
    if os.getuid() != 0:
        return Path("/")
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o755)
    os.chown(foreign, 65534, 65534)
    return foreign


async def test_a_state_dir_of_another_uid_or_behind_a_symlink_is_refused(
    make_config: Callable[..., Any], tmp_path: Path
) -> None:
    foreign = _foreign_directory(tmp_path)
    mode = stat.S_IMODE(foreign.stat().st_mode)
    with pytest.raises(ConfigError, match=r"belongs to uid \d+, not to this daemon's uid"):
        Daemon(make_config(server={"state_dir": str(foreign)}, **NO_EXECUTORS))
    assert stat.S_IMODE(foreign.stat().st_mode) == mode

    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    link = tmp_path / "linked-state"
    link.symlink_to(target, target_is_directory=True)
    with pytest.raises(ConfigError, match=r"is a symlink"):
        Daemon(make_config(server={"state_dir": str(link)}, auth={"token": ""}, **NO_EXECUTORS))
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert list(target.iterdir()) == []  # no master token written through the link
