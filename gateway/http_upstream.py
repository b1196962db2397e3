"""Upstream MCP servers reached over streamable HTTP.

`HttpUpstream` is a `SessionKeeper` (see `keeper.py`: handshake, listing, calls,
back-off) over the official SDK's `streamable_http_client`, which speaks HTTP through
`httpx2` (pydantic's fork of httpx; the SDK imports it as `httpx2`, not `httpx`).

The HTTP client is built per connection by a factory with the SDK's
`McpHttpClientFactory` signature, `(headers=None, timeout=None, auth=None) ->
httpx2.AsyncClient`, so the SSRF guard plugs in as `SsrfGuard(...).open_mcp_client`.
An upstream that is not `trusted` must be given one: this module never builds an
unguarded client for it. Whatever the factory returns, redirects are not followed:
`max_redirects` is set to 0, which also stops the SDK's own same-origin following, so
a redirect fails the request with a message naming its location.

No answer is held past `MAX_MESSAGE_BYTES`, whoever built the client: the SDK caps
each SSE event at it, and `BodyCap` (see `http_body_cap.py`) every other body, which
the SDK would read whole. Either fails only the request it answered.

Resource handling: the client and the SDK transport belong to the keeper's `serve`
task; each connection gets a fresh client, closed when the connection ends.

This module knows nothing about SSRF rules or credentials; it only carries headers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Protocol

import httpx2
from mcp.client.streamable_http import MCP_SESSION_ID, streamable_http_client

from conduit.gateway.http_body_cap import BodyCap
from conduit.gateway.keeper import MAX_MESSAGE_BYTES, SessionKeeper, TransportStreams
from conduit.gateway.settings import HttpUpstreamSettings

__all__ = ["HttpClientFactory", "HttpUpstream"]

# The SDK's defaults: 30 s to connect, write or get a pooled connection, 300 s between
# reads because a server may hold an SSE stream (a listen stream, a slow tool) open.
# Per-call deadlines are `call_timeout_s`, enforced above this layer.
HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)


class HttpClientFactory(Protocol):
    """Builds the `httpx2.AsyncClient` one connection uses; the caller closes it.

    The SDK's `McpHttpClientFactory`: `headers` are the upstream's configured headers
    (sent on every request) and `timeout` is `HTTP_TIMEOUT`. `HttpUpstream` never
    passes `auth`: credentials, if any, are bound into the factory by whoever builds it.
    """

    def __call__(
        self,
        headers: dict[str, str] | None = None,
        timeout: httpx2.Timeout | None = None,
        auth: httpx2.Auth | None = None,
    ) -> httpx2.AsyncClient: ...


class HttpUpstream(SessionKeeper):
    """A streamable-HTTP MCP server, reconnected with back-off when it goes away.

    Raises `ValueError` if the upstream is not `trusted` and no `http_client_factory`
    (the SSRF-guarded one) is given.
    """

    transport = "http"

    def __init__(
        self,
        settings: HttpUpstreamSettings,
        *,
        http_client_factory: HttpClientFactory | None = None,
    ) -> None:
        if http_client_factory is None and not settings.trusted:
            raise ValueError(
                f"upstream {settings.name!r} is not trusted, so it needs the SSRF-guarded "
                "client: pass http_client_factory=SsrfGuard(...).open_mcp_client"
            )
        super().__init__(settings)
        self._http = settings
        self._client_factory: HttpClientFactory = http_client_factory or _plain_client

    @asynccontextmanager
    async def _open_transport(
        self, ended: Callable[[str], None]
    ) -> AsyncIterator[TransportStreams]:
        client = self._client_factory(headers=dict(self._http.headers), timeout=HTTP_TIMEOUT)
        # No redirects, whoever built the client: the SDK follows same-origin ones
        # itself unless the client's budget is zero.
        client.max_redirects = 0
        cap = BodyCap(MAX_MESSAGE_BYTES)
        client.event_hooks = {
            **client.event_hooks,
            "response": [*client.event_hooks["response"], _session_watch(ended), cap.watch],
        }
        # One SSE event carries one JSON-RPC message: the same bound as a stdio line.
        # The SDK's default (1 MiB) would fail any larger tool result.
        async with (
            client,
            streamable_http_client(
                self._http.url, http_client=client, max_sse_event_size=MAX_MESSAGE_BYTES
            ) as (read_stream, write_stream),
        ):
            yield cap.answers(read_stream), write_stream


def _plain_client(
    headers: dict[str, str] | None = None,
    timeout: httpx2.Timeout | None = None,
    auth: httpx2.Auth | None = None,
) -> httpx2.AsyncClient:
    """The client of a `trusted` upstream: httpx2's own, as the SDK would build it."""
    return httpx2.AsyncClient(headers=headers, timeout=timeout or HTTP_TIMEOUT, auth=auth)


def _session_watch(ended: Callable[[str], None]) -> Callable[[httpx2.Response], Awaitable[None]]:
    """A response hook that ends the connection when the server forgot the session.

    The spec: a 404 to a request carrying `Mcp-Session-Id` means the session is gone
    (the server restarted, or expired it) and the client must start a new one. The
    SDK only fails that one request, so every later call would fail the same way.
    """

    async def watch(response: httpx2.Response) -> None:
        if response.status_code == 404 and MCP_SESSION_ID in response.request.headers:
            ended("the server no longer knows the session (HTTP 404); it probably restarted")

    return watch
