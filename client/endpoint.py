"""Where the daemon is, which token to present, and how hard to try reconnecting.

No I/O here: the clients open the sockets. `Endpoint.resolve` applies the same defaults
as the command line (`CONDUIT_SOCKET`, then the daemon's default socket path);
`resolve_token` reads `CONDUIT_TOKEN` when no token is given, and says whether the token
is presented always or only when peer credentials have not let the connection in.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from conduit.core.addresses import default_socket_path, parse_tcp_address

__all__ = [
    "CONNECT_TIMEOUT_S",
    "DEFAULT_BACKOFF",
    "DEFAULT_TIMEOUT_S",
    "Backoff",
    "Endpoint",
    "LoginToken",
    "resolve_token",
]

# A call's default wait. Every method but execute answers in milliseconds; execute's
# wait is raised to its own time limit plus queueing (calls.EXECUTE_MARGIN_S).
DEFAULT_TIMEOUT_S = 30.0
# Opening a local socket and logging in takes milliseconds; ten seconds means a daemon
# that is wedged, not one that is busy.
CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A Unix socket path, or a TCP host and port (which then wins)."""

    unix_path: str | None = None
    tcp: tuple[str, int] | None = None

    @classmethod
    def resolve(cls, *, unix_path: str | None = None, tcp: str | None = None) -> Endpoint:
        """`tcp` (`HOST:PORT`) if given, else `unix_path`, else `CONDUIT_SOCKET`, else the
        daemon's default socket path. Raises `ValueError` for a malformed `tcp`."""
        if tcp:
            return cls(tcp=parse_tcp_address(tcp))
        path = unix_path or os.environ.get("CONDUIT_SOCKET") or default_socket_path()
        return cls(unix_path=path)

    @property
    def address(self) -> str:
        """The socket path, or `HOST:PORT`, as a user would write it."""
        if self.tcp is not None:
            host, port = self.tcp
            return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return str(self.unix_path)

    def __str__(self) -> str:
        return f"tcp:{self.address}" if self.tcp is not None else f"unix:{self.address}"


@dataclass(frozen=True, slots=True)
class LoginToken:
    """A token to present with `auth/login` on each new connection.

    A `fallback` token is presented only if the connection is not authenticated already:
    on the Unix socket the daemon lets its own user in by peer credentials, and a token
    found lying about (the master token file) may belong to another daemon than the one
    at the socket. Presented, it would be refused, and counted as a failed login.
    """

    token: str = field(repr=False)  # a secret: never in a log line or traceback
    fallback: bool = False


def resolve_token(token: str | LoginToken | None) -> LoginToken | None:
    """`token` if given, else `CONDUIT_TOKEN`, else None (Unix peer credentials).

    An empty string means "present no token", even when `CONDUIT_TOKEN` is set.
    """
    if isinstance(token, LoginToken):
        return token
    if token is None:
        token = os.environ.get("CONDUIT_TOKEN")
    return LoginToken(token) if token else None


@dataclass(frozen=True, slots=True)
class Backoff:
    """How connecting retries: `attempts` tries, waiting `first_delay_s` after the first
    failure and doubling up to `max_delay_s`.

    The defaults span about three seconds: enough for a daemon being restarted by
    systemd to bind its socket again, short enough that a daemon that is simply not
    running is reported promptly.
    """

    attempts: int = 6
    first_delay_s: float = 0.1
    max_delay_s: float = 2.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"Backoff.attempts must be at least 1, got {self.attempts}")

    def delays(self) -> Iterator[float]:
        """The waits between attempts (one fewer than `attempts`)."""
        delay = self.first_delay_s
        for _ in range(self.attempts - 1):
            yield delay
            delay = min(delay * 2, self.max_delay_s)


DEFAULT_BACKOFF = Backoff()
