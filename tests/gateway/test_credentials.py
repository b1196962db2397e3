"""Upstream credentials against a local token endpoint: grants, refresh, secrecy."""

from __future__ import annotations

import base64
import io
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pydantic
import pytest
import trio

from conduit.core.errors import ConfigError
from conduit.daemon.logs import configure_logging
from conduit.gateway.credentials import (
    ApiKeyConfig,
    BearerConfig,
    Credentials,
    CredentialsAuth,
    CredentialsConfig,
    CredentialsError,
    load_credentials,
)
from conduit.gateway.ssrf import DestinationRefused, SsrfGuard
from tests.gateway.local_http import LocalServer, Reply, Seen

WAIT_S = 10
CLIENT_SECRET = "cs-0123456789-client-secret"
REFRESH_TOKEN = "rt-0-0123456789-refresh"
CONFIG = pydantic.TypeAdapter(CredentialsConfig)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class TokenEndpoint:
    """Issues at-1, at-2, … (and rotates rt-N) at /token; /mcp wants the latest token."""

    def __init__(self, expires_in: Any = 3600) -> None:
        self.expires_in = expires_in
        self.issued = 0
        self.forms: list[dict[str, str]] = []
        self.rotate = False
        self.refuse: tuple[int, dict[str, Any]] | None = None
        self.gate: trio.Event | None = None  # when set, /token waits for it

    async def __call__(self, seen: Seen) -> Reply:
        if seen.target == "/mcp":
            sent = seen.headers.get("authorization", "")
            good = sent == f"Bearer at-{self.issued}-0123456789"
            return Reply(200 if good else 401, {}, b"ok" if good else b"")
        form = {key: values[0] for key, values in parse_qs(seen.body.decode()).items()}
        self.forms.append(form)
        if self.gate is not None:
            await self.gate.wait()
        if self.refuse is not None:
            status, payload = self.refuse
            return Reply(status, {"content-type": "application/json"}, json.dumps(payload).encode())
        self.issued += 1
        payload = {"access_token": f"at-{self.issued}-0123456789", "token_type": "Bearer"}
        if self.expires_in is not None:
            payload["expires_in"] = self.expires_in
        if self.rotate:
            payload["refresh_token"] = f"rt-{self.issued}-0123456789-refresh"
        return Reply(200, {"content-type": "application/json"}, json.dumps(payload).encode())


@pytest.fixture
async def endpoint(nursery: trio.Nursery) -> tuple[TokenEndpoint, LocalServer]:
    token_endpoint = TokenEndpoint()
    server = LocalServer(token_endpoint)
    with trio.fail_after(WAIT_S):
        await nursery.start(server.run)
    return token_endpoint, server


def local_guard(server: LocalServer) -> SsrfGuard:
    """A guard allowed to reach the local server and nothing else on loopback."""
    return SsrfGuard(allow_networks=["127.0.0.1/32"], extra_ports=[server.port])


def oauth(server: LocalServer, **fields: Any) -> Any:
    tree = {
        "type": "oauth2_client_credentials",
        "token_url": f"http://127.0.0.1:{server.port}/token",
        "client_id": "conduit",
        "client_secret": CLIENT_SECRET,
        **fields,
    }
    return CONFIG.validate_python(tree)


def refresh(server: LocalServer, **fields: Any) -> Any:
    tree = {
        "type": "oauth2_refresh",
        "token_url": f"http://127.0.0.1:{server.port}/token",
        "client_id": "conduit",
        "refresh_token": REFRESH_TOKEN,
        **fields,
    }
    return CONFIG.validate_python(tree)


async def bearer_of(credentials: Credentials) -> str:
    with trio.fail_after(WAIT_S):
        headers = await credentials.headers()
    return headers["Authorization"].removeprefix("Bearer ").partition("-0123")[0]


# --- static credentials --------------------------------------------------------------


