"""Attacks on MCP over streamable HTTP, as a hostile local process, a hostile web page
(DNS rebinding), a client with a narrow token, or a buggy MCP client would make them.

Each test is one attack against a real daemon. Attacks the endpoint refuses are plain
tests that lock the refusal in. Attacks that succeed are `xfail(strict=True)` tests
asserting what the endpoint *should* do: they fail today (so they pass as xfail), and
start passing (so fail as XPASS) once the product is fixed, when the marker goes.

After every attack the test checks the daemon still serves a fresh client
(`_still_serves`): it initializes and runs a program.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

from conduit.daemon import mcp_http
from conduit.daemon.auth import hash_token
from conduit.daemon.server import ServingInfo
from tests.conftest import MASTER_TOKEN, WAIT_S
from tests.e2e.mcp_helpers import NO_SANDBOXES
from tests.e2e.test_mcp_http import ACCEPT, INIT, MAX_MESSAGE_BYTES, python_daemon_over_http
from tests.served import Served

# A second principal with every scope, and a narrow one that may only list tools.
OTHER_TOKEN = "cdt_attack_other_client_token_0123456789"
NARROW_TOKEN = "cdt_attack_narrow_client_token_0123456789"
# A client whose programs no test cancels: the daemon refuses a caller whose cancelled
# programs are still winding down, so a test that needs its program to run uses this.
CALM_TOKEN = "cdt_attack_calm_client_token_01234567890"
MAX_IN_FLIGHT = 4


@pytest.fixture(scope="module")
def http_daemon(
    tmp_path_factory: pytest.TempPathFactory, wasm_cache: Path
) -> Iterator[Served[ServingInfo]]:
    state = tmp_path_factory.mktemp("mcp-http-attacks") / "state"
    clients = [
        {"name": "other", "sha256": hash_token(OTHER_TOKEN)},
        {"name": "narrow", "sha256": hash_token(NARROW_TOKEN), "scopes": ["tools"]},
        {"name": "calm", "sha256": hash_token(CALM_TOKEN)},
    ]
    in_flight = {"server.max_in_flight_per_connection": MAX_IN_FLIGHT}
    with python_daemon_over_http(state, wasm_cache, clients, **in_flight) as served:
        yield served


@pytest.fixture
def port(http_daemon: Served[ServingInfo]) -> int:
    address = http_daemon.value.mcp_http_address
    assert address is not None
    return address[1]


def _url(port: int) -> str:
    return f"http://127.0.0.1:{port}/mcp"


def _headers(token: str = MASTER_TOKEN, **extra: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        "Accept": ACCEPT,
        **extra,
    }


async def _open_session(http: httpx2.AsyncClient, port: int, token: str = MASTER_TOKEN) -> str:
    answer = await http.post(_url(port), json=INIT, headers=_headers(token))
    assert answer.status_code == 200, answer.text
    session = answer.headers["mcp-session-id"]
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    done = await http.post(
        _url(port), json=initialized, headers=_headers(token, **{"Mcp-Session-Id": session})
    )
    assert done.status_code == 202
    return session


def _call(ident: Any, code: str, **meta: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"name": "execute_python", "arguments": {"code": code}}
    if meta:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": ident, "method": "tools/call", "params": params}


async def _still_serves(port: int) -> None:
    """A fresh client initializes and runs a program: the attack broke nothing."""
    with trio.fail_after(WAIT_S):
        async with httpx2.AsyncClient(timeout=WAIT_S) as http:
            session = await _open_session(http, port)
            answer = await http.post(
                _url(port),
                json=_call(7, "6 * 7"),
                headers=_headers(**{"Mcp-Session-Id": session}),
            )
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"]["structuredContent"]["result"] == 42


# ---- raw HTTP ---------------------------------------------------------------------------


@dataclass
class _Response:
    status: int
    headers: dict[str, str]
    body: bytes = b""
    raw_head: bytes = b""
    extra: list[str] = field(default_factory=list)

    def json(self) -> Any:
        return json.loads(self.body)


class _Raw:
    """One TCP connection speaking bytes, with a minimal HTTP/1.1 response reader."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    @classmethod
    async def open(cls, port: int) -> _Raw:
        return cls(await trio.open_tcp_stream("127.0.0.1", port))

    async def send(self, data: bytes) -> None:
        """Send `data`; a daemon that closes mid-way (it refused early) is no error."""
        with contextlib.suppress(trio.BrokenResourceError):
            await self.stream.send_all(data)

    async def _fill(self) -> bool:
        try:
            chunk = await self.stream.receive_some(65536)
        except trio.BrokenResourceError:
            chunk = b""
        self.buffer += chunk
        return bool(chunk)

    async def closed(self, wait_s: float = WAIT_S) -> bool:
        """Whether the daemon closes the connection (reading and discarding) in time."""
        with trio.move_on_after(wait_s):
            try:
                while await self._fill():
                    pass
            except trio.BrokenResourceError:
                pass
            return True
        return False

    async def response(self, wait_s: float = WAIT_S) -> _Response | None:
        """The next whole response, or None if the connection closed first."""
        with trio.fail_after(wait_s):
            while b"\r\n\r\n" not in self.buffer:
                if not await self._fill():
                    return None
            head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ")[1])
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            response = _Response(status, headers, raw_head=head)
            if 100 <= status < 200:
                return response
            if "content-length" in headers:
                body = await self._take(int(headers["content-length"]))
            elif headers.get("transfer-encoding") == "chunked":
                body = await self._chunked()
            else:
                body = b""
            if body is None:
                return None
            response.body = body
            return response

    async def _take(self, length: int) -> bytes | None:
        while len(self.buffer) < length:
            if not await self._fill():
                return None
        taken, self.buffer = self.buffer[:length], self.buffer[length:]
        return taken

    async def _chunked(self) -> bytes | None:
        body = b""
        while True:
            while b"\r\n" not in self.buffer:
                if not await self._fill():
                    return None
            size_line, self.buffer = self.buffer.split(b"\r\n", 1)
            size = int(size_line.split(b";")[0], 16)
            chunk = await self._take(size + 2)
            if chunk is None:
                return None
            body += chunk[:size]
            if size == 0:
                return body

    async def aclose(self) -> None:
        await self.stream.aclose()


