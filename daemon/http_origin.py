"""Which `Host` and `Origin` headers the MCP HTTP endpoint accepts: DNS rebinding.

A web page the user visits can make the browser send requests to a name its owner
points at 127.0.0.1. Such a request carries the page's own `Host` (`evil.example`) and,
as browsers send on every cross-origin POST, its `Origin`. The endpoint listens on
loopback only, so an honest `Host` names loopback (`localhost`, `127.0.0.1`, `[::1]`,
any port); an `Origin`, when present, must be loopback too or one the operator listed
(`mcp_http.allowed_origins`). Clients that are not browsers send no `Origin` at all.

This module only judges header values; the endpoint answers 403 when it refuses.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

__all__ = ["OriginPolicy"]

_LOOPBACK_NAMES = frozenset({"localhost"})
# An Origin as browsers serialize it: scheme://host[:port] and nothing else. Parsing
# anything looser (userinfo, a backslash, a path) risks reading a different host than
# a browser would, so such an Origin is refused instead.
_ORIGIN = re.compile(
    r"(?P<scheme>https?)://(?P<host>[a-z0-9.-]+|\[[0-9a-f:.]+\])(?::[0-9]{1,5})?",
    re.IGNORECASE,
)


def _is_loopback_host(host: str) -> bool:
    """Whether `host` (no port, IPv6 without brackets) names this machine's loopback."""
    host = host.lower().rstrip(".")
    if host in _LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_of(authority: str) -> str | None:
    """The host part of `host[:port]` or `[v6][:port]`; None if it is malformed."""
    if authority.startswith("["):
        end = authority.find("]")
        rest = authority[end + 1 :]
        if end < 0 or (rest and not rest.startswith(":")):
            return None
        host, port = authority[1:end], rest[1:]
    else:
        host, _, port = authority.partition(":")
    if port and not port.isdigit():
        return None
    return host or None


@dataclass(frozen=True, slots=True)
class OriginPolicy:
    """Accepts loopback `Host`s, and `Origin`s that are loopback or listed."""

    allowed_origins: frozenset[str] = frozenset()

    def refusal(self, host: str | None, origin: str | None) -> str | None:
        """Why a request with these headers is refused, or None if it is accepted."""
        name = _host_of(host) if host else None
        if name is None or not _is_loopback_host(name):
            return (
                f"forbidden: Host {host!r} is not this machine's loopback; connect to "
                "http://127.0.0.1:<port> or http://localhost:<port>"
            )
        if origin is None or origin.rstrip("/").lower() in self.allowed_origins:
            return None
        match = _ORIGIN.fullmatch(origin)
        if match is not None and _is_loopback_host(match["host"].strip("[]")):
            return None
        return (
            f"forbidden: Origin {origin!r} may not use this endpoint; list it in "
            "mcp_http.allowed_origins if it should"
        )

    @classmethod
    def from_config(cls, allowed_origins: tuple[str, ...]) -> OriginPolicy:
        return cls(frozenset(origin.rstrip("/").lower() for origin in allowed_origins))