async def test_api_key_and_bearer_headers() -> None:
    api_key = CONFIG.validate_python(
        {"type": "api_key", "header": "X-API-Key", "value": "key-0123456789"}
    )
    credentials = load_credentials(api_key, upstream="docs", guard=SsrfGuard())
    assert await credentials.headers() == {"X-API-Key": "key-0123456789"}
    assert not credentials.refreshable
    credentials.invalidate()
    assert await credentials.headers() == {"X-API-Key": "key-0123456789"}

    bearer = CONFIG.validate_python({"type": "bearer", "token": "tok-0123456789"})
    credentials = load_credentials(bearer, upstream="docs", guard=SsrfGuard())
    assert await credentials.headers() == {"Authorization": "Bearer tok-0123456789"}
    assert await load_credentials(None, upstream="docs", guard=SsrfGuard()).headers() == {}


async def test_secrets_can_come_from_files(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("key-from-file-0123\n")
    config = ApiKeyConfig(type="api_key", header="X-Key", value_file=str(tmp_path / "key"))
    credentials = load_credentials(config, upstream="docs", guard=SsrfGuard())
    assert await credentials.headers() == {"X-Key": "key-from-file-0123"}


def test_unreadable_or_empty_secret_files_are_config_errors(tmp_path: Path) -> None:
    missing = BearerConfig(type="bearer", token_file=str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match=r"upstream 'docs': cannot read token_file .*nope"):
        load_credentials(missing, upstream="docs", guard=SsrfGuard())
    (tmp_path / "empty").write_text("\n")
    empty = BearerConfig(type="bearer", token_file=str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="is empty"):
        load_credentials(empty, upstream="docs", guard=SsrfGuard())


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        ({"type": "bearer"}, "set `token` or `token_file`"),
        ({"type": "bearer", "token": "x" * 10, "token_file": "/f"}, "not both"),
        ({"type": "api_key", "header": "X Bad", "value": "v" * 10}, "String should match"),
        ({"type": "api_key", "header": "X", "value": "v" * 10, "extra": 1}, "Extra inputs"),
        ({"type": "oauth2_refresh", "token_url": "https://a/t", "client_id": "c"}, "refresh"),
        (
            {"type": "oauth2_client_credentials", "token_url": "https://a/t", "client_id": "c"},
            "set `client_secret` or `client_secret_file`",
        ),
        (
            {
                "type": "oauth2_client_credentials",
                "token_url": "http://auth.example.com/token",
                "client_id": "c",
                "client_secret": "s" * 10,
            },
            "token_url must be https",
        ),
        (
            {"type": "oauth2_refresh", "token_url": "https:///t", "refresh_token": "r" * 9},
            "token_url has no host",
        ),
        ({"type": "basic", "user": "u"}, "does not match any of the expected tags"),
    ],
)
def test_config_validation(tree: dict[str, Any], message: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=message):
        CONFIG.validate_python(tree)


def test_validation_errors_do_not_echo_secrets() -> None:
    class Upstream(pydantic.BaseModel):  # as the settings module will embed it
        auth: CredentialsConfig

    bad = [
        {"type": "bearer", "token": "tok-secret-0123456789", "token_file": "/x"},
        {"type": "api_key", "header": "X", "value": "key-secret-0123456789", "oops": True},
        {"type": "api_key", "header": "X Y", "value": "key-secret-0123456789"},
    ]
    for tree in bad:
        with pytest.raises(pydantic.ValidationError) as caught:
            Upstream.model_validate({"auth": tree})
        assert "secret-0123456789" not in str(caught.value)
        assert "secret-0123456789" not in repr(caught.value.errors())


# --- OAuth2 ----------------------------------------------------------------------------


async def test_client_credentials_fetches_once_and_caches(endpoint: Any) -> None:
    token_endpoint, server = endpoint
    config = oauth(server, scope="tools:read", audience="https://mcp", resource="https://mcp/")
    credentials = load_credentials(config, upstream="docs", guard=local_guard(server))
    assert await bearer_of(credentials) == "at-1"
    assert await bearer_of(credentials) == "at-1"
    assert token_endpoint.forms == [
        {
            "grant_type": "client_credentials",
            "audience": "https://mcp",
            "scope": "tools:read",
            "resource": "https://mcp/",
            "client_id": "conduit",
            "client_secret": CLIENT_SECRET,
        }
    ]
    [seen] = server.requests
    assert seen.headers["content-type"] == "application/x-www-form-urlencoded"
    assert "authorization" not in seen.headers