def _request(
    method: str = "POST",
    body: bytes = b"",
    *,
    target: str = "/mcp",
    version: str = "HTTP/1.1",
    host: str | None = "127.0.0.1",
    token: str | None = MASTER_TOKEN,
    length: bool = True,
    extra: tuple[tuple[str, str], ...] = (),
) -> bytes:
    lines = [f"{method} {target} {version}"]
    if host is not None:
        lines.append(f"Host: {host}")
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    lines += ["Content-Type: application/json", f"Accept: {ACCEPT}"]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    lines += [f"{name}: {value}" for name, value in extra]
    return "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body


async def _one(port: int, data: bytes) -> _Response | None:
    raw = await _Raw.open(port)
    try:
        await raw.send(data)
        return await raw.response()
    finally:
        await raw.aclose()


_PING = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
_INIT = json.dumps(INIT).encode()


# ---- HTTP parsing: refused, and the daemon goes on -------------------------------------


@pytest.mark.parametrize(
    ("data", "statuses"),
    [
        # Two different lengths: which one frames the next request is ambiguous.
        (
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n"
            b"Content-Length: 6\r\n\r\nhello!",
            {400},
        ),
        # A length that is not digits, or past any integer.
        (b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: +5\r\n\r\nhello", {400}),
        (
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: " + b"9" * 40 + b"\r\n\r\n",
            {400},
        ),
        # Codings other than chunked, a chunk size past any body, a chunk extension
        # past the head limit (401 without a token: the head is judged before the body).
        (
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: gzip, chunked"
            b"\r\n\r\n0\r\n\r\n",
            {400, 501},
        ),
        (
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"ffffffffffffffffffff\r\n" + b"x" * (MAX_MESSAGE_BYTES + 10),
            {401, 413},
        ),
        (
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n5;"
            + b"x" * 40_000,
            {400, 401, 431},
        ),
        # Headers past 16 KiB; NUL in a header; two Host headers; no Host in HTTP/1.1.
        (
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n",
            {431},
        ),
        (b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX: a\x00b\r\nContent-Length: 0\r\n\r\n", {400}),
        (
            b"POST /mcp HTTP/1.1\r\nHost: evil.example\r\nHost: 127.0.0.1\r\n"
            b"Content-Length: 0\r\n\r\n",
            {400},
        ),
        (b"POST /mcp HTTP/1.1\r\nContent-Length: 0\r\n\r\n", {400}),
        # Not HTTP at all.
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64 + b"\r\n\r\n", {400}),
    ],
    ids=[
        "two-content-lengths",
        "signed-length",
        "huge-length",
        "gzip-chunked",
        "huge-chunk",
        "giant-chunk-extension",
        "giant-header",
        "nul-in-header",
        "two-hosts",
        "no-host",
        "tls-hello",
    ],
)
async def test_malformed_framing_is_refused(port: int, data: bytes, statuses: set[int]) -> None:
    """Never run: refused, or (see the xfail below) the connection closed unanswered."""
    response = await _one(port, data)
    assert response is None or response.status in statuses, response
    await _still_serves(port)


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n", 431),
        (b"POST /mcp HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 400),
    ],
    ids=["giant-header-431", "no-host-400"],
)
async def test_a_malformed_head_is_answered_with_its_status(
    port: int, data: bytes, status: int
) -> None:
    """docs/mcp.md and the module promise 431 for a head over 16 KiB, 400 for bad HTTP."""
    response = await _one(port, data)
    assert response is not None and response.status == status


async def test_a_head_over_16_kib_in_one_write_is_refused(port: int) -> None:
    data = _request(body=_INIT, extra=(("X-Big", "a" * 40_000),))
    response = await _one(port, data)
    assert response is None or response.status == 431, response
    await _still_serves(port)


async def test_giant_body_is_refused_before_it_is_all_sent(port: int) -> None:
    """A Content-Length over the limit is 413 at once: nothing waits for the body."""
    raw = await _Raw.open(port)
    head = _request(body=b"")
    head = head.replace(b"Content-Length: 0", f"Content-Length: {1 << 40}".encode())
    await raw.send(head)
    response = await raw.response()
    assert response is not None and response.status == 413
    assert response.headers.get("connection") == "close"
    await raw.aclose()
    await _still_serves(port)


async def test_content_length_with_chunked_uses_the_chunks(port: int) -> None:
    """Both framings at once (the smuggling classic): the chunks frame the body, and the
    bytes the Content-Length would have claimed are not read as a second request."""
    body = _PING
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    data = _request(
        body=chunked,
        length=False,
        extra=(("Content-Length", "3"), ("Transfer-Encoding", "chunked")),
    )
    raw = await _Raw.open(port)
    await raw.send(data)
    response = await raw.response()
    assert response is not None
    # ping without a session: 400 asking for Mcp-Session-Id, i.e. the whole body was read.
    assert response.status == 400
    assert "Mcp-Session-Id" in response.json()["error"]["message"]
    await raw.aclose()
    await _still_serves(port)


