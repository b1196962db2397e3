"""A small synchronous client for the daemon's socket, used by the command line.

One connection, one request at a time, NDJSON both ways. Notifications that arrive
while waiting for a reply are handed to `on_notification`. Errors come back as the
`RpcError` subclass for their code, so callers catch them by kind.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from conduit.core.errors import ConduitError, RpcError
from conduit.daemon.auth import master_token_path
from conduit.daemon.config import Config, parse_tcp_address

__all__ = ["Client", "ConnectionFailed", "LoginToken", "log_in", "login_token"]


class ConnectionFailed(ConduitError):
    """The daemon could not be reached; the message says where we looked."""


@dataclass(frozen=True, slots=True)
class LoginToken:
    """A token to present with `auth/login`.

    A token the user chose (`CONDUIT_TOKEN`, `auth.token`) is always presented: it may
    name a client with narrower scopes than the peer credentials would give. The master
    token file's is a `fallback`, presented only if the connection is not authenticated
    already: on the Unix socket the daemon lets its own uid in by peer credentials, and
    the file found from this user's config may belong to another daemon than the one at
    the socket (a second daemon with a state dir of its own, a test one). Presented, it
    would be refused, and counted as a failed login.
    """

    token: str = field(repr=False)  # a secret: never in a log line or traceback
    fallback: bool = False


def login_token(config: Config) -> LoginToken | None:
    """`CONDUIT_TOKEN` (or `auth.token`), else the master token file's token if this
    user can read it, else None."""
    chosen = os.environ.get("CONDUIT_TOKEN") or config.auth.token
    if chosen:
        return LoginToken(chosen, fallback=False)
    try:
        found = master_token_path(config.auth, config.server.state_dir).read_text().strip()
    except OSError:
        return None
    return LoginToken(found, fallback=True) if found else None


def log_in(client: Client, config: Config) -> None:
    """Authenticate `client`'s connection as `login_token` says; raises the daemon's
    `RpcError` if the token is refused."""
    login = login_token(config)
    if login is None or (login.fallback and client.call("auth/whoami")["authenticated"]):
        return
    client.call("auth/login", {"token": login.token})


class Client:
    """A blocking JSON-RPC client. Use as a context manager; `close()` is idempotent."""

    def __init__(self, sock: socket.socket, *, timeout_s: float | None = None) -> None:
        self._sock = sock
        self._sock.settimeout(timeout_s)
        self._reader = sock.makefile("rb")
        self._ids = itertools.count(1)
        self.on_notification: Callable[[dict[str, Any]], None] | None = None

    @classmethod
    def connect(cls, *, unix_path: str | None = None, tcp: str | None = None) -> Client:
        """Connect to `tcp` (`HOST:PORT`) if given, else to `unix_path`.

        Raises `ConnectionFailed`, naming where it looked, if the daemon is not there.
        """
        try:
            if tcp:
                host, port = parse_tcp_address(tcp)
                return cls(socket.create_connection((host, port)))
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(unix_path))
        except OSError as exc:
            where = tcp or unix_path
            raise ConnectionFailed(
                f"cannot reach the daemon at {where}: {exc.strerror or exc}; "
                "is `conduit serve` running?"
            ) from None
        return cls(sock)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._reader.close()
        self._sock.close()

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Send one request and return its result; raises `RpcError` on an error reply."""
        ident = next(self._ids)
        message = {"jsonrpc": "2.0", "id": ident, "method": method, "params": params or {}}
        self._sock.sendall(json.dumps(message).encode() + b"\n")
        while True:
            line = self._reader.readline()
            if not line:
                raise ConnectionFailed("the daemon closed the connection before answering")
            reply = json.loads(line)
            if reply.get("id") == ident or ("error" in reply and reply.get("id") is None):
                break
            if "method" in reply and self.on_notification:
                self.on_notification(reply)
        if "error" in reply:
            raise RpcError.from_wire(reply["error"])
        return reply.get("result")
