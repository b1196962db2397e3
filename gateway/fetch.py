"""The host-mediated `fetch` tool: HTTP requests a sandboxed program asks the daemon to make.

Off by default. When enabled, a program may fetch URLs on the operator's host allowlist
(exact names and `*.example.com` suffixes), https only unless http is allowed too, with
the allowed methods (GET and HEAD unless POST is added). Every request goes through
the SSRF guard (so an allowed name that resolves to a private address is still
refused), follows no redirects (a 3xx comes back as it is, Location included), keeps
no cookies (each call has its own client), adds no credentials, caps the request body,
the response body (read as a stream and cut off, `truncated: true`) and the time.

The response comes back as `{status, headers, body, body_encoding, truncated}`: the
body as text when it is UTF-8, else base64. Response bodies are requested and returned
without content coding (`Accept-Encoding: identity`), so a compressed answer cannot
expand past the cap.

The catalogue exposes this as the tool `fetch__fetch` (namespace `fetch`); this module
provides the tool's description (`FETCH_TOOL`, schemas included) and the callable
(`Fetcher.fetch`, which raises a `GatewayError` for anything the program should see as
a failed tool call), and knows nothing about the catalogue or the sandboxes.
"""

from __future__ import annotations

import base64
import codecs
import re
from collections.abc import Mapping
from typing import Annotated, Any

import httpx
import trio
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from conduit.core.errors import GatewayError
from conduit.gateway.fetch_config import FetchConfig, host_allowed
from conduit.gateway.ssrf import SsrfGuard, read_capped

__all__ = [
    "FETCH_INPUT_SCHEMA",
    "FETCH_NAMESPACE",
    "FETCH_OUTPUT_SCHEMA",
    "FETCH_TOOL",
    "FETCH_TOOL_NAME",
    "FetchConfig",
    "FetchFailed",
    "FetchRefused",
    "Fetcher",
    "host_allowed",
]

FETCH_NAMESPACE = "fetch"
FETCH_TOOL_NAME = "fetch"

# Headers a program may not set: they frame the message or name the peer, and the
# daemon decides those (Accept-Encoding: identity keeps the size cap honest).
FORBIDDEN_REQUEST_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "te"}
    | {"trailer", "upgrade", "expect", "proxy-authorization", "proxy-connection"}
    | {"accept-encoding"}
)
# Dropped from answers: cookies are not kept and hop-by-hop headers mean nothing here.
DROPPED_RESPONSE_HEADERS = frozenset(
    {"set-cookie", "set-cookie2", "connection", "keep-alive", "transfer-encoding", "te"}
    | {"trailer", "upgrade", "proxy-authenticate", "proxy-connection"}
)
# Plenty for any API request's headers; a program sending more is doing something else.
MAX_REQUEST_HEADERS = 64
MAX_HEADER_VALUE_BYTES = 8 * 1024
# Browsers and servers cap URLs near here.
MAX_URL_CHARS = 8 * 1024
USER_AGENT = "conduit-fetch"

_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


class FetchRefused(GatewayError):
    """The fetch policy refused the request; nothing was sent."""


class FetchFailed(GatewayError):
    """The request was sent but no usable answer came back (network error, timeout)."""


class _Arguments(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: Annotated[str, Field(min_length=1, max_length=MAX_URL_CHARS)]
    method: str = "GET"
    headers: dict[str, str] = Field(default_factory=dict)
    body: str | None = None


FETCH_INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "url": {
            "type": "string",
            "description": "The URL to fetch; its host must be on the operator's allowlist.",
            "maxLength": MAX_URL_CHARS,
        },
        "method": {
            "type": "string",
            "enum": ["GET", "HEAD", "POST"],
            "default": "GET",
            "description": "GET and HEAD unless the operator allowed POST.",
        },
        "headers": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": "Request headers; framing headers (Host, Content-Length, …) "
            "are not allowed.",
        },
        "body": {"type": "string", "description": "A POST body, as text (sent as UTF-8)."},
    },
    "required": ["url"],
    "additionalProperties": False,
}

FETCH_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "status": {"type": "integer"},
        "headers": {"type": "object", "additionalProperties": {"type": "string"}},
        "body": {"type": "string"},
        "body_encoding": {"type": "string", "enum": ["text", "base64"]},
        "truncated": {"type": "boolean"},
    },
    "required": ["status", "headers", "body", "body_encoding", "truncated"],
}

# The tool as an MCP server would describe it (the catalogue's RawTool shape).
FETCH_TOOL: dict[str, Any] = {
    "name": FETCH_TOOL_NAME,
    "description": (
        "Fetch a URL over HTTP(S) through the host, within the operator's allowlist. "
        "Redirects are not followed (a 3xx is returned with its Location header); "
        "the body is text if it is UTF-8, else base64, and is cut off at the size cap "
        "(truncated: true)."
    ),
    "inputSchema": FETCH_INPUT_SCHEMA,
    "outputSchema": FETCH_OUTPUT_SCHEMA,
    "annotations": {"readOnlyHint": False, "openWorldHint": True},
}