async def test_obs_fold_is_unfolded_not_smuggled(port: int) -> None:
    """An obsolete folded header continues the previous one; it cannot add a header."""
    data = _request(body=_INIT, token=None, extra=(("X-Note", "a\r\n Authorization: x"),))
    data = data.replace(b"Authorization: x", b"Authorization: Bearer " + MASTER_TOKEN.encode())
    response = await _one(port, data)
    assert response is not None
    assert response.status in (400, 401)
    await _still_serves(port)


async def test_pipelined_requests_are_answered_in_order(port: int) -> None:
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        session = await _open_session(http, port)
    extra = (("Mcp-Session-Id", session),)
    pings = b"".join(
        _request(
            body=json.dumps({"jsonrpc": "2.0", "id": n, "method": "ping"}).encode(), extra=extra
        )
        for n in range(5)
    )
    raw = await _Raw.open(port)
    await raw.send(pings)
    for n in range(5):
        response = await raw.response()
        assert response is not None and response.status == 200
        assert response.json()["id"] == n
    await raw.aclose()
    await _still_serves(port)


@pytest.mark.parametrize("method", ["GET", "DELETE"])
async def test_a_body_on_get_or_delete_is_read_and_ignored(port: int, method: str) -> None:
    """The body is consumed, not taken for the next request on the connection."""
    smuggled = _request("POST", _INIT)  # inside the body: must never be run
    data = _request(method, smuggled) + _request("POST", _PING)
    raw = await _Raw.open(port)
    await raw.send(data)
    first = await raw.response()
    assert first is not None and first.status == 400  # no Mcp-Session-Id
    second = await raw.response()
    assert second is not None and second.status == 400
    assert "mcp-session-id" not in second.headers  # not an initialize answer
    await raw.aclose()
    await _still_serves(port)


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
        b'{"jsonrpc":"2.0","id":1e400,"method":"ping"}',
        b'{"jsonrpc":"2.0","id":' + b"9" * 5000 + b',"method":"ping"}',
        b'{"jsonrpc":"2.0","id":NaN,"method":"ping"}',
        b'{"jsonrpc":"2.0","id":1,"method":"\xff\xfe"}',
        b"\xef\xbb\xbf" + _PING,
        _PING + b"\x00",
    ],
    ids=[
        "nested-arrays",
        "nested-objects",
        "1e400",
        "huge-int",
        "nan",
        "not-utf8",
        "bom",
        "trailing-nul",
    ],
)
async def test_hostile_json_is_refused(port: int, body: bytes) -> None:
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        answer = await http.post(_url(port), content=body, headers=_headers())
    assert answer.status_code in (400, 413), answer.text
    assert "mcp-session-id" not in answer.headers
    await _still_serves(port)


@pytest.mark.parametrize(
    "ident", [[1], {"a": 1}, True, None], ids=["list-id", "object-id", "bool-id", "null-id"]
)
async def test_ids_that_are_not_ids_are_refused(port: int, ident: Any) -> None:
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        session = await _open_session(http, port)
        answer = await http.post(
            _url(port),
            json={"jsonrpc": "2.0", "id": ident, "method": "ping"},
            headers=_headers(**{"Mcp-Session-Id": session}),
        )
    assert answer.status_code == 400, answer.text
    await _still_serves(port)


@pytest.mark.parametrize(
    ("content_type", "accept", "status"),
    [
        ("text/plain", ACCEPT, 415),
        ("application/x-www-form-urlencoded", ACCEPT, 415),  # a browser's "simple" POST
        ("multipart/form-data; boundary=x", ACCEPT, 415),
        ("application/json", "image/png", 406),
    ],
)
async def test_wrong_content_type_or_accept(
    port: int, content_type: str, accept: str, status: int
) -> None:
    headers = {**_headers(), "Content-Type": content_type, "Accept": accept}
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        answer = await http.post(_url(port), content=_INIT, headers=headers)
    assert answer.status_code == status, answer.text
    assert "mcp-session-id" not in answer.headers


async def test_http_1_0_is_served_and_closed(port: int) -> None:
    raw = await _Raw.open(port)
    await raw.send(_request(body=_INIT, version="HTTP/1.0"))
    response = await raw.response()
    assert response is not None and response.status == 200
    assert await raw.closed()
    await raw.aclose()


async def test_absolute_form_target_cannot_name_another_host(port: int) -> None:
    for target in ("http://evil.example/mcp", "http://127.0.0.1/mcp", "*"):
        response = await _one(port, _request(body=_INIT, target=target))
        assert response is not None and response.status in (400, 403, 404), target
    await _still_serves(port)


async def test_expect_100_continue_for_a_valid_client(port: int) -> None:
    raw = await _Raw.open(port)
    await raw.send(
        _request(body=b"", extra=(("Expect", "100-continue"),)).replace(
            b"Content-Length: 0", f"Content-Length: {len(_INIT)}".encode()
        )
    )
    interim = await raw.response()
    assert interim is not None and interim.status == 100
    await raw.send(_INIT)
    response = await raw.response()
    assert response is not None and response.status == 200
    await raw.aclose()


