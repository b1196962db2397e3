"""Upstream credentials: API keys, bearer tokens and OAuth2 tokens, held only by the daemon.

Sandboxed programs never see these: the gateway adds them to its own requests to an
upstream. Config values arrive as strings (`${VAR}` already substituted by the config
loader) or as `*_file` paths read once when the credentials are loaded. Every secret
is registered with `conduit.core.redaction.redact` the moment it is loaded or received,
and is held as a pydantic `SecretStr`, so no repr, str or exception message shows it.

OAuth2 tokens come from the token endpoint (client credentials or refresh token
grant) through the upstream's SSRF guard, are refreshed `REFRESH_SKEW_S` before they
expire, one refresh at a time, and are dropped by `invalidate()` after a 401. A
refresh token the server rotates replaces the old one in memory (not on disk: a
restart starts again from the configured one).

This module knows nothing about MCP sessions; `CredentialsAuth` adapts credentials to
the httpx2 client the MCP SDK uses.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import re
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

import httpx
import httpx2
import trio
from pydantic import (
    BaseModel,
    SecretStr,
)

from conduit.core.errors import ConfigError, GatewayError
from conduit.core.redaction import redact
from conduit.gateway.credentials_config import (
    ApiKeyConfig,
    BearerConfig,
    CredentialsConfig,
    OAuth2ClientCredentialsConfig,
    OAuth2RefreshConfig,
)
from conduit.gateway.ssrf import SsrfGuard, read_capped

__all__ = [
    "ApiKeyConfig",
    "BearerConfig",
    "Credentials",
    "CredentialsAuth",
    "CredentialsConfig",
    "CredentialsError",
    "OAuth2ClientCredentialsConfig",
    "OAuth2RefreshConfig",
    "load_credentials",
]

log = logging.getLogger("conduit.gateway.credentials")

# Refresh a minute early: covers clock skew and requests already in flight.
REFRESH_SKEW_S = 60.0
# A token response is a few hundred bytes; anything near this is not one.
MAX_TOKEN_RESPONSE_BYTES = 64 * 1024
# OAuth2 errors (RFC 6749 §5.2) no retry can fix: the operator must change the config.
PERMANENT_OAUTH_ERRORS = frozenset(
    {"invalid_client", "invalid_grant", "unauthorized_client", "unsupported_grant_type"}
    | {"invalid_scope", "invalid_request"}
)
_OAUTH_ERROR_CODE = re.compile(r"^[\x20-\x21\x23-\x5b\x5d-\x7e]{1,64}$")


class CredentialsError(GatewayError):
    """Credentials could not be obtained; the message never contains a secret.

    `permanent` is True when retrying cannot help (the token endpoint rejected the
    client or the grant): the upstream should fail until reconfigured rather than
    back off and retry.
    """

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


# --- runtime -------------------------------------------------------------------------


def _load_secret(section: BaseModel, name: str, upstream: str) -> SecretStr | None:
    """The secret `name` from the config or its `name_file`, registered for redaction.

    Raises ConfigError naming the upstream, key and file (never the contents).
    """
    value: SecretStr | None = getattr(section, name)
    path = getattr(section, f"{name}_file")
    if value is None and path:
        try:
            text = Path(path).read_text().strip()
        except OSError as exc:
            raise ConfigError(
                f"upstream {upstream!r}: cannot read {name}_file {path}: {exc.strerror}"
            ) from None
        if not text:
            raise ConfigError(f"upstream {upstream!r}: {name}_file {path} is empty")
        value = SecretStr(text)
    if value is not None:
        redact(value.get_secret_value())
    return value


class Credentials:
    """How the gateway authenticates to one upstream; this base class adds nothing.

    `headers()` returns the headers to add to a request (they hold secrets: never log
    them). After the upstream answers 401, call `invalidate()` and retry once if
    `refreshable`; a static credential that gets a 401 is simply wrong.
    """

    kind = "none"
    refreshable = False

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream

    async def headers(self) -> dict[str, str]:
        """The authentication headers for the next request."""
        return {}

    def invalidate(self) -> None:
        """Forget the current access token so the next `headers()` fetches a new one."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(upstream={self.upstream!r}, kind={self.kind!r})"


class _StaticCredentials(Credentials):
    def __init__(self, upstream: str, kind: str, header: str, value: SecretStr) -> None:
        super().__init__(upstream)
        self.kind = kind
        self._header = header
        self._value = value

    async def headers(self) -> dict[str, str]:
        return {self._header: self._value.get_secret_value()}


@dataclass(frozen=True, slots=True)
class _Grant:
    """A token endpoint's answer, secrets already wrapped and registered."""

    access_token: SecretStr
    expires_in_s: float | None
    refresh_token: SecretStr | None


