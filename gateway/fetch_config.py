"""The `[fetch]` section of the configuration and its host patterns, apart from the
fetch tool itself, so reading a configuration does not import an HTTP client."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["FetchConfig", "host_allowed"]

_HOST_LABELS = re.compile(
    r"^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
)


def _canonical_host(host: str) -> str:
    """Lower case, no trailing dot, IP addresses in their one standard spelling."""
    host = host.strip().lower().rstrip(".")
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return host


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _normalise_pattern(pattern: str) -> str:
    """A host pattern in canonical form; ValueError if malformed."""
    text = _canonical_host(pattern)
    name = text.removeprefix("*.")
    if text.startswith("*.") and "." not in name:
        raise ValueError(f"{pattern!r} is too broad: `*.` needs at least two labels after it")
    if not (_HOST_LABELS.match(name) or _is_ip(name)):
        raise ValueError(
            f"{pattern!r} is not a host name or `*.` suffix pattern "
            "(write internationalised names in their xn-- form)"
        )
    return text


class FetchConfig(BaseModel):
    """The `[fetch]` section: off, and every limit on, by default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    # Exact names ("api.example.com") or suffixes ("*.example.com": subdomains only).
    allowed_hosts: tuple[str, ...] = ()
    allow_http: bool = False
    methods: tuple[Literal["GET", "HEAD", "POST"], ...] = ("GET", "HEAD")
    # Ports besides 80 and 443 the SSRF guard should allow for fetches.
    extra_ports: tuple[Annotated[int, Field(ge=1, le=65535)], ...] = ()
    # 1 MiB: any API payload; a program uploading more should not go through a tool.
    max_request_bytes: Annotated[int, Field(ge=0, le=64 * 1024 * 1024)] = 1024 * 1024
    # 1 MiB: base64 makes it 1.4 MiB, well inside the daemon's 8 MiB message cap.
    max_response_bytes: Annotated[int, Field(ge=1, le=64 * 1024 * 1024)] = 1024 * 1024
    # Long enough for a slow API, short enough not to eat a program's whole budget.
    timeout_s: Annotated[float, Field(gt=0, le=600)] = 30.0

    @field_validator("allowed_hosts")
    @classmethod
    def _patterns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(_normalise_pattern(pattern) for pattern in value))

    @field_validator("methods", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return tuple(dict.fromkeys(str(method).upper() for method in value))
        return value

    @model_validator(mode="after")
    def _hosts_when_enabled(self) -> FetchConfig:
        if self.enabled and not self.allowed_hosts:
            raise ValueError("fetch is enabled but allowed_hosts is empty: list the hosts")
        return self


def host_allowed(host: str, patterns: tuple[str, ...]) -> bool:
    """Whether `host` matches an exact pattern or lies under a `*.suffix` pattern.

    `*.example.com` matches `a.example.com` and `a.b.example.com`, not `example.com`.
    """
    host = _canonical_host(host)
    for pattern in patterns:
        if pattern.startswith("*."):
            if host.endswith(pattern[1:]):
                return True
        elif host == pattern:
            return True
    return False