async def test_client_secret_basic(endpoint: Any) -> None:
    token_endpoint, server = endpoint
    config = oauth(server, client_id="my client", client_auth="basic")
    credentials = load_credentials(config, upstream="docs", guard=local_guard(server))
    assert await bearer_of(credentials) == "at-1"
    assert token_endpoint.forms == [{"grant_type": "client_credentials"}]
    expected = base64.b64encode(f"my+client:{CLIENT_SECRET}".encode()).decode()
    assert server.requests[0].headers["authorization"] == f"Basic {expected}"


@pytest.mark.parametrize(
    ("expires_in", "still_valid_at", "refreshed_at"),
    [(3600, 3539, 3541), ("120", 59, 61), (20, 9, 11)],
)
async def test_tokens_are_refreshed_before_they_expire(
    endpoint: Any, expires_in: Any, still_valid_at: float, refreshed_at: float
) -> None:
    token_endpoint, server = endpoint
    token_endpoint.expires_in = expires_in
    clock = FakeClock()
    start = clock.now
    credentials = load_credentials(
        oauth(server), upstream="docs", guard=local_guard(server), clock=clock
    )
    assert await bearer_of(credentials) == "at-1"
    clock.now = start + still_valid_at
    assert await bearer_of(credentials) == "at-1"
    clock.now = start + refreshed_at
    assert await bearer_of(credentials) == "at-2"


async def test_a_token_without_expiry_lasts_until_invalidated(endpoint: Any) -> None:
    token_endpoint, server = endpoint
    token_endpoint.expires_in = None
    clock = FakeClock()
    credentials = load_credentials(
        oauth(server), upstream="docs", guard=local_guard(server), clock=clock
    )
    assert await bearer_of(credentials) == "at-1"
    clock.now += 10 * 365 * 86400
    assert await bearer_of(credentials) == "at-1"
    credentials.invalidate()
    assert await bearer_of(credentials) == "at-2"


async def gather(count: int, call: Callable[[], Awaitable[Any]]) -> list[Any]:
    """Run `call` `count` times concurrently; each result or exception, in order."""
    results: list[Any] = [None] * count

    async def one(index: int) -> None:
        try:
            results[index] = await call()
        except Exception as exc:
            results[index] = exc

    async with trio.open_nursery() as nursery:
        for index in range(count):
            nursery.start_soon(one, index)
    return results


