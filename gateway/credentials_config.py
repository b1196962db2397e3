"""The `auth` section of an upstream's configuration: which credentials it uses and
where their secrets come from. Apart from the credentials themselves
(`gateway.credentials`), so reading a configuration imports no HTTP client.

Every secret a section holds is registered with `conduit.core.redaction.redact` as it
is validated, and validation errors never echo their input.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from conduit.core.redaction import redact

__all__ = [
    "ApiKeyConfig",
    "BearerConfig",
    "CredentialsConfig",
    "OAuth2ClientCredentialsConfig",
    "OAuth2RefreshConfig",
]

_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


# --- configuration -------------------------------------------------------------------


class _Section(BaseModel):
    # hide_input_in_errors: a validation error must not echo a secret it was given.
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    @model_validator(mode="after")
    def _register_secrets(self) -> _Section:
        for value in self.__dict__.values():
            if isinstance(value, SecretStr):
                redact(value.get_secret_value())
        return self


# A secret file path: validated even when left at its default, so that "neither given"
# is caught by a validator whose error input is this path, never the secret itself.
_SecretFile = Annotated[str, Field(validate_default=True)]


def _one_of(name: str, *, required: bool = True) -> Any:
    """A validator for `<name>_file`: at most (or, if `required`, exactly) one of the two."""

    def check(cls: type, path: str, info: ValidationInfo) -> str:
        given = info.data.get(name) is not None, bool(path)
        if all(given):
            raise ValueError(f"set `{name}` or `{name}_file`, not both")
        if required and not any(given):
            raise ValueError(f"set `{name}` or `{name}_file`")
        return path

    return field_validator(f"{name}_file")(classmethod(check))


def _check_token_url(url: str) -> str:
    """https, or http to a loopback literal only (a local identity provider in testing)."""
    import httpx  # here, not at the top: reading a configuration needs no HTTP client

    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ValueError(f"token_url is not a URL: {exc}") from None
    if not parsed.host:
        raise ValueError("token_url has no host")
    if parsed.userinfo:
        raise ValueError("token_url may not carry credentials; use client_id/client_secret")
    loopback = parsed.host in ("127.0.0.1", "::1", "localhost")
    if parsed.scheme != "https" and not (parsed.scheme == "http" and loopback):
        raise ValueError("token_url must be https (http only to 127.0.0.1, ::1 or localhost)")
    return url


class ApiKeyConfig(_Section):
    """`{type = "api_key", header = "X-API-Key", value = "${KEY}"}` (or `value_file`)."""

    type: Literal["api_key"]
    header: Annotated[str, Field(min_length=1, max_length=128, pattern=_HEADER_NAME.pattern)]
    value: SecretStr | None = None
    value_file: _SecretFile = ""

    _one_value = _one_of("value")


class BearerConfig(_Section):
    """`{type = "bearer", token = "${TOKEN}"}` (or `token_file`): `Authorization: Bearer`."""

    type: Literal["bearer"]
    token: SecretStr | None = None
    token_file: _SecretFile = ""

    _one_token = _one_of("token")


class _OAuth2Section(_Section):
    token_url: str
    client_id: Annotated[str, Field(min_length=1)]
    client_secret: SecretStr | None = None
    client_secret_file: _SecretFile = ""
    scope: str = ""
    # RFC 8707 resource indicator; the MCP authorization spec asks clients to send it.
    resource: str = ""
    # How the client authenticates: HTTP Basic (RFC 6749 §2.3.1) or form fields.
    client_auth: Literal["basic", "post"] = "post"
    # Token endpoints answer in well under a second; 30 s is a sick one.
    timeout_s: Annotated[float, Field(gt=0, le=300)] = 30.0

    @field_validator("token_url")
    @classmethod
    def _token_url(cls, value: str) -> str:
        return _check_token_url(value)


class OAuth2ClientCredentialsConfig(_OAuth2Section):
    """The client credentials grant (RFC 6749 §4.4); `audience` is Auth0's extension."""

    type: Literal["oauth2_client_credentials"]
    audience: str = ""

    _one_secret = _one_of("client_secret")


class OAuth2RefreshConfig(_OAuth2Section):
    """The refresh token grant (RFC 6749 §6); a public client has no `client_secret`."""

    type: Literal["oauth2_refresh"]
    refresh_token: SecretStr | None = None
    refresh_token_file: _SecretFile = ""

    _one_secret = _one_of("client_secret", required=False)
    _one_refresh_token = _one_of("refresh_token")


CredentialsConfig = Annotated[
    ApiKeyConfig | BearerConfig | OAuth2ClientCredentialsConfig | OAuth2RefreshConfig,
    Field(discriminator="type"),
]