class _OAuth2Credentials(Credentials):
    """An access token from a token endpoint, refreshed before it expires."""

    refreshable = True

    def __init__(
        self,
        upstream: str,
        config: OAuth2ClientCredentialsConfig | OAuth2RefreshConfig,
        *,
        guard: SsrfGuard,
        client_secret: SecretStr | None,
        refresh_token: SecretStr | None,
        clock: Callable[[], float],
    ) -> None:
        super().__init__(upstream)
        self.kind = config.type
        self._config = config
        self._guard = guard
        self._client_secret = client_secret
        self._refresh_token = refresh_token
        self._clock = clock
        self._token: SecretStr | None = None
        self._refresh_at = -math.inf
        self._lock = trio.Lock()
        self._finished = 0  # fetch attempts that have finished, however they ended
        self._last_error: CredentialsError | None = None
        self.fetches = 0  # token endpoint calls that succeeded, for tests and metrics

    def __repr__(self) -> str:
        state = "valid" if self._valid_token() else "none"
        return (
            f"{type(self).__name__}(upstream={self.upstream!r}, kind={self.kind!r}, "
            f"token={state}, fetches={self.fetches})"
        )

    async def headers(self) -> dict[str, str]:
        """`Authorization: Bearer <token>`, fetching a token first if there is none.

        Concurrent callers share one fetch. Raises CredentialsError if the token
        endpoint refuses or cannot be reached, DestinationRefused if the guard
        refuses it.
        """
        token = self._valid_token()
        if token is None:
            finished = self._finished
            async with self._lock:
                # Whoever held the lock while we waited may have fetched one already,
                # or failed to: then we share that outcome rather than try at once.
                token = self._valid_token()
                if token is None and finished != self._finished and self._last_error:
                    failure = self._last_error
                    raise CredentialsError(str(failure), permanent=failure.permanent)
                token = token or await self._fetch()
        return {"Authorization": f"Bearer {token.get_secret_value()}"}

    def invalidate(self) -> None:
        self._token = None
        self._refresh_at = -math.inf

    def _valid_token(self) -> SecretStr | None:
        if self._token is not None and self._clock() < self._refresh_at:
            return self._token
        return None

    async def _fetch(self) -> SecretStr:
        self._last_error = None
        try:
            return await self._fetch_once()
        except CredentialsError as exc:
            self._last_error = exc
            raise
        finally:
            self._finished += 1

    async def _fetch_once(self) -> SecretStr:
        rotating = self._refresh_token is not None
        # A rotating server invalidates the old refresh token once it answers: losing
        # that answer to a caller's cancellation would lock us out. So a refresh grant
        # is shielded; `_request` is bounded by the configured timeout.
        with trio.CancelScope(shield=rotating):
            grant = await self._request()
            rotated = rotating and grant.refresh_token is not None
            if rotated:
                self._refresh_token = grant.refresh_token
        now = self._clock()
        self._token = grant.access_token
        self._refresh_at = _refresh_at(now, grant.expires_in_s)
        self.fetches += 1
        log.info(
            "fetched an upstream access token",
            extra={
                "upstream": self.upstream,
                "grant": self.kind,
                "expires_in_s": grant.expires_in_s,
                "refresh_token_rotated": rotated,
            },
        )
        return grant.access_token

    async def _request(self) -> _Grant:
        """POST the grant to the token endpoint; bounded by the configured timeout."""
        config = self._config
        try:
            with trio.fail_after(config.timeout_s):
                async with (
                    self._guard.open_client(timeout=config.timeout_s) as client,
                    client.stream(
                        "POST", config.token_url, data=self._form(), headers=self._auth_headers()
                    ) as response,
                ):
                    body, too_long = await read_capped(response, MAX_TOKEN_RESPONSE_BYTES)
        except trio.TooSlowError:
            raise self._error(f"no answer within {config.timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise self._error(f"unreachable ({type(exc).__name__})") from exc
        if too_long:
            raise self._error(f"answered more than {MAX_TOKEN_RESPONSE_BYTES} bytes")
        return self._parse(response.status_code, body)

    def _form(self) -> dict[str, str]:
        config = self._config
        if self._refresh_token is not None:
            form = {"grant_type": "refresh_token"}
            form["refresh_token"] = self._refresh_token.get_secret_value()
        else:
            form = {"grant_type": "client_credentials"}
            if isinstance(config, OAuth2ClientCredentialsConfig) and config.audience:
                form["audience"] = config.audience
        optional = {"scope": config.scope, "resource": config.resource}
        form.update({key: value for key, value in optional.items() if value})
        if config.client_auth == "post" or self._client_secret is None:
            form["client_id"] = config.client_id
            if self._client_secret is not None:
                form["client_secret"] = self._client_secret.get_secret_value()
        return form

    def _auth_headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self._config.client_auth == "basic" and self._client_secret is not None:
            # RFC 6749 §2.3.1: each part form-encoded before the Basic encoding.
            pair = f"{quote_plus(self._config.client_id)}:"
            pair += quote_plus(self._client_secret.get_secret_value())
            basic = base64.b64encode(pair.encode()).decode("ascii")
            redact(basic)
            headers["Authorization"] = f"Basic {basic}"
        return headers

    def _parse(self, status: int, body: bytes) -> _Grant:
        """The grant in a token response, or CredentialsError saying why not."""
        payload = _json_object(body)
        if status != 200:
            code = payload.get("error") if payload else None
            shown = code if isinstance(code, str) and _OAUTH_ERROR_CODE.match(code) else None
            permanent = shown in PERMANENT_OAUTH_ERRORS
            detail = f"HTTP {status}" + (f" {shown}" if shown else "")
            if 300 <= status < 400:
                detail += " (a redirect; not followed: configure the final token_url)"
            raise self._error(f"refused: {detail}", permanent=permanent)
        access = payload.get("access_token") if payload else None
        if not isinstance(access, str) or not access:
            raise self._error("answered without an access_token")
        redact(access)
        refresh = payload.get("refresh_token")
        if isinstance(refresh, str) and refresh:
            redact(refresh)
        token_type = str(payload.get("token_type", "bearer"))
        if token_type.lower() != "bearer":
            raise self._error(f"issued a {token_type[:32]!r} token; only bearer is supported")
        return _Grant(
            SecretStr(access),
            _expires_in(payload.get("expires_in")),
            SecretStr(refresh) if isinstance(refresh, str) and refresh else None,
        )

    def _error(self, what: str, *, permanent: bool = False) -> CredentialsError:
        url = httpx.URL(self._config.token_url).copy_with(query=None, fragment=None)
        return CredentialsError(
            f"upstream {self.upstream!r}: token endpoint {url} {what}", permanent=permanent
        )


def _refresh_at(now: float, expires_in_s: float | None) -> float:
    """When to refresh: REFRESH_SKEW_S early, or halfway for tokens shorter than 2 skews."""
    if expires_in_s is None:
        return math.inf  # no expiry given: use it until the upstream answers 401
    return now + expires_in_s - min(REFRESH_SKEW_S, expires_in_s / 2)


def _expires_in(value: Any) -> float | None:
    # Some servers send the number as a string; a nonsense value means "unknown".
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None


def load_credentials(
    config: CredentialsConfig | None,
    *,
    upstream: str,
    guard: SsrfGuard,
    clock: Callable[[], float] = trio.current_time,
) -> Credentials:
    """The runtime credentials for `upstream` (a no-op `Credentials` when `config` is None).

    Reads `*_file` secrets now (raises ConfigError naming the file if unreadable or
    empty) and registers every secret for redaction. Token endpoint calls go through
    `guard`: pass the upstream's own, `SsrfGuard(trusted=True)` for a trusted one.
    `clock` is for tests. Holds no resources; nothing to close.
    """
    if config is None:
        return Credentials(upstream)
    if isinstance(config, ApiKeyConfig):
        value = _load_secret(config, "value", upstream)
        assert value is not None  # the model requires one of value / value_file
        return _StaticCredentials(upstream, config.type, config.header, value)
    if isinstance(config, BearerConfig):
        token = _load_secret(config, "token", upstream)
        assert token is not None
        return _StaticCredentials(
            upstream, config.type, "Authorization", SecretStr(f"Bearer {token.get_secret_value()}")
        )
    refresh = (
        _load_secret(config, "refresh_token", upstream) if config.type == "oauth2_refresh" else None
    )
    return _OAuth2Credentials(
        upstream,
        config,
        guard=guard,
        client_secret=_load_secret(config, "client_secret", upstream),
        refresh_token=refresh,
        clock=clock,
    )


class CredentialsAuth(httpx2.Auth):
    """Adds `credentials` to every request of an httpx2 client (the MCP SDK's).

    On a 401 from a refreshable credential it invalidates the token and sends the
    request once more with a fresh one; a second 401 is returned as it is. Pass it as
    `auth=` to `SsrfGuard.open_mcp_client`.
    """

    requires_request_body = True  # the retry re-sends the body

    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials

    async def async_auth_flow(
        self, request: httpx2.Request
    ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        request.headers.update(await self.credentials.headers())
        response = yield request
        if response.status_code == 401 and self.credentials.refreshable:
            self.credentials.invalidate()
            request.headers.update(await self.credentials.headers())
            yield request

    def __repr__(self) -> str:
        return f"CredentialsAuth({self.credentials!r})"