# ---- authentication, before and after the body -----------------------------------------


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Bearer",
        "Bearer ",
        f"Basic {MASTER_TOKEN}",
        f"Bearer {MASTER_TOKEN[:-1]}",
        f"Bearer {MASTER_TOKEN}x",
        f"Bearer {MASTER_TOKEN.upper()}",
        f"Bearer\t{MASTER_TOKEN}",
        f"Bearer {MASTER_TOKEN}\x00",
        "Bearer " + "a" * 15_000,
    ],
)
async def test_no_or_a_wrong_token_is_401(port: int, authorization: str | None) -> None:
    headers = {"Content-Type": "application/json", "Accept": ACCEPT}
    if authorization is not None:
        headers["Authorization"] = authorization
    try:
        async with httpx2.AsyncClient(timeout=WAIT_S) as http:
            answer = await http.post(_url(port), content=_INIT, headers=headers)
    except httpx2.LocalProtocolError:  # the client refuses to send a NUL or a tab itself
        return
    assert answer.status_code in (400, 401), answer.text
    assert "mcp-session-id" not in answer.headers
    await _still_serves(port)


async def test_no_token_gets_401_before_sending_its_body(port: int) -> None:
    """A client without a token asking `Expect: 100-continue` should hear 401 at once,
    not an invitation to upload up to server.max_message_bytes."""
    raw = await _Raw.open(port)
    head = _request(body=b"", token=None, extra=(("Expect", "100-continue"),))
    await raw.send(
        head.replace(b"Content-Length: 0", f"Content-Length: {MAX_MESSAGE_BYTES}".encode())
    )
    response = await raw.response()
    await raw.aclose()
    assert response is not None and response.status == 401, response


async def test_no_token_is_refused_without_waiting_for_the_body(port: int) -> None:
    raw = await _Raw.open(port)
    head = _request(body=b"", token=None)
    await raw.send(
        head.replace(b"Content-Length: 0", f"Content-Length: {MAX_MESSAGE_BYTES}".encode())
    )
    await raw.send(b"{" * 1000)
    try:
        response = await raw.response(wait_s=2.0)
    except trio.TooSlowError:
        response = None  # still reading the body it will refuse
    await raw.aclose()
    assert response is not None and response.status == 401


async def test_a_narrow_token_cannot_run_programs(port: int) -> None:
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        session = await _open_session(http, port, NARROW_TOKEN)
        headers = _headers(NARROW_TOKEN, **{"Mcp-Session-Id": session})
        listed = await http.post(
            _url(port), json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=headers
        )
        names = [tool["name"] for tool in listed.json()["result"]["tools"]]
        assert not any(name.startswith("execute_") for name in names)
        for method, params in [
            ("tools/call", {"name": "execute_python", "arguments": {"code": "1"}}),
            ("execute", {"language": "python", "code": "1"}),
            ("executions/list", {}),
            ("admin/reload", {}),
            ("auth/login", {"token": MASTER_TOKEN}),
        ]:
            answer = await http.post(
                _url(port),
                json={"jsonrpc": "2.0", "id": 3, "method": method, "params": params},
                headers=headers,
            )
            body = answer.json()
            assert "error" in body or body["result"].get("isError") is True, (method, body)
            assert "structuredContent" not in body.get("result", {}), (method, body)
        # And the login attempt did not widen the session.
        again = await http.post(
            _url(port), json={"jsonrpc": "2.0", "id": 4, "method": "tools/list"}, headers=headers
        )
        assert [tool["name"] for tool in again.json()["result"]["tools"]] == names
    await _still_serves(port)


async def test_a_sandbox_session_token_is_refused(port: int) -> None:
    """A program's own session token (what it calls tools with) opens no MCP session."""
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        session = await _open_session(http, port)
        code = "import os\nsorted(k for k in os.environ)"
        answer = await http.post(
            _url(port), json=_call(2, code), headers=_headers(**{"Mcp-Session-Id": session})
        )
    assert answer.status_code == 200
    # The sandbox holds no token in its environment to steal; nothing more to try here.
    assert not any("TOKEN" in key for key in answer.json()["result"]["structuredContent"]["result"])


# ---- sessions: another principal's, fixation, exhaustion, cancellation ----------------


async def test_another_principals_session_is_not_found(port: int) -> None:
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        mine = await _open_session(http, port)
        for token in (OTHER_TOKEN, NARROW_TOKEN):
            theirs = _headers(token, **{"Mcp-Session-Id": mine})
            ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
            assert (await http.post(_url(port), json=ping, headers=theirs)).status_code == 404
            stream = await http.get(_url(port), headers=theirs)
            assert stream.status_code == 404
            assert (await http.delete(_url(port), headers=theirs)).status_code == 404
        # Still mine, still open.
        ping = {"jsonrpc": "2.0", "id": 3, "method": "ping"}
        mine_headers = _headers(**{"Mcp-Session-Id": mine})
        assert (await http.post(_url(port), json=ping, headers=mine_headers)).status_code == 200


@pytest.mark.parametrize(
    "session_id", ["", "x", "0" * 43, "a" * 10_000, "../../etc", "\x7f\x80\xff"]
)
async def test_guessed_session_ids_are_not_found(port: int, session_id: str) -> None:
    data = _request(body=_PING, extra=(("Mcp-Session-Id", session_id),))
    response = await _one(port, data)
    assert response is not None and response.status in (400, 404)


async def test_a_client_cannot_choose_its_session_id(port: int) -> None:
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        chosen = "attacker-chosen-session-id"
        answer = await http.post(
            _url(port), json=INIT, headers=_headers(**{"Mcp-Session-Id": chosen})
        )
        assert answer.status_code == 400
        assert "mcp-session-id" not in answer.headers
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        later = await http.post(
            _url(port), json=ping, headers=_headers(**{"Mcp-Session-Id": chosen})
        )
        assert later.status_code == 404