class Fetcher:
    """Performs fetches for sandboxed programs under one `FetchConfig`.

    `guard` replaces the SSRF guard built from the config (tests pass one that may
    reach a local server). Holds no connections between calls; nothing to close.
    """

    def __init__(self, config: FetchConfig, *, guard: SsrfGuard | None = None) -> None:
        self.config = config
        self.guard = guard or SsrfGuard(extra_ports=config.extra_ports)

    def __repr__(self) -> str:
        state = "enabled" if self.config.enabled else "disabled"
        return f"Fetcher({state}, hosts={list(self.config.allowed_hosts)})"

    async def fetch(
        self, arguments: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Perform the request `arguments` describe (FETCH_INPUT_SCHEMA).

        Returns `{status, headers, body, body_encoding, truncated}` for any HTTP
        answer, 4xx, 5xx and 3xx included. Raises FetchRefused (policy; nothing sent),
        DestinationRefused (SSRF guard; nothing sent) or FetchFailed (network error,
        or no complete answer within `timeout_s`, capped by the config's).
        """
        method, url, headers, content = self._check(arguments)
        limit_s = min(self.config.timeout_s, timeout_s or self.config.timeout_s)
        host = url.host
        try:
            with trio.fail_after(limit_s):
                return await self._send(method, url, headers, content)
        except trio.TooSlowError:
            raise FetchFailed(f"fetch {host}: no complete answer within {limit_s:g} s") from None
        except httpx.HTTPError as exc:
            raise FetchFailed(f"fetch {host}: {type(exc).__name__}: {exc}") from exc

    def _check(self, arguments: Mapping[str, Any]) -> tuple[str, httpx.URL, dict[str, str], bytes]:
        """Apply the policy: (method, url, headers, body) to send, or FetchRefused."""
        config = self.config
        if not config.enabled:
            raise FetchRefused(
                "the fetch tool is disabled: the operator enables it with "
                "fetch.enabled = true and fetch.allowed_hosts"
            )
        try:
            args = _Arguments.model_validate(arguments)
        except ValidationError as exc:
            first = exc.errors(include_input=False)[0]
            where = ".".join(map(str, first["loc"])) or "arguments"
            raise FetchRefused(f"fetch: bad argument {where}: {first['msg']}") from None
        url = self._check_url(args.url)
        method = args.method.upper()
        if method not in config.methods:
            allowed = ", ".join(config.methods)
            raise FetchRefused(f"fetch: method {method} is not allowed (allowed: {allowed})")
        content = self._check_body(method, args.body)
        return method, url, _check_headers(args.headers), content

    def _check_url(self, text: str) -> httpx.URL:
        try:
            url = httpx.URL(text)
        except httpx.InvalidURL as exc:
            raise FetchRefused(f"fetch: not a URL: {exc}") from None
        schemes = ("https", "http") if self.config.allow_http else ("https",)
        if url.scheme not in schemes:
            raise FetchRefused(
                f"fetch: scheme {url.scheme!r} is not allowed (allowed: {', '.join(schemes)})"
            )
        if url.userinfo:
            raise FetchRefused("fetch: URLs may not carry credentials (user:password@)")
        host = url.raw_host.decode("ascii")
        if not host_allowed(host, self.config.allowed_hosts):
            raise FetchRefused(f"fetch: host {host} is not in the operator's allowed_hosts")
        return url

    def _check_body(self, method: str, body: str | None) -> bytes:
        if body is None:
            return b""
        if method != "POST":
            raise FetchRefused(f"fetch: a {method} request has no body")
        content = body.encode()
        if len(content) > self.config.max_request_bytes:
            raise FetchRefused(
                f"fetch: the body is {len(content)} bytes; the limit is "
                f"{self.config.max_request_bytes}"
            )
        return content

    async def _send(
        self, method: str, url: httpx.URL, headers: dict[str, str], content: bytes
    ) -> dict[str, Any]:
        # A client per call: no cookies, connections or state outlive the call.
        async with (
            self.guard.open_client(
                timeout=self.config.timeout_s,
                headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"},
            ) as client,
            client.stream(method, url, headers=headers, content=content or None) as response,
        ):
            body, truncated = await read_capped(response, self.config.max_response_bytes, raw=True)
        text, encoding = _encode_body(body, truncated)
        return {
            "status": response.status_code,
            "headers": _filter_headers(response.headers),
            "body": text,
            "body_encoding": encoding,
            "truncated": truncated,
        }


def _check_headers(headers: dict[str, str]) -> dict[str, str]:
    if len(headers) > MAX_REQUEST_HEADERS:
        raise FetchRefused(f"fetch: more than {MAX_REQUEST_HEADERS} headers")
    for name, value in headers.items():
        if not _HEADER_NAME.match(name):
            raise FetchRefused(f"fetch: {name[:64]!r} is not a valid header name")
        if name.lower() in FORBIDDEN_REQUEST_HEADERS:
            raise FetchRefused(f"fetch: the {name} header is set by the daemon, not the program")
        if any(ch in value for ch in "\r\n\0") or len(value.encode()) > MAX_HEADER_VALUE_BYTES:
            raise FetchRefused(f"fetch: the value of header {name} is not allowed")
    return headers


def _encode_body(data: bytes, truncated: bool) -> tuple[str, str]:
    """(body, "text") if `data` is UTF-8, else (base64, "base64").

    A truncated body may end inside a character: that partial character is dropped
    rather than sending the whole body as base64.
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        return decoder.decode(data, final=not truncated), "text"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def _filter_headers(headers: httpx.Headers) -> dict[str, str]:
    """Response headers by lower-case name, repeats joined with ", ", cookies dropped."""
    kept: dict[str, str] = {}
    for name, value in headers.multi_items():
        key = name.lower()
        if key in DROPPED_RESPONSE_HEADERS:
            continue
        kept[key] = f"{kept[key]}, {value}" if key in kept else value
    return kept
