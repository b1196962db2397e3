"""A tiny HTTP/1.1 server on loopback for the gateway tests, plus a fake resolver.

The server answers one request per connection (`Connection: close`), records what it
saw (the Host header, the address it was reached on, the TLS SNI) and lets each test
decide the answer, which may be streamed (`Reply.stream`: an answer too large to hold).
Nothing here talks to anything but 127.0.0.0/8.
"""

from __future__ import annotations

import contextlib
import datetime
import ssl
import tempfile
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["FakeResolver", "LocalServer", "Reply", "Seen", "make_tls"]

# Enough for any request these tests send; a larger head is a bug in the test.
MAX_HEAD_BYTES = 64 * 1024


@dataclass
class Seen:
    """One request as the server received it."""

    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    local_address: str


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    # Sent in place of `body`, part by part: chunked unless `headers` set a
    # Content-Length. The server stops where the client hangs up.
    stream: AsyncGenerator[bytes, None] | None = None


Handler = Callable[[Seen], Awaitable[Reply]]


async def _ok(seen: Seen) -> Reply:
    return Reply(200, {"content-type": "text/plain"}, b"hello")


class LocalServer:
    """`await nursery.start(server.run)` returns once it listens; `port` is then set."""

    def __init__(
        self,
        handler: Handler = _ok,
        *,
        host: str = "127.0.0.1",
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.handler = handler
        self.host = host
        self.port = 0
        self.ssl_context = ssl_context
        self.requests: list[Seen] = []
        # The server name each TLS client asked for, in handshake order.
        self.sni_names: list[str | None] = []
        if ssl_context is not None:
            ssl_context.sni_callback = self._record_sni

    def _record_sni(self, _ssl: object, server_name: str | None, _ctx: object) -> None:
        self.sni_names.append(server_name)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host=self.host)
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._connection, listeners)

    async def _connection(self, stream: trio.SocketStream) -> None:
        local = stream.socket.getsockname()[0]
        transport: trio.abc.Stream = stream
        async with stream:
            try:
                if self.ssl_context is not None:
                    transport = trio.SSLStream(stream, self.ssl_context, server_side=True)
                    await transport.do_handshake()
                seen = await _read_request(transport, local)
                if seen is None:
                    return
                self.requests.append(seen)
                reply = await self.handler(seen)
                if reply.stream is None:
                    await transport.send_all(_render(reply, head_only=seen.method == "HEAD"))
                else:
                    await _send_streamed(transport, reply, reply.stream)
            except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError):
                pass  # the client hung up early: some tests do that on purpose


async def _read_request(stream: trio.abc.Stream, local: str) -> Seen | None:
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return None
        buffer += chunk
        assert len(buffer) < MAX_HEAD_BYTES
    head, _, body = buffer.partition(b"\r\n\r\n")
    request_line, *lines = head.decode("latin-1").split("\r\n")
    method, target, _version = request_line.split(" ", 2)
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return None
        body += chunk
    return Seen(method, target, headers, body, local)


def _render(reply: Reply, *, head_only: bool) -> bytes:
    headers = {"content-length": str(len(reply.body)), "connection": "close", **reply.headers}
    return _head(reply.status, headers) + (b"" if head_only else reply.body)


async def _send_streamed(
    stream: trio.abc.Stream, reply: Reply, parts: AsyncGenerator[bytes, None]
) -> None:
    chunked = "content-length" not in reply.headers
    framing = {"transfer-encoding": "chunked"} if chunked else {}
    await stream.send_all(_head(reply.status, {"connection": "close", **framing, **reply.headers}))
    async with contextlib.aclosing(parts):
        async for part in parts:
            await stream.send_all(b"%x\r\n%b\r\n" % (len(part), part) if chunked else part)
    if chunked:
        await stream.send_all(b"0\r\n\r\n")


def _head(status: int, headers: dict[str, str]) -> bytes:
    head = f"HTTP/1.1 {status} X\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head.encode("latin-1") + b"\r\n"


class FakeResolver:
    """Answers from a fixed table and counts lookups; unknown names do not resolve."""

    def __init__(self, table: dict[str, Sequence[str]]) -> None:
        self.table = table
        self.lookups: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.lookups.append(host)
        await trio.lowlevel.checkpoint()
        if host not in self.table:
            raise OSError(f"[fake resolver] {host} does not resolve")
        return list(self.table[host])


def make_tls(hostname: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A (server, client) pair of SSL contexts: a fresh CA, a certificate for `hostname`.

    The client trusts only this CA. `cryptography` is always there: `mcp` depends on
    `pyjwt[crypto]`.
    """
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "conduit test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(hostname)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _load_chain(server, cert.public_bytes(pem), key_pem)
    client = ssl.create_default_context(cadata=ca.public_bytes(pem).decode())
    return server, client


def _load_chain(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    # load_cert_chain reads files only.
    with tempfile.TemporaryDirectory() as directory:
        cert_path, key_path = Path(directory) / "cert.pem", Path(directory) / "key.pem"
        cert_path.write_bytes(cert_pem)
        key_path.write_bytes(key_pem)
        context.load_cert_chain(cert_path, key_path)