async def test_requests_before_initialize_need_a_session(port: int) -> None:
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        for message in (
            _call(1, "1"),
            {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}},
        ):
            answer = await http.post(_url(port), json=message, headers=_headers())
            assert answer.status_code == 400, answer.text


async def test_initialize_inside_a_session_is_refused(port: int) -> None:
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        session = await _open_session(http, port)
        again = await http.post(
            _url(port), json=INIT, headers=_headers(**{"Mcp-Session-Id": session})
        )
        assert again.status_code == 400
        # As a notification, it changes nothing either.
        note = {key: value for key, value in INIT.items() if key != "id"}
        quiet = await http.post(
            _url(port), json=note, headers=_headers(**{"Mcp-Session-Id": session})
        )
        assert quiet.status_code in (202, 400)
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        headers = _headers(**{"Mcp-Session-Id": session})
        assert (await http.post(_url(port), json=ping, headers=headers)).status_code == 200


async def test_one_principal_opening_many_sessions_evicts_only_its_own(port: int) -> None:
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        other = await _open_session(http, port, OTHER_TOKEN)
        for _ in range(40):  # past max_sessions_per_principal (16), twice over
            answer = await http.post(_url(port), json=INIT, headers=_headers())
            assert answer.status_code == 200, answer.text
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        kept = await http.post(
            _url(port), json=ping, headers=_headers(OTHER_TOKEN, **{"Mcp-Session-Id": other})
        )
        assert kept.status_code == 200
    await _still_serves(port)


async def test_cancelled_from_another_session_does_not_stop_a_program(port: int) -> None:
    """Same principal even: `notifications/cancelled` names a request of its own session."""
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        victim = await _open_session(http, port, OTHER_TOKEN)
        same_principal = await _open_session(http, port, OTHER_TOKEN)
        attacker = await _open_session(http, port)
        results: dict[str, Any] = {}

        async def run() -> None:
            answer = await http.post(
                _url(port),
                json=_call(77, "import time\ntime.sleep(2)\n'finished'"),
                headers=_headers(OTHER_TOKEN, **{"Mcp-Session-Id": victim}),
            )
            results["victim"] = answer.json()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await trio.sleep(0.7)
            cancel = {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": 77},
            }
            for token, session in ((OTHER_TOKEN, same_principal), (MASTER_TOKEN, attacker)):
                answer = await http.post(
                    _url(port), json=cancel, headers=_headers(token, **{"Mcp-Session-Id": session})
                )
                assert answer.status_code == 202
            # executions/cancel by request id is per connection too.
            by_request = {
                "jsonrpc": "2.0",
                "id": 5,
                "method": "executions/cancel",
                "params": {"request_id": 77},
            }
            await http.post(
                _url(port), json=by_request, headers=_headers(**{"Mcp-Session-Id": attacker})
            )
        structured = results["victim"]["result"]["structuredContent"]
        assert structured["status"] == "ok", structured
        assert structured["result"] == "finished"


async def test_a_request_id_in_flight_cannot_be_reused(port: int) -> None:
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        session = await _open_session(http, port)
        headers = _headers(**{"Mcp-Session-Id": session})
        statuses: list[int] = []

        async def run(code: str) -> None:
            answer = await http.post(_url(port), json=_call(9, code), headers=headers)
            statuses.append(answer.status_code)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "import time\ntime.sleep(1.5)\n1")
            await trio.sleep(0.5)
            nursery.start_soon(run, "2")
        assert sorted(statuses) == [200, 409]


async def test_more_requests_in_flight_than_the_cap_are_429(port: int) -> None:
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        session = await _open_session(http, port)
        headers = _headers(**{"Mcp-Session-Id": session})
        statuses: list[int] = []

        async def run(ident: int) -> None:
            answer = await http.post(
                _url(port), json=_call(ident, "import time\ntime.sleep(1.5)\n1"), headers=headers
            )
            statuses.append(answer.status_code)

        async with trio.open_nursery() as nursery:
            for ident in range(MAX_IN_FLIGHT + 2):
                nursery.start_soon(run, ident)
                await trio.sleep(0.05)
        assert statuses.count(429) == 2, statuses
    await _still_serves(port)


async def test_tools_call_as_a_notification_runs_nothing(port: int) -> None:
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        session = await _open_session(http, port)
        note = _call(0, "import time\ntime.sleep(3)\n1")
        del note["id"]
        started = time.monotonic()
        answer = await http.post(
            _url(port), json=note, headers=_headers(**{"Mcp-Session-Id": session})
        )
        took = time.monotonic() - started
    assert answer.status_code in (202, 400)
    assert took < 1.0, f"the 202 came after {took:.1f} s: the program ran"


# ---- DNS rebinding: Host and Origin -------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "localhost.",
        "LOCALHOST:8080",
        "127.0.0.1",
        "127.0.0.1:1",
        "127.9.9.9",
        "[::1]",
        "[::1]:80",
        "app.localhost",  # RFC 6761: resolved to loopback by the browser itself
    ],
)
async def test_loopback_hosts_are_accepted(port: int, host: str) -> None:
    response = await _one(port, _request(body=_INIT, host=host))
    assert response is not None and response.status == 200, response


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "127.0.0.1.nip.io",
        "localhost.evil.example",
        "localhost.:80.evil.example",
        "localhost:abc",
        "localhost:80:80",
        "::1",
        "[::1",
        "[::1]x",
        "0.0.0.0",
        "127.0.0.1@evil.example",
        "2130706433",
        "0x7f.1",
        "",
    ],
)
async def test_other_hosts_are_403(port: int, host: str) -> None:
    response = await _one(port, _request(body=_INIT, host=host))
    assert response is not None, host
    assert response.status in (400, 403), response
    assert "mcp-session-id" not in response.headers


