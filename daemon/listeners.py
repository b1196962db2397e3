"""Opening the daemon's listeners: a Unix socket, loopback TCP, or systemd's sockets.

The Unix socket is created 0600 inside a 0700 directory. A socket file left by a dead
daemon is replaced; a live daemon on the same path makes start-up refuse, naming it.
Who may connect is decided later (auth), not here.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket as stdlib_socket
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

import trio

from conduit.core.errors import ConfigError

__all__ = [
    "BoundListener",
    "open_sandbox_listener",
    "open_tcp_listener",
    "open_unix_listener",
    "remove_socket_file",
]

log = logging.getLogger("conduit.listeners")

# The kernel's queue of not-yet-accepted connections; agents connect in bursts.
_BACKLOG = 512


@dataclass(slots=True)
class BoundListener:
    """A listener and what to call it: `unix` with a path, or `tcp` with host and port."""

    listener: trio.SocketListener
    transport: str
    address: str
    owned_path: str | None = None  # a socket file we created and must remove
    owned_dir: str | None = None  # a private directory we created for it
    # Which file we created (device, inode, change time: an inode number is reused
    # once freed): another daemon may have bound a new one at the same path once we
    # stopped listening, and that one is not ours.
    owned_identity: tuple[int, int, int] | None = None


def _prepare_directory(directory: Path) -> None:
    if not directory.exists():
        directory.mkdir(parents=True, mode=0o700)
        return
    mode = stat.S_IMODE(directory.stat().st_mode)
    if mode & 0o077 and directory.stat().st_uid == os.getuid() and directory.name != "tmp":
        # A directory only we use should admit only us; a shared one (/tmp) is left be.
        log.warning(
            "socket directory is accessible to others",
            extra={"directory": str(directory), "mode": oct(mode)},
        )


async def _refuse_if_live(path: Path) -> None:
    if not path.exists() and not path.is_symlink():
        return
    if not stat.S_ISSOCK(path.lstat().st_mode):
        raise ConfigError(f"{path} exists and is not a socket: remove it or choose another path")
    probe = trio.socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
    try:
        await probe.connect(str(path))
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise
        log.info("replacing stale socket file", extra={"path": str(path)})
        path.unlink(missing_ok=True)
        return
    finally:
        probe.close()
    raise ConfigError(
        f"another daemon is already listening on {path}: stop it first "
        "(or pass --socket to use another path)"
    )


async def open_unix_listener(path: str) -> BoundListener:
    """Bind and listen on `path`; raises `ConfigError` if a live daemon holds it."""
    socket_path = Path(path)
    if len(os.fsencode(socket_path)) >= 108:
        raise ConfigError(f"socket path {path} is longer than the 107 bytes Unix sockets allow")
    _prepare_directory(socket_path.parent)
    await _refuse_if_live(socket_path)
    sock = trio.socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
    previous = os.umask(0o177)
    try:
        await sock.bind(str(socket_path))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot bind the socket {path}: {exc.strerror}") from None
    finally:
        os.umask(previous)
    os.chmod(socket_path, 0o600)
    sock.listen(_BACKLOG)
    bound = BoundListener(trio.SocketListener(sock), "unix", str(socket_path), str(socket_path))
    bound.owned_identity = _identity(socket_path)
    return bound


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        info = path.lstat()
    except OSError:
        return None
    return info.st_dev, info.st_ino, info.st_ctime_ns


async def open_tcp_listener(host: str, port: int) -> BoundListener:
    """Listen on `host:port` (port 0 picks one); the bound address is in `.address`."""
    try:
        listeners = await trio.open_tcp_listeners(port, host=host, backlog=_BACKLOG)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    listener = listeners[0]
    for extra in listeners[1:]:
        await extra.aclose()
    bound_host, bound_port = listener.socket.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    return BoundListener(listener, "tcp", f"{shown}:{bound_port}")


async def open_sandbox_listener(beside: str | None) -> BoundListener:
    """The socket sandboxes call back on, in a new private directory.

    Separate from the clients' socket on purpose: a sandbox runs with the daemon's uid,
    so on the clients' socket its peer credentials would make it the master. On this
    one only session tokens count (see `Connection`). `beside` is a directory to put
    it in (the clients' socket's), else the system's temporary directory.
    """
    parent = beside if beside and len(beside) < 80 else tempfile.gettempdir()
    directory = tempfile.mkdtemp(prefix="conduit-sandbox-", dir=parent)
    try:
        bound = await open_unix_listener(os.path.join(directory, "s"))
    except BaseException:
        os.rmdir(directory)
        raise
    bound.transport = "sandbox"
    bound.owned_dir = directory
    return bound


def remove_socket_file(bound: BoundListener) -> None:
    """Remove the socket file (and directory) this daemon created, if still there and
    still the one it created; once: a later call leaves the path alone. A new daemon
    may already be listening there (a restart), and its file must survive ours."""
    path, bound.owned_path = bound.owned_path, None
    if path and _identity(Path(path)) == bound.owned_identity:
        Path(path).unlink(missing_ok=True)
    directory, bound.owned_dir = bound.owned_dir, None
    if directory:
        with contextlib.suppress(OSError):
            os.rmdir(directory)