async def test_concurrent_callers_share_one_refresh(endpoint: Any) -> None:
    token_endpoint, server = endpoint
    token_endpoint.gate = trio.Event()
    credentials = load_credentials(oauth(server), upstream="docs", guard=local_guard(server))

    async def release_when_asked() -> None:
        while not token_endpoint.forms:
            await trio.sleep(0.001)
        await trio.sleep(0.05)  # let every caller queue behind the first
        token_endpoint.gate.set()

    with trio.fail_after(WAIT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(release_when_asked)
            results = await gather(10, lambda: bearer_of(credentials))
    assert results == ["at-1"] * 10
    assert len(token_endpoint.forms) == 1


async def test_concurrent_callers_share_one_failure(endpoint: Any) -> None:
    token_endpoint, server = endpoint
    token_endpoint.refuse = (401, {"error": "invalid_client"})
    credentials = load_credentials(oauth(server), upstream="docs", guard=local_guard(server))
    with trio.fail_after(WAIT_S):
        results = await gather(5, credentials.headers)
    assert all(isinstance(result, CredentialsError) for result in results)
    assert all(result.permanent for result in results)
    assert len(token_endpoint.forms) == 1
    # A later call tries again: the failure is shared, not cached.
    token_endpoint.refuse = None
    assert await bearer_of(credentials) == "at-1"


async def test_a_rotated_refresh_token_replaces_the_old_one(endpoint: Any) -> None:
    token_endpoint, server = endpoint
    token_endpoint.rotate = True
    credentials = load_credentials(refresh(server), upstream="docs", guard=local_guard(server))
    assert await bearer_of(credentials) == "at-1"
    credentials.invalidate()
    assert await bearer_of(credentials) == "at-2"
    token_endpoint.rotate = False  # a server that stops rotating: keep the last one
    credentials.invalidate()
    assert await bearer_of(credentials) == "at-3"
    credentials.invalidate()
    assert await bearer_of(credentials) == "at-4"
    sent = [form["refresh_token"] for form in token_endpoint.forms]
    rotated = "rt-2-0123456789-refresh"
    assert sent == [REFRESH_TOKEN, "rt-1-0123456789-refresh", rotated, rotated]
    assert all(form["grant_type"] == "refresh_token" for form in token_endpoint.forms)
    assert all(form["client_id"] == "conduit" for form in token_endpoint.forms)
    assert all("client_secret" not in form for form in token_endpoint.forms)


async def test_a_caller_giving_up_mid_refresh_does_not_lose_the_rotated_token(
    endpoint: Any,
) -> None:
    token_endpoint, server = endpoint
    token_endpoint.rotate = True
    token_endpoint.gate = trio.Event()
    credentials = load_credentials(refresh(server), upstream="docs", guard=local_guard(server))

    async def answer_late() -> None:
        while not token_endpoint.forms:
            await trio.sleep(0.001)
        await trio.sleep(0.1)  # well past the caller's deadline
        token_endpoint.gate.set()

    with trio.fail_after(WAIT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(answer_late)
            with trio.move_on_after(0.01):
                await credentials.headers()
    token_endpoint.gate = None
    credentials.invalidate()
    assert await bearer_of(credentials) == "at-2"
    assert token_endpoint.forms[1]["refresh_token"] == "rt-1-0123456789-refresh"


async def test_a_401_invalidates_and_retries_once_through_the_mcp_client(endpoint: Any) -> None:
    token_endpoint, server = endpoint
    guard = local_guard(server)
    credentials = load_credentials(oauth(server), upstream="docs", guard=guard)
    url = f"http://127.0.0.1:{server.port}/mcp"
    async with guard.open_mcp_client(auth=CredentialsAuth(credentials)) as client:
        with trio.fail_after(WAIT_S):
            assert (await client.post(url, content=b"{}")).status_code == 200
            # The upstream stops taking at-1: it wants the next token the endpoint issues.
            token_endpoint.issued += 1
            assert (await client.post(url, content=b"{}")).status_code == 200
    tokens = [
        seen.headers["authorization"].partition("-0123")[0]
        for seen in server.requests
        if seen.target == "/mcp"
    ]
    assert tokens == ["Bearer at-1", "Bearer at-1", "Bearer at-3"]
    assert [seen.body for seen in server.requests if seen.target == "/mcp"] == [b"{}"] * 3


async def test_a_401_for_a_static_credential_is_not_retried(endpoint: Any) -> None:
    _, server = endpoint
    bearer = CONFIG.validate_python({"type": "bearer", "token": "wrong-0123456789"})
    credentials = load_credentials(bearer, upstream="docs", guard=SsrfGuard())
    guard = local_guard(server)
    async with guard.open_mcp_client(auth=CredentialsAuth(credentials)) as client:
        with trio.fail_after(WAIT_S):
            response = await client.post(f"http://127.0.0.1:{server.port}/mcp", content=b"{}")
    assert response.status_code == 401
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("status", "payload", "message", "permanent"),
    [
        (400, {"error": "invalid_grant"}, "refused: HTTP 400 invalid_grant", True),
        (401, {"error": "invalid_client"}, "refused: HTTP 401 invalid_client", True),
        (503, {}, "refused: HTTP 503$", False),
        (400, {"error": "bad\ncode"}, "refused: HTTP 400$", False),
        (302, {}, "a redirect; not followed", False),
        (200, {"token_type": "bearer"}, "without an access_token", False),
        (200, {"access_token": "x" * 12, "token_type": "mac"}, "'mac' token", False),
        (200, {"access_token": "x" * 70_000}, "answered more than 65536 bytes", False),
    ],
)
async def test_token_endpoint_failures(
    endpoint: Any, status: int, payload: dict[str, Any], message: str, permanent: bool
) -> None:
    token_endpoint, server = endpoint
    token_endpoint.refuse = (status, payload)
    credentials = load_credentials(oauth(server), upstream="docs", guard=local_guard(server))
    with trio.fail_after(WAIT_S), pytest.raises(CredentialsError, match=message) as caught:
        await credentials.headers()
    assert caught.value.permanent is permanent
    assert str(caught.value).startswith(
        f"upstream 'docs': token endpoint http://127.0.0.1:{server.port}/token "
    )


async def test_a_silent_token_endpoint_times_out(endpoint: Any) -> None:
    token_endpoint, server = endpoint
    token_endpoint.gate = trio.Event()  # never set
    config = oauth(server, timeout_s=0.2)
    credentials = load_credentials(config, upstream="docs", guard=local_guard(server))
    with trio.fail_after(WAIT_S), pytest.raises(CredentialsError, match=r"no answer within 0\.2 s"):
        await credentials.headers()


async def test_the_token_endpoint_goes_through_the_guard(endpoint: Any) -> None:
    _, server = endpoint
    credentials = load_credentials(oauth(server), upstream="docs", guard=SsrfGuard())
    with trio.fail_after(WAIT_S), pytest.raises(DestinationRefused, match="port"):
        await credentials.headers()
    guard = SsrfGuard(extra_ports=[server.port])
    credentials = load_credentials(oauth(server), upstream="docs", guard=guard)
    with trio.fail_after(WAIT_S), pytest.raises(DestinationRefused, match="loopback"):
        await credentials.headers()
    trusted = load_credentials(oauth(server), upstream="docs", guard=SsrfGuard(trusted=True))
    assert await bearer_of(trusted) == "at-1"
    assert len(server.requests) == 1


# --- secrecy ---------------------------------------------------------------------------


async def test_secrets_stay_out_of_logs_reprs_and_errors(
    endpoint: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_endpoint, server = endpoint
    token_endpoint.rotate = True
    # configure_logging (the CLI) stops propagation; caplog listens at the root.
    monkeypatch.setattr(logging.getLogger("conduit"), "propagate", True)
    caplog.set_level(logging.DEBUG)
    configs = [
        refresh(server, client_secret=CLIENT_SECRET, client_auth="basic"),
        oauth(server),
        CONFIG.validate_python({"type": "api_key", "header": "X", "value": "api-key-0123456789"}),
    ]
    objects: list[Any] = list(configs)
    for config in configs:
        credentials = load_credentials(config, upstream="docs", guard=local_guard(server))
        with trio.fail_after(WAIT_S):
            await credentials.headers()
            credentials.invalidate()
            await credentials.headers()
        objects += [credentials, CredentialsAuth(credentials)]
    token_endpoint.refuse = (400, {"error": "invalid_grant", "error_description": REFRESH_TOKEN})
    failing = load_credentials(configs[0], upstream="docs", guard=local_guard(server))
    with trio.fail_after(WAIT_S), pytest.raises(CredentialsError) as caught:
        await failing.headers()
    objects.append(caught.value)

    basic = base64.b64encode(f"conduit:{CLIENT_SECRET}".encode()).decode()
    secrets = [CLIENT_SECRET, REFRESH_TOKEN, "api-key-0123456789", basic]
    secrets += [f"at-{n}-0123456789" for n in range(1, 5)]
    secrets += [f"rt-{n}-0123456789-refresh" for n in range(1, 5)]
    assert any("fetched an upstream access token" in r.getMessage() for r in caplog.records)
    logged = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    shown = "\n".join(f"{obj!r} {obj}" for obj in objects)
    for secret in secrets:
        assert secret not in logged
        assert secret not in shown

    # And anything that does write one to the log gets it redacted on the way out.
    stream = io.StringIO()
    root = logging.getLogger("conduit")
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    configure_logging("debug", stream)
    logging.getLogger("conduit.test").warning("oops %s", " ".join(secrets))
    written = stream.getvalue()
    assert "[redacted]" in written
    for secret in secrets:
        assert secret not in written