async def test_http_1_0_without_host_is_403(port: int) -> None:
    response = await _one(port, _request(body=_INIT, host=None, version="HTTP/1.0"))
    assert response is not None and response.status == 403


async def test_the_host_is_checked_before_the_token(port: int) -> None:
    """A rebinding page has no token: it hears 403 for its Host, learning nothing else."""
    response = await _one(port, _request(body=_INIT, host="evil.example", token=None))
    assert response is not None and response.status == 403


@pytest.mark.parametrize(
    "origin",
    [
        "null",
        "http://evil.example",
        "http://localhost.evil.example",
        "http://127.0.0.1.nip.io:8080",
        "http://127.0.0.1@evil.example",
        "http://localhost:80@evil.example",
        "http://evil.example#@127.0.0.1",
        "file://",
        "chrome-extension://abcdefghijklmnop",
        "ftp://127.0.0.1",
        "http://0.0.0.0",
        "",
        "http://localhost/path",
        "http://user@localhost",
        "http://localhost:80:80",
        "http://localhost:",
        "http://[::1",
        "http://localhost\\",
    ],
)
async def test_foreign_origins_are_403(port: int, origin: str) -> None:
    response = await _one(port, _request(body=_INIT, extra=(("Origin", origin),)))
    assert response is not None
    assert response.status == 403, (origin, response)


async def test_an_origin_with_backslash_userinfo_is_403(port: int) -> None:
    origin = "http://evil.example\\@127.0.0.1"
    response = await _one(port, _request(body=_INIT, extra=(("Origin", origin),)))
    assert response is not None and response.status == 403, response


@pytest.mark.parametrize(
    "origin", ["http://localhost", "HTTP://LOCALHOST:3000", "https://[::1]:1", "http://a.localhost"]
)
async def test_loopback_origins_are_accepted(port: int, origin: str) -> None:
    response = await _one(port, _request(body=_INIT, extra=(("Origin", origin),)))
    assert response is not None and response.status == 200, response


async def test_a_preflight_gets_no_cors_grant(port: int) -> None:
    """A cross-origin page's Authorization header needs a preflight: it is refused, with
    no Access-Control-Allow-* a browser would honour."""
    data = _request(
        "OPTIONS",
        token=None,
        extra=(
            ("Origin", "http://localhost:3000"),
            ("Access-Control-Request-Method", "POST"),
            ("Access-Control-Request-Headers", "authorization, content-type"),
        ),
    )
    response = await _one(port, data)
    assert response is not None and response.status in (401, 405)
    assert not any(name.startswith("access-control-") for name in response.headers)


# ---- protocol: logging, progress, output floods, disconnects ----------------------------


@pytest.mark.parametrize(
    "params",
    [
        {"level": "verbose"},
        {"level": 3},
        {"level": None},
        {"level": {"$gt": ""}},
        {"level": "DEBUG"},
        {},
        {"level": "debug" * 10_000},
    ],
)
async def test_garbage_log_levels_are_invalid_params(port: int, params: dict[str, Any]) -> None:
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        session = await _open_session(http, port)
        headers = _headers(**{"Mcp-Session-Id": session})
        answer = await http.post(
            _url(port),
            json={"jsonrpc": "2.0", "id": 2, "method": "logging/setLevel", "params": params},
            headers=headers,
        )
        assert answer.json()["error"]["code"] == -32602
        # The level did not change: a tools/call is still answered as plain JSON.
        call = await http.post(_url(port), json=_call(3, "1"), headers=headers)
        assert call.headers["content-type"].startswith("application/json")


@pytest.mark.parametrize(
    "token",
    [
        {"nested": {"deep": ["x"] * 1000}},
        ["a", "b"],
        True,
        1.5,
        "t" * (MAX_MESSAGE_BYTES // 2),
        -(10**300),
    ],
    ids=["object", "list", "bool", "float", "huge-string", "huge-int"],
)
async def test_odd_progress_tokens_do_not_break_a_call(port: int, token: Any) -> None:
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        session = await _open_session(http, port)
        headers = _headers(**{"Mcp-Session-Id": session})
        code = "for i in range(20):\n    print('x' * 100)\n'done'"
        events: list[Any] = []
        async with http.stream(
            "POST", _url(port), json=_call(2, code, progressToken=token), headers=headers
        ) as answer:
            assert answer.status_code == 200
            if answer.headers["content-type"].startswith("application/json"):
                events.append(json.loads(await answer.aread()))
            else:
                async for line in answer.aiter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:]))
    final = events[-1]
    assert final["result"]["structuredContent"]["result"] == "done"
    for event in events[:-1]:  # progress echoes only a valid token, unchanged
        assert event["params"]["progressToken"] == token
        assert isinstance(token, str | int) and not isinstance(token, bool)
    await _still_serves(port)


async def test_a_flood_of_output_gives_bounded_progress(port: int) -> None:
    """Megabytes printed as fast as possible: at most ten small notifications a second,
    the whole output in the result."""
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        session = await _open_session(http, port)
        headers = _headers(**{"Mcp-Session-Id": session})
        code = "import sys\nfor i in range(200):\n    sys.stdout.write('y' * 4096)\n'done'"
        progress: list[dict[str, Any]] = []
        final: dict[str, Any] = {}
        started = time.monotonic()
        async with http.stream(
            "POST", _url(port), json=_call(2, code, progressToken="flood"), headers=headers
        ) as answer:
            async for line in answer.aiter_lines():
                if line.startswith("data: "):
                    message = json.loads(line[6:])
                    if "method" in message:
                        progress.append(message["params"])
                    else:
                        final = message
        took = time.monotonic() - started
    structured = final["result"]["structuredContent"]
    assert structured["result"] == "done", structured
    assert all(len(p["message"]) <= 8192 + 200 for p in progress)
    # Ten a second while it ran, plus what the last flush needs for 64 KiB pending.
    assert len(progress) <= took * 10 + 65536 // 8192 + 3, (len(progress), took)
    await _still_serves(port)


