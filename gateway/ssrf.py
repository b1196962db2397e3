"""The SSRF guard: outbound HTTP reaches only globally routable unicast addresses.

Every request an HTTP upstream, the `fetch` tool or a credentials token call makes
passes three checks:

1. The URL: scheme http or https, no userinfo, a port in the allowlist (80, 443 and
   the operator's extras).
2. The address: the host is resolved once (trio's getaddrinfo, or a resolver a test
   plugs in) and *every* answer is classified; one refused answer refuses the lot, so
   a DNS answer that mixes a public and a private address (rebinding within one
   answer set) gets nowhere.
3. The connection: it goes to the address that was checked, never to a second
   resolution of the name (pinning). TLS still verifies the certificate against the
   hostname, which is also the SNI and the Host header, because httpcore takes both
   from the URL, not from the socket.

Pinning lives in an httpcore network backend (`connect_tcp` resolves, checks and
connects to the checked IP); the transports below put that backend under httpx's own
request/response mapping. There is one transport per HTTP stack: `GuardedTransport`
for httpx 0.28 (fetch, token endpoints) and `GuardedTransport2` for httpx2, the fork
the MCP SDK's streamable-HTTP client uses. Redirects are never followed by a client
this module builds; each request a caller does send (the SDK follows same-origin
redirects itself) goes through all three checks again.

An upstream the operator marks `trusted` gets `SsrfGuard(trusted=True)`: any address
and port, still http(s) only and still no userinfo.

`read_capped` reads at most N bytes of a streamed response (fetch, token endpoints).

This module knows nothing about upstreams, tools or configuration files.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable, Sequence
from types import ModuleType
from typing import Any, ClassVar, Protocol

import httpcore
import httpcore2
import httpx
import httpx2
import trio

from conduit.core.errors import GatewayError

__all__ = [
    "DEFAULT_PORTS",
    "DestinationRefused",
    "GuardedTransport",
    "GuardedTransport2",
    "Resolver",
    "SsrfGuard",
    "classify_address",
    "getaddrinfo_resolver",
    "read_capped",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# A resolver maps (host, port) to the addresses it answers, as strings, in order.
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]

# The ports web services listen on; anything else is usually an internal service.
DEFAULT_PORTS = frozenset({80, 443})

# The same defaults as the MCP SDK's own HTTP client: a server may hold an SSE
# response open for minutes, so reads wait longer than everything else.
MCP_TIMEOUT_S = 30.0
MCP_SSE_READ_TIMEOUT_S = 300.0

_TRUSTED_HINT = "; mark the upstream `trusted` if it really lives there"


class DestinationRefused(GatewayError):
    """The SSRF guard refused a destination; nothing was sent to it.

    `host` is the host as the URL named it, `address` the resolved address that broke
    a rule (None for URL-level refusals) and `rule` the rule it broke.
    """

    def __init__(self, host: str, rule: str, *, address: str | None = None) -> None:
        target = host if address is None or address == host else f"{host} ({address})"
        hint = _TRUSTED_HINT if address is not None else ""
        super().__init__(f"refused to connect to {target}: {rule}{hint}")
        self.host = host
        self.address = address
        self.rule = rule


def _networks(*rows: tuple[str, str]) -> tuple[tuple[IPNetwork, str], ...]:
    return tuple((ipaddress.ip_network(cidr), rule) for cidr, rule in rows)


# Checked in order; the first match names the rule. Written out rather than trusting
# `is_global`, whose tables (Python 3.11.7 here) call multicast, 192.0.0.0/24 beyond
# /29, the 6to4 relay anycast, IPv6 site-local and 3fff::/20 "global".
_IPV4_RULES = _networks(
    ("0.0.0.0/8", "'this network' 0.0.0.0/8"),
    ("10.0.0.0/8", "private network 10.0.0.0/8"),
    ("100.64.0.0/10", "carrier-grade NAT 100.64.0.0/10"),
    ("127.0.0.0/8", "loopback 127.0.0.0/8"),
    ("169.254.0.0/16", "link-local 169.254.0.0/16 (cloud metadata lives here)"),
    ("172.16.0.0/12", "private network 172.16.0.0/12"),
    ("192.0.0.0/24", "IETF protocol assignments 192.0.0.0/24"),
    ("192.0.2.0/24", "documentation 192.0.2.0/24"),
    ("192.88.99.0/24", "6to4 relay anycast 192.88.99.0/24"),
    ("192.168.0.0/16", "private network 192.168.0.0/16"),
    ("198.18.0.0/15", "benchmarking 198.18.0.0/15"),
    ("198.51.100.0/24", "documentation 198.51.100.0/24"),
    ("203.0.113.0/24", "documentation 203.0.113.0/24"),
    ("224.0.0.0/4", "multicast 224.0.0.0/4"),
    ("255.255.255.255/32", "broadcast 255.255.255.255"),
    ("240.0.0.0/4", "reserved 240.0.0.0/4"),
)

_IPV6_RULES = _networks(
    ("::/128", "unspecified ::"),
    ("::1/128", "loopback ::1"),
    ("64:ff9b:1::/48", "local-use NAT64 64:ff9b:1::/48"),
    ("100::/64", "discard-only 100::/64"),
    ("2001::/23", "IETF protocol assignments 2001::/23"),
    ("2001:db8::/32", "documentation 2001:db8::/32"),
    ("3fff::/20", "documentation 3fff::/20"),
    ("fc00::/7", "unique local fc00::/7"),
    ("fe80::/10", "link-local fe80::/10"),
    ("fec0::/10", "site-local fec0::/10"),
    ("ff00::/8", "multicast ff00::/8"),
)

# IANA's global unicast space; everything outside it is special or unassigned.
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")


def classify_address(address: IPAddress | str) -> str | None:
    """The rule that refuses `address`, or None if it is globally routable unicast.

    IPv6 forms that carry an IPv4 address to the IPv4 internet (IPv4-mapped
    ::ffff:0:0/96, NAT64 64:ff9b::/96, 6to4 2002::/16) are judged by the address they
    embed, so ::ffff:127.0.0.1 is loopback. IPv4-compatible ::/96 and Teredo are
    refused whatever they embed. Raises ValueError for a string that is no address.
    """
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    if isinstance(ip, ipaddress.IPv4Address):
        return _classify_ipv4(ip)
    ip = ipaddress.IPv6Address(int(ip))  # drop a zone (%eth0): it changes no rule
    embedded = _embedded_ipv4(ip)
    if embedded is not None:
        form, ipv4 = embedded
        rule = _classify_ipv4(ipv4)
        return None if rule is None else f"{form} address embedding {ipv4}, {rule}"
    return _classify_ipv6(ip)


def _classify_ipv4(ip: ipaddress.IPv4Address) -> str | None:
    for network, rule in _IPV4_RULES:
        if ip in network:
            return rule
    # A backstop for ranges IANA adds that the table above has not caught up with.
    return None if ip.is_global else "not globally routable"


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    """The IPv4 address an IPv6 address stands for, if it is a translation form."""
    if ip.ipv4_mapped is not None:
        return "IPv4-mapped", ip.ipv4_mapped
    if ip in _NAT64:
        return "NAT64", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return "6to4", ip.sixtofour
    return None


def _classify_ipv6(ip: ipaddress.IPv6Address) -> str | None:
    if ip.teredo is not None:
        server, client = ip.teredo
        return f"Teredo tunnel 2001::/32 (server {server}, client {client})"
    for network, rule in _IPV6_RULES:
        if ip in network:
            return rule
    if ip in _IPV4_COMPATIBLE:
        embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        return f"deprecated IPv4-compatible address (embeds {embedded})"
    if ip not in _GLOBAL_UNICAST:
        return "outside the global unicast range 2000::/3"
    return None if ip.is_global else "not globally routable"


async def getaddrinfo_resolver(host: str, port: int) -> list[str]:
    """Every address trio's getaddrinfo answers for `host`, in its order.

    Raises OSError (socket.gaierror) when the name does not resolve.
    """
    infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


class _UrlLike(Protocol):
    """What the guard reads from a URL; httpx.URL and httpx2.URL both fit."""

    @property
    def scheme(self) -> str: ...
    @property
    def userinfo(self) -> bytes: ...
    @property
    def raw_host(self) -> bytes: ...
    @property
    def port(self) -> int | None: ...


class SsrfGuard:
    """The policy one upstream's (or the fetch tool's) outbound HTTP follows.

    `trusted` skips the address and port rules (for upstreams the operator vouches
    for). `extra_ports` are allowed besides 80 and 443. `allow_networks` are allowed
    although a rule would refuse them: an explicit operator override, and how tests
    reach a local server. `resolver` replaces getaddrinfo (tests use fake ones).

    The guard is immutable and holds no connections; the clients it builds do, and
    their owners close them.
    """

    def __init__(
        self,
        *,
        trusted: bool = False,
        extra_ports: Iterable[int] = (),
        allow_networks: Iterable[IPNetwork | str] = (),
        resolver: Resolver | None = None,
    ) -> None:
        self.trusted = trusted
        self.ports = DEFAULT_PORTS | frozenset(extra_ports)
        self.allow_networks = tuple(ipaddress.ip_network(net) for net in allow_networks)
        self._resolver = resolver or getaddrinfo_resolver
        # Loading CA certificates costs milliseconds; build one context per HTTP stack.
        self._ssl_contexts: dict[str, ssl.SSLContext] = {}

    def __repr__(self) -> str:
        if self.trusted:
            return "SsrfGuard(trusted)"
        nets = ", ".join(map(str, self.allow_networks))
        return f"SsrfGuard(ports={sorted(self.ports)}, allow_networks=[{nets}])"

    def check_url(self, url: _UrlLike | str) -> tuple[str, int]:
        """Return the URL's (host, port) or raise DestinationRefused.

        Refuses schemes other than http and https, userinfo (credentials belong in
        the upstream's `auth`, not in a URL) and, unless trusted, ports outside the
        allowlist. Says nothing about addresses: those are checked on connect.
        """
        parsed: _UrlLike = httpx.URL(url) if isinstance(url, str) else url
        host = parsed.raw_host.decode("ascii")
        if parsed.scheme not in ("http", "https"):
            raise DestinationRefused(host, f"scheme {parsed.scheme!r} is not http or https")
        if parsed.userinfo:
            raise DestinationRefused(host, "URLs may not carry credentials (user:password@)")
        if not host:
            raise DestinationRefused(host, "the URL has no host")
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        self.check_port(host, port)
        return host, port

    def check_port(self, host: str, port: int) -> None:
        """Raise DestinationRefused unless `port` is allowed (any port when trusted)."""
        if not self.trusted and port not in self.ports:
            allowed = ", ".join(map(str, sorted(self.ports)))
            raise DestinationRefused(host, f"port {port} is not allowed (allowed: {allowed})")

    def check_address(self, host: str, address: str) -> None:
        """Raise DestinationRefused if `host`'s answer `address` breaks a rule."""
        if self.trusted:
            return
        ip = ipaddress.ip_address(address.partition("%")[0])
        if any(ip in network for network in self.allow_networks):
            return
        rule = classify_address(ip)
        if rule is not None:
            raise DestinationRefused(host, rule, address=address)

    async def resolve(self, host: str, port: int) -> list[str]:
        """The checked addresses to connect to for `host`, in the resolver's order.

        An IP literal is checked as is, without a lookup. Otherwise every answer is
        checked and one bad answer refuses them all. Raises DestinationRefused, or
        OSError when the name does not resolve or resolves to nothing.
        """
        self.check_port(host, port)
        if _is_ip_literal(host):
            answers: Sequence[str] = [host]
        else:
            answers = list(dict.fromkeys(await self._resolver(host, port)))
        if not answers:
            raise OSError(f"{host} resolved to no addresses")
        for address in answers:
            self.check_address(host, address)
        return list(answers)

    def ssl_context(
        self, stack: ModuleType, verify: ssl.SSLContext | bool = True
    ) -> ssl.SSLContext:
        """A client SSL context for `stack` (httpx or httpx2), shared by its clients."""
        if isinstance(verify, ssl.SSLContext):
            return verify
        key = f"{stack.__name__}:{verify}"
        if key not in self._ssl_contexts:
            # trust_env here only means SSL_CERT_FILE/SSL_CERT_DIR: the operator's CAs.
            self._ssl_contexts[key] = stack.create_ssl_context(verify=verify, trust_env=True)
        return self._ssl_contexts[key]

    def open_client(self, **kwargs: Any) -> httpx.AsyncClient:
        """An httpx.AsyncClient whose every request goes through this guard.

        Never follows redirects, ignores proxy and netrc environment variables, and
        takes the other httpx.AsyncClient keyword arguments as they are (`verify`
        goes to the transport). The caller closes it (`async with`).
        """
        verify = kwargs.pop("verify", True)
        return httpx.AsyncClient(
            transport=GuardedTransport(self, verify=verify),
            follow_redirects=False,
            trust_env=False,
            **kwargs,
        )

    def open_mcp_client(
        self,
        headers: dict[str, str] | None = None,
        timeout: httpx2.Timeout | None = None,
        auth: httpx2.Auth | None = None,
        *,
        verify: ssl.SSLContext | bool = True,
    ) -> httpx2.AsyncClient:
        """An httpx2.AsyncClient for the MCP SDK, every request through this guard.

        Has the signature of the SDK's `McpHttpClientFactory`, so the bound method is
        a drop-in for `create_mcp_http_client`; pass the client it returns to
        `streamable_http_client(url, http_client=...)`. Timeouts default to the SDK's
        (30 s, reads 300 s for SSE). Never follows redirects itself; the SDK follows
        same-origin ones, each through the guard. The caller closes it.
        """
        return httpx2.AsyncClient(
            transport=GuardedTransport2(self, verify=verify),
            headers=headers,
            timeout=timeout or httpx2.Timeout(MCP_TIMEOUT_S, read=MCP_SSE_READ_TIMEOUT_S),
            auth=auth,
            follow_redirects=False,
            trust_env=False,
        )


async def read_capped(response: Any, limit: int, *, raw: bool = False) -> tuple[bytes, bool]:
    """Up to `limit` bytes of an httpx or httpx2 streamed response's body, and whether
    there was more. `raw` skips content decoding (`aiter_raw`).

    Past the limit it closes the response and reads no further. The close makes the
    next step of httpx's body iteration fail, which is expected and swallowed: leaving
    the loop with `break` would abandon httpx's nested async generators to the garbage
    collector, which trio reports as a ResourceWarning.
    """
    chunks: list[bytes] = []
    size = 0
    truncated = False
    try:
        async for chunk in response.aiter_raw() if raw else response.aiter_bytes():
            if truncated:
                continue
            kept = chunk[: limit - size]
            chunks.append(kept)
            size += len(kept)
            if len(kept) < len(chunk):
                truncated = True
                await response.aclose()
    except Exception:
        if not truncated:
            raise
    return b"".join(chunks), truncated


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return False
    return True


class _PinnedBackend:
    """An httpcore network backend that connects only to addresses the guard checked.

    Duck-typed to httpcore's and httpcore2's `AsyncNetworkBackend` (their interfaces
    are identical). Errors come out as the stack's own ConnectError/ConnectTimeout so
    httpx maps them as usual; a refusal comes out as DestinationRefused, untouched.
    """

    def __init__(self, guard: SsrfGuard, core: ModuleType) -> None:
        self._guard = guard
        self._core = core
        self._inner = core.TrioBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109  httpcore's interface passes it
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> Any:
        """Resolve `host`, check every answer, connect to the first that accepts.

        `timeout` bounds resolution and all attempts together, as it bounds
        getaddrinfo plus connect in httpcore's own backends.
        """
        try:
            with trio.fail_after(float("inf") if timeout is None else timeout):
                return await self._connect(host, port, local_address, socket_options)
        except trio.TooSlowError:
            raise self._core.ConnectTimeout(f"connecting to {host}:{port} timed out") from None

    async def _connect(
        self,
        host: str,
        port: int,
        local_address: str | None,
        socket_options: Iterable[Any] | None,
    ) -> Any:
        try:
            addresses = await self._guard.resolve(host, port)
        except OSError as exc:
            raise self._core.ConnectError(f"cannot resolve {host}: {exc}") from exc
        failure: Exception | None = None
        for address in addresses:
            try:
                # The checked address, not the name: no second lookup to rebind.
                return await self._inner.connect_tcp(
                    address, port, local_address=local_address, socket_options=socket_options
                )
            except self._core.ConnectError as exc:
                failure = exc
        assert failure is not None  # resolve() never returns an empty list
        raise failure

    async def connect_unix_socket(self, path: str, *args: Any, **kwargs: Any) -> Any:
        raise DestinationRefused(path, "Unix sockets are not reachable through the guard")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _Guarded:
    """What both guarded transports share; mixed in before the stack's transport.

    The stack's AsyncHTTPTransport keeps its request/response and exception mapping;
    only its connection pool is replaced by one on the pinned backend. Neither httpx
    nor httpx2 takes a network backend, so this sets the `_pool` attribute that both
    (pinned versions) use; a check makes an upgrade that renames it fail loudly
    at construction instead of silently bypassing the guard.
    """

    _http: ClassVar[ModuleType]
    _core: ClassVar[ModuleType]
    _pool: Any

    def __init__(
        self,
        guard: SsrfGuard,
        *,
        verify: ssl.SSLContext | bool = True,
        http2: bool = False,
        limits: Any = None,
    ) -> None:
        context = guard.ssl_context(self._http, verify)
        limits = limits or self._http.Limits(max_connections=100, max_keepalive_connections=20)
        # The stack's own transport, built as usual; its pool is replaced just below.
        super().__init__(  # type: ignore[call-arg]
            verify=context, trust_env=False, http2=http2, limits=limits
        )
        if not isinstance(self._pool, self._core.AsyncConnectionPool):
            raise RuntimeError(f"{self._http.__name__} changed its transport; update ssrf.py")
        self._pool = self._core.AsyncConnectionPool(
            ssl_context=context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            http1=True,
            http2=http2,
            network_backend=_PinnedBackend(guard, self._core),
        )
        self.guard = guard

    async def handle_async_request(self, request: Any) -> Any:
        """Check the URL, then send through the pinned pool (DestinationRefused if not)."""
        self.guard.check_url(request.url)
        return await super().handle_async_request(request)  # type: ignore[misc]


class GuardedTransport(_Guarded, httpx.AsyncHTTPTransport):
    """An httpx (0.28) transport whose every connection goes through `guard`.

    `GuardedTransport(guard, verify=True, http2=False, limits=None)`; `verify` may be
    an ssl.SSLContext (tests trust their own CA that way).
    """

    _http = httpx
    _core = httpcore


class GuardedTransport2(_Guarded, httpx2.AsyncHTTPTransport):
    """The same for httpx2, the HTTP client of the MCP SDK (mcp >= 2)."""

    _http = httpx2
    _core = httpcore2
