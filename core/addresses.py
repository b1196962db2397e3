"""Where the daemon lives: the default socket path and state directory, and
`HOST:PORT` addresses.

Light on purpose (standard library only): `conduit.client` imports it to find the
daemon without importing the configuration machinery.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["default_socket_path", "default_state_dir", "is_loopback", "parse_tcp_address"]


def _runtime_dir() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime)
    return Path("/tmp") / f"conduit-{os.getuid()}"


def default_socket_path() -> str:
    """`$XDG_RUNTIME_DIR/conduit/conduit.sock`, else `/tmp/conduit-<uid>/conduit.sock`."""
    base = _runtime_dir()
    # Under /tmp the per-uid directory is already ours alone; no extra level needed.
    if base.name.startswith("conduit-"):
        return str(base / "conduit.sock")
    return str(base / "conduit" / "conduit.sock")


def default_state_dir(environ: Mapping[str, str] | None = None) -> str:
    """`$XDG_STATE_HOME/conduit`, else `~/.local/state/conduit`."""
    env = os.environ if environ is None else environ
    state_home = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return str(Path(state_home) / "conduit")


def parse_tcp_address(value: str) -> tuple[str, int]:
    """Split `HOST:PORT` (IPv6 as `[::1]:PORT`) into a host and a port."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"expected HOST:PORT such as 127.0.0.1:7780, got {value!r}")
    host = host.removeprefix("[").removesuffix("]")
    number = int(port)
    if number > 65535:
        raise ValueError(f"port {number} is out of range (0-65535)")
    return host, number


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