async def _running(http: httpx2.AsyncClient, port: int, session: str) -> list[Any]:
    listed = await http.post(
        _url(port),
        json={"jsonrpc": "2.0", "id": 99, "method": "executions/running", "params": {}},
        headers=_headers(**{"Mcp-Session-Id": session}),
    )
    return listed.json()["result"]["executions"]


async def _until_nothing_runs(port: int) -> None:
    with trio.fail_after(WAIT_S):
        async with httpx2.AsyncClient(timeout=WAIT_S) as http:
            session = await _open_session(http, port)
            while await _running(http, port, session):
                await trio.sleep(0.05)


async def test_a_json_client_that_disconnects_cancels_its_program(port: int) -> None:
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        session = await _open_session(http, port)
    call = _call(2, "import time\ntime.sleep(100)")
    call["params"]["arguments"]["limits"] = {"timeout_ms": 120_000}
    raw = await _Raw.open(port)
    await raw.send(_request(body=json.dumps(call).encode(), extra=(("Mcp-Session-Id", session),)))
    await trio.sleep(1.0)
    await raw.aclose()
    await _until_nothing_runs(port)
    await _still_serves(port)


async def test_an_sse_client_that_disconnects_cancels_its_silent_program(port: int) -> None:
    """A clean close is an EOF like a half-close: the probes that follow it fail, well
    before the stream's 30 s keep-alive comment would."""
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        session = await _open_session(http, port)
    call = _call(2, "import time\ntime.sleep(100)", progressToken="p")
    call["params"]["arguments"]["limits"] = {"timeout_ms": 120_000}
    raw = await _Raw.open(port)
    await raw.send(_request(body=json.dumps(call).encode(), extra=(("Mcp-Session-Id", session),)))
    with trio.fail_after(WAIT_S):
        while b"\r\n\r\n" not in raw.buffer:
            assert await raw._fill()
    await trio.sleep(1.0)
    started = time.monotonic()
    await raw.aclose()
    await _until_nothing_runs(port)
    assert time.monotonic() - started < 10
    await _still_serves(port)


async def test_deleting_a_session_cancels_its_program(port: int) -> None:
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        session = await _open_session(http, port)
        headers = _headers(**{"Mcp-Session-Id": session})
        call = _call(2, "import time\ntime.sleep(100)")
        call["params"]["arguments"]["limits"] = {"timeout_ms": 120_000}
        statuses: list[int] = []

        async def run() -> None:
            statuses.append((await http.post(_url(port), json=call, headers=headers)).status_code)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await trio.sleep(1.0)
            assert (await http.delete(_url(port), headers=headers)).status_code == 200
        assert statuses == [404]
    await _until_nothing_runs(port)
    await _still_serves(port)


@pytest.mark.xfail(
    strict=True,
    reason="FINDING (kept, documented): a JSON answer writes nothing before the end, so "
    "EOF cannot tell a half-closed client from a gone one; taken for gone, so that a "
    "client that leaves cancels its program. Over SSE a half-close is served (below)",
)
async def test_a_half_closed_client_still_gets_its_answer(port: int) -> None:
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        session = await _open_session(http, port)
    raw = await _Raw.open(port)
    data = _request(
        body=json.dumps(_call(2, "import time\ntime.sleep(0.5)\n'late'")).encode(),
        extra=(("Mcp-Session-Id", session), ("Connection", "close")),
    )
    await raw.send(data)
    await raw.stream.send_eof()
    response = await raw.response()
    await raw.aclose()
    assert response is not None and response.status == 200


async def test_a_half_closed_sse_client_still_gets_its_answer(port: int) -> None:
    """An SSE answer can write while the call runs: EOF only makes it probe the client."""
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        session = await _open_session(http, port, CALM_TOKEN)
    raw = await _Raw.open(port)
    call = _call(2, "import time\ntime.sleep(2.5)\n'late'", progressToken="p")
    data = _request(
        body=json.dumps(call).encode(),
        token=CALM_TOKEN,
        extra=(("Mcp-Session-Id", session), ("Connection", "close")),
    )
    await raw.send(data)
    await raw.stream.send_eof()
    response = await raw.response()  # the whole stream: it is chunked
    await raw.aclose()
    assert response is not None and response.status == 200
    assert b"late" in response.body, response


# ---- connections: the cap, slow and idle clients -----------------------------------------


async def _hold(port: int, count: int, daemon: Any) -> list[trio.SocketStream]:
    held = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(count)]
    with trio.fail_after(WAIT_S):
        while daemon.mcp_http.connections < count:
            await trio.sleep(0.01)
    return held


async def _initializes(url: str) -> bool:
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        try:
            answer = await http.post(url, json=INIT, headers=_headers())
        except httpx2.TransportError:
            return False
    return answer.status_code == 200


async def test_tokenless_idle_connections_cannot_lock_clients_out(start_daemon: Any) -> None:
    daemon, _ = await start_daemon(
        executors=NO_SANDBOXES, mcp_http={"listen": "127.0.0.1:0", "max_connections": 4}
    )
    url = daemon.mcp_http_url()
    held = await _hold(_port(url), 4, daemon)
    try:
        assert await _initializes(url)
    finally:
        for stream in held:
            await stream.aclose()


