"""The `[[upstreams]]` entries of the configuration: one MCP server each.

```toml
[[upstreams]]
name = "github"
transport = "http"
url = "https://api.githubcopilot.com/mcp/"
headers = { "X-Team" = "infra" }

[[upstreams]]
name = "time"
transport = "stdio"
command = "mcp-server-time"
args = ["--local-timezone", "UTC"]
env = { "TZ" = "UTC" }
```

Validation only: this module knows nothing about processes, sockets or the SDK. Every
failure names its field, so `load_config` can turn it into one line naming the key.
`UpstreamList` is what the configuration embeds; it also refuses duplicate names.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
)

from conduit.gateway.credentials_config import CredentialsConfig

__all__ = [
    "HttpUpstreamSettings",
    "StdioUpstreamSettings",
    "UpstreamList",
    "UpstreamSettings",
]

# Upstream names become the namespace in tool ids (`<name>__<tool>`) and SDK paths
# (`tools.<name>.<tool>`): a letter first, then letters, digits, `_` and `-`; a double
# underscore would make the id ambiguous. 64 characters is plenty for a label.
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
# POSIX environment variable names; anything else is a typo or an injection attempt.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# RFC 9110 token characters: the only ones a header name may contain.
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# A generous bound for any one wait; longer is a mistake, not a slow server.
_MAX_TIMEOUT_S = 3600.0

Seconds = Annotated[float, Field(gt=0, le=_MAX_TIMEOUT_S)]


class _UpstreamBase(BaseModel):
    """Settings every transport shares."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    enabled: bool = True
    # None: the global `strict` setting decides whether tool arguments are validated.
    strict: bool | None = None
    # Generous for tools that do real work; a program's own deadline still applies.
    call_timeout_s: Seconds = 30.0
    # Bounds the handshake and then each full `tools/list` walk (all pages); servers
    # started with `npx`/`uvx` may download themselves on first start.
    list_timeout_s: Seconds = 30.0
    # How long a fetched tool schema is trusted before it is fetched again.
    schema_ttl_s: Annotated[float, Field(ge=0, le=86400)] = 300.0
    # "auto" probes the 2026-07-28 `server/discover` first and falls back to the
    # `initialize` handshake; "initialize" skips the probe, for servers that mishandle it.
    handshake: Literal["auto", "initialize"] = "auto"
    # List and call this upstream's tools by the names it gives them (`search`) instead
    # of `<name>__<tool>`, for MCP clients that expect a server's tools as it names them.
    # Programs still call `tools.<name>.<tool>`. A name another tool already has (or an
    # execute tool's) is shadowed: prefer prefixed names unless a client needs these.
    bare_names: bool = False
    # Let this upstream's tools ask the MCP client that called them for a completion
    # (sampling) or the user's input (elicitation): the capabilities are declared to it,
    # and its requests passed on (docs/mcp.md). Off, it is told no client can answer,
    # so a tool that adapts to its client does; programs in sandboxes never can.
    ask_clients: bool = False

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.fullmatch(value) or "__" in value or value.endswith("_"):
            raise ValueError(
                f"upstream name {value!r} is not usable as a tool namespace: start with a "
                "letter, then up to 63 letters, digits, '_' or '-', with no '__' and no "
                "trailing '_'"
            )
        return value


class StdioUpstreamSettings(_UpstreamBase):
    """An MCP server Conduit starts as a child process and speaks to over stdin/stdout.

    The child gets only `env` plus a few variables programs need to run (PATH, HOME,
    USER, LOGNAME, SHELL, TERM), never the daemon's own environment.
    """

    transport: Literal["stdio"] = "stdio"
    command: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None

    @field_validator("command")
    @classmethod
    def _check_command(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("command is empty: name the program that runs the MCP server")
        if "\0" in value:
            raise ValueError("command contains a NUL byte")
        return value

    @field_validator("args")
    @classmethod
    def _check_args(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any("\0" in arg for arg in value):
            raise ValueError("args may not contain NUL bytes")
        return value

    @field_validator("env")
    @classmethod
    def _check_env(cls, value: dict[str, str]) -> dict[str, str]:
        for name, setting in value.items():
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(
                    f"env variable name {name!r} is not valid: use letters, digits and '_', "
                    "not starting with a digit"
                )
            if "\0" in setting:
                raise ValueError(f"env variable {name} contains a NUL byte")
        return value

    @field_validator("cwd")
    @classmethod
    def _check_cwd(cls, value: str | None) -> str | None:
        if value is not None and not PurePosixPath(value).is_absolute():
            raise ValueError(f"cwd {value!r} is relative: give an absolute directory")
        return value


class HttpUpstreamSettings(_UpstreamBase):
    """An MCP server Conduit reaches over streamable HTTP.

    Requests go through the SSRF guard unless `trusted` is true, which is for servers
    the operator runs on loopback or a private network on purpose.
    """

    transport: Literal["http"] = "http"
    url: str
    headers: dict[str, str] = Field(default_factory=dict)
    trusted: bool = False
    # API key, bearer or OAuth2 credentials; they stay in the daemon, never in programs.
    auth: CredentialsConfig | None = None

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        try:
            parts = urlsplit(value)
            port = parts.port  # raises on a port that is not a number in range
        except ValueError as exc:
            raise ValueError(f"url {value!r} is not a valid URL: {exc}") from None
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise ValueError(f"url {value!r} must be http:// or https:// with a host")
        if parts.username is not None or parts.password is not None:
            raise ValueError(
                "url must not carry credentials (user:password@): put them in headers or auth"
            )
        if port == 0:
            raise ValueError(f"url {value!r} names port 0")
        return value

    @field_validator("headers")
    @classmethod
    def _check_headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, setting in value.items():
            if not _HEADER_NAME.fullmatch(name):
                raise ValueError(f"header name {name!r} is not a valid HTTP header name")
            if any(char in setting for char in "\r\n\0"):
                raise ValueError(f"header {name} contains a line break or NUL byte")
        return value


def _parse_upstream(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """Pick the model by `transport` by hand, so error locations read like config keys.

    A pydantic tagged union would put the tag in every location (`upstreams.0.stdio.name`,
    a key nobody wrote); errors raised here keep `upstreams.0.name`.
    """
    if isinstance(value, StdioUpstreamSettings | HttpUpstreamSettings):
        return value
    if not isinstance(value, dict):
        raise ValueError("each [[upstreams]] entry must be a table")
    model = _MODELS.get(value.get("transport"))
    if model is None:
        raise ValueError('transport must be "stdio" (with command) or "http" (with url)')
    return model.model_validate(value)


_MODELS: dict[Any, type[StdioUpstreamSettings | HttpUpstreamSettings]] = {
    "stdio": StdioUpstreamSettings,
    "http": HttpUpstreamSettings,
}

UpstreamSettings = Annotated[
    StdioUpstreamSettings | HttpUpstreamSettings, WrapValidator(_parse_upstream)
]


def _unique_names(upstreams: tuple[Any, ...]) -> tuple[Any, ...]:
    seen: set[str] = set()
    for upstream in upstreams:
        if upstream.name in seen:
            raise ValueError(
                f"upstream name {upstream.name!r} is used twice: each upstream needs its own name"
            )
        seen.add(upstream.name)
    return upstreams


# What the configuration embeds as `upstreams: UpstreamList = ()`.
UpstreamList = Annotated[tuple[UpstreamSettings, ...], AfterValidator(_unique_names)]