async def test_a_token_holder_is_served_once_idle_connections_time_out(
    start_daemon: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mcp_http, "KEEPALIVE_S", 0.5)
    daemon, _ = await start_daemon(
        executors=NO_SANDBOXES, mcp_http={"listen": "127.0.0.1:0", "max_connections": 2}
    )
    url = daemon.mcp_http_url()
    held = await _hold(_port(url), 2, daemon)
    with trio.fail_after(WAIT_S):
        for stream in held:
            assert await stream.receive_some() == b""  # closed, unanswered
        while not await _initializes(url):
            await trio.sleep(0.05)
    for stream in held:
        await stream.aclose()


async def test_a_silent_new_connection_is_closed_after_first_head_s(
    start_daemon: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept-alive clients get KEEPALIVE_S between requests; a new one only FIRST_HEAD_S."""
    monkeypatch.setattr(mcp_http, "FIRST_HEAD_S", 0.5)
    daemon, _ = await start_daemon(executors=NO_SANDBOXES, mcp_http={"listen": "127.0.0.1:0"})
    url = daemon.mcp_http_url()
    raw = await _Raw.open(_port(url))
    started = time.monotonic()
    assert await raw.closed()
    assert time.monotonic() - started < 5
    await raw.aclose()


@pytest.mark.parametrize("where", ["head", "body"])
async def test_a_dripping_client_is_cut_off(
    start_daemon: Any, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """One byte at a time, head or body: the request's deadline runs from its first byte."""
    monkeypatch.setattr(mcp_http, "REQUEST_TIMEOUT_S", 1.0)
    daemon, _ = await start_daemon(executors=NO_SANDBOXES, mcp_http={"listen": "127.0.0.1:0"})
    url = daemon.mcp_http_url()
    raw = await _Raw.open(_port(url))
    data = _request(body=_INIT)
    split = data.index(b"\r\n\r\n") + 4
    if where == "body":
        await raw.send(data[:split])
        data = data[split:]
    started = time.monotonic()
    with trio.move_on_after(WAIT_S):
        for byte in data:
            try:
                await raw.stream.send_all(bytes([byte]))
            except trio.BrokenResourceError:
                break
            await trio.sleep(0.2)
    assert await raw.closed()
    assert time.monotonic() - started < 5
    await raw.aclose()
    assert await _initializes(url)


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/", maxsplit=1)[0])


@pytest.mark.parametrize(
    "data",
    [
        _request("HEAD", _INIT),
        _request("TRACE"),
        _request("CONNECT", target="127.0.0.1:22"),
        _request("OPTIONS", target="*"),
        _request("GET", extra=(("Connection", "Upgrade"), ("Upgrade", "websocket"))),
        _request("POST", _INIT, extra=(("Connection", "Upgrade"), ("Upgrade", "h2c"))),
        _request("POST", _INIT, target="/mcp?x=" + "a" * 8000),
        _request("POST", _INIT, target="/mcp/../mcp"),
        _request("POST", _INIT, target="//mcp"),
    ],
    ids=[
        "head",
        "trace",
        "connect",
        "options-star",
        "websocket",
        "h2c",
        "query",
        "dots",
        "slashes",
    ],
)
async def test_odd_methods_and_targets_fail_no_connection(
    start_daemon: Any, caplog: pytest.LogCaptureFixture, data: bytes
) -> None:
    """Answered or closed; never an exception logged as a failed connection."""
    daemon, _ = await start_daemon(executors=NO_SANDBOXES, mcp_http={"listen": "127.0.0.1:0"})
    url = daemon.mcp_http_url()
    raw = await _Raw.open(_port(url))
    await raw.send(data + _request("POST", _INIT))
    with contextlib.suppress(ValueError, IndexError):
        await raw.response()
    await raw.aclose()
    assert await _initializes(url)
    failed = [r for r in caplog.records if "connection failed" in r.getMessage()]
    assert not failed, [r.exc_text for r in failed]


async def test_a_principal_with_every_session_busy_is_429_and_alone(port: int) -> None:
    """Sixteen sessions each holding its standalone stream open: its next initialize is
    429 (nothing of its own to replace), and another principal is not affected."""
    async with httpx2.AsyncClient(timeout=WAIT_S) as http:
        sessions = [await _open_session(http, port, OTHER_TOKEN) for _ in range(16)]
        async with trio.open_nursery() as nursery:
            opened = 0

            async def hold(session: str) -> None:
                nonlocal opened
                headers = _headers(OTHER_TOKEN, **{"Mcp-Session-Id": session})
                async with http.stream("GET", _url(port), headers=headers) as stream:
                    assert stream.status_code == 200
                    opened += 1
                    await trio.sleep_forever()

            for session in sessions:
                nursery.start_soon(hold, session)
            with trio.fail_after(WAIT_S):
                while opened < 16:
                    await trio.sleep(0.02)
            refused = await http.post(_url(port), json=INIT, headers=_headers(OTHER_TOKEN))
            assert refused.status_code == 429, refused.text
            again = await http.get(
                _url(port), headers=_headers(OTHER_TOKEN, **{"Mcp-Session-Id": sessions[0]})
            )
            assert again.status_code == 409
            await _still_serves(port)
            nursery.cancel_scope.cancel()
        for session in sessions:
            await http.delete(
                _url(port), headers=_headers(OTHER_TOKEN, **{"Mcp-Session-Id": session})
            )
