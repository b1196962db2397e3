"""The fetch tool: off by default, allowlisted hosts and methods, capped, no redirects."""

from __future__ import annotations

import base64
import json
from typing import Any

import pydantic
import pytest
import trio

from conduit.gateway.fetch import (
    FETCH_INPUT_SCHEMA,
    FETCH_OUTPUT_SCHEMA,
    FETCH_TOOL,
    FetchConfig,
    Fetcher,
    FetchFailed,
    FetchRefused,
    host_allowed,
)
from conduit.gateway.ssrf import DestinationRefused, SsrfGuard
from tests.gateway.local_http import FakeResolver, LocalServer, Reply, Seen

WAIT_S = 10
BIG = 8 * 1024 * 1024


async def site(seen: Seen) -> Reply:
    """The local web site the fetch tests talk to, one behaviour per path."""
    text = {"content-type": "text/plain; charset=utf-8"}
    routes: dict[str, Reply] = {
        "/hello": Reply(200, {**text, "set-cookie": "session=1", "x-kept": "yes"}, b"hello"),
        "/big": Reply(200, text, b"a" * BIG),
        "/euro": Reply(200, text, ("€" * 1000).encode()),
        "/binary": Reply(200, {"content-type": "image/png"}, bytes(range(256))),
        "/redirect": Reply(302, {"location": "http://169.254.169.254/"}, b""),
        "/missing": Reply(404, text, b"no such page"),
        "/echo": Reply(200, {"content-type": "application/json"}, b""),
    }
    if seen.target == "/slow":
        await trio.sleep_forever()
    reply = routes.get(seen.target, Reply(500, {}, b""))
    if seen.target == "/echo":
        echo = {"method": seen.method, "headers": seen.headers, "body": seen.body.decode()}
        reply = Reply(200, reply.headers, json.dumps(echo).encode())
    return reply


@pytest.fixture
async def server(nursery: trio.Nursery) -> LocalServer:
    local = LocalServer(site)
    with trio.fail_after(WAIT_S):
        await nursery.start(local.run)
    return local


def fetcher_for(server: LocalServer, **config: Any) -> Fetcher:
    """A fetcher allowed to reach the local server under made-up names."""
    settings = {"enabled": True, "allowed_hosts": ["*.example.test"], "allow_http": True}
    resolver = FakeResolver({"api.example.test": ["127.0.0.1"], "db.example.test": ["10.0.0.9"]})
    guard = SsrfGuard(resolver=resolver, extra_ports=[server.port], allow_networks=["127.0.0.1/32"])
    return Fetcher(FetchConfig(**{**settings, **config}), guard=guard)


async def fetch(fetcher: Fetcher, path: str, port: int, **arguments: Any) -> dict[str, Any]:
    with trio.fail_after(WAIT_S):
        return await fetcher.fetch({"url": f"http://api.example.test:{port}{path}", **arguments})


# --- configuration and policy (nothing sent) ---------------------------------------


async def test_disabled_by_default() -> None:
    config = FetchConfig()
    assert (config.enabled, config.allowed_hosts, config.allow_http) == (False, (), False)
    assert config.methods == ("GET", "HEAD")
    fetcher = Fetcher(config)
    with pytest.raises(FetchRefused, match="the fetch tool is disabled"):
        await fetcher.fetch({"url": "https://example.com/"})


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"enabled": True}, "allowed_hosts is empty"),
        ({"allowed_hosts": ["*"]}, "not a host name"),
        ({"allowed_hosts": ["*.com"]}, "too broad"),
        ({"allowed_hosts": ["exa mple.com"]}, "not a host name"),
        ({"allowed_hosts": ["a.*.example.com"]}, "not a host name"),
        ({"allowed_hosts": ["bücher.example"]}, "xn-- form"),
        ({"methods": ["DELETE"]}, "Input should be 'GET', 'HEAD' or 'POST'"),
        ({"max_response_bytes": 0}, "greater than or equal to 1"),
        ({"bogus": 1}, "Extra inputs"),
    ],
)
def test_config_validation(config: dict[str, Any], message: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=message):
        FetchConfig(**config)


def test_config_normalises_hosts_and_methods() -> None:
    config = FetchConfig(
        allowed_hosts=["API.Example.com.", "*.Example.org", "[2606:4700::1111]", "api.example.com"],
        methods=["get", "post", "GET"],
    )
    assert config.allowed_hosts == ("api.example.com", "*.example.org", "2606:4700::1111")
    assert config.methods == ("GET", "POST")


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("api.example.com", True),
        ("API.EXAMPLE.COM.", True),
        ("www.example.com", False),
        ("example.com", False),
        ("a.example.org", True),
        ("a.b.example.org", True),
        ("example.org", False),
        ("evilexample.org", False),
        ("example.org.evil.net", False),
        ("api.example.com.evil.net", False),
        ("2606:4700::1111", True),
        ("2606:4700:0::1111", True),
    ],
)
def test_host_allowlist_exact_and_suffix(host: str, allowed: bool) -> None:
    patterns = FetchConfig(
        allowed_hosts=["api.example.com", "*.example.org", "2606:4700::1111"]
    ).allowed_hosts
    assert host_allowed(host, patterns) is allowed


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"url": "https://other.test/"}, "host other.test is not in the operator's allowed"),
        ({"url": "https://example.test/"}, "host example.test is not in"),
        ({"url": "http://api.example.test/"}, "scheme 'http' is not allowed"),
        ({"url": "ftp://api.example.test/"}, "scheme 'ftp' is not allowed"),
        ({"url": "https://u:p@api.example.test/"}, "may not carry credentials"),
        ({"url": "https://api.example.test/", "method": "POST"}, "method POST is not allowed"),
        ({"url": "https://api.example.test/", "method": "DELETE"}, "method DELETE"),
        ({"url": "https://api.example.test/", "body": "x"}, "a GET request has no body"),
        ({"url": "https://api.example.test/", "headers": {"Host": "x"}}, "Host header is set"),
        ({"url": "https://api.example.test/", "headers": {"Accept-Encoding": "gzip"}}, "set by"),
        ({"url": "https://api.example.test/", "headers": {"X": "a\r\nB: c"}}, "value of header"),
        ({"url": "https://api.example.test/", "headers": {"X Y": "1"}}, "not a valid header"),
        ({"url": "https://api.example.test/", "extra": 1}, "bad argument extra"),
        ({"method": "GET"}, "bad argument url: Field required"),
    ],
)
async def test_policy_refusals(arguments: dict[str, Any], message: str) -> None:
    fetcher = Fetcher(
        FetchConfig(enabled=True, allowed_hosts=["*.example.test"]),
        guard=SsrfGuard(resolver=FakeResolver({})),
    )
    with pytest.raises(FetchRefused, match=message):
        await fetcher.fetch(arguments)


async def test_post_body_cap() -> None:
    config = FetchConfig(
        enabled=True, allowed_hosts=["api.example.test"], methods=["POST"], max_request_bytes=10
    )
    fetcher = Fetcher(config, guard=SsrfGuard(resolver=FakeResolver({})))
    with pytest.raises(FetchRefused, match="the body is 11 bytes; the limit is 10"):
        await fetcher.fetch(
            {"url": "https://api.example.test/", "method": "POST", "body": "x" * 11}
        )


async def test_allowed_names_still_go_through_the_ssrf_guard() -> None:
    config = FetchConfig(enabled=True, allowed_hosts=["*.example.test"])
    resolver = FakeResolver({"db.example.test": ["10.0.0.9"]})
    fetcher = Fetcher(config, guard=SsrfGuard(resolver=resolver))
    with trio.fail_after(WAIT_S):
        with pytest.raises(DestinationRefused, match=r"db\.example\.test \(10\.0\.0\.9\)"):
            await fetcher.fetch({"url": "https://db.example.test/"})
        with pytest.raises(DestinationRefused, match="port 8443 is not allowed"):
            await fetcher.fetch({"url": "https://db.example.test:8443/"})


def test_the_tool_description_is_valid_json_schema() -> None:
    import jsonschema

    assert FETCH_TOOL["name"] == "fetch"
    assert FETCH_TOOL["inputSchema"] is FETCH_INPUT_SCHEMA
    for schema in (FETCH_INPUT_SCHEMA, FETCH_OUTPUT_SCHEMA):
        jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(FETCH_INPUT_SCHEMA)
    assert validator.is_valid({"url": "https://a.test/", "method": "HEAD", "headers": {}})
    assert not validator.is_valid({"url": "https://a.test/", "method": "PUT"})
    assert not validator.is_valid({"href": "https://a.test/"})


# --- against a local server ----------------------------------------------------------


async def test_a_get(server: LocalServer) -> None:
    import jsonschema

    result = await fetch(fetcher_for(server), "/hello", server.port)
    jsonschema.validate(result, FETCH_OUTPUT_SCHEMA)
    assert result == {
        "status": 200,
        "headers": {
            "content-length": "5",
            "content-type": "text/plain; charset=utf-8",
            "x-kept": "yes",
        },
        "body": "hello",
        "body_encoding": "text",
        "truncated": False,
    }
    [seen] = server.requests
    assert seen.headers["host"] == f"api.example.test:{server.port}"
    assert seen.headers["user-agent"] == "conduit-fetch"
    assert seen.headers["accept-encoding"] == "identity"
    assert "authorization" not in seen.headers
    assert "cookie" not in seen.headers


async def test_cookies_are_not_kept_between_calls(server: LocalServer) -> None:
    fetcher = fetcher_for(server)
    await fetch(fetcher, "/hello", server.port)  # answers Set-Cookie
    await fetch(fetcher, "/echo", server.port)
    assert "cookie" not in server.requests[1].headers


async def test_the_response_is_capped_and_reading_stops(server: LocalServer) -> None:
    fetcher = fetcher_for(server, max_response_bytes=1000)
    result = await fetch(fetcher, "/big", server.port)
    assert (result["body"], result["truncated"]) == ("a" * 1000, True)


@pytest.mark.parametrize(("cap", "body", "truncated"), [(5, "hello", False), (4, "hell", True)])
async def test_the_cap_is_exact(server: LocalServer, cap: int, body: str, truncated: bool) -> None:
    result = await fetch(fetcher_for(server, max_response_bytes=cap), "/hello", server.port)
    assert (result["body"], result["truncated"]) == (body, truncated)


async def test_a_cut_inside_a_character_keeps_the_text(server: LocalServer) -> None:
    # "€" is three bytes: 1000 bytes hold 333 of them and a third of the next.
    result = await fetch(fetcher_for(server, max_response_bytes=1000), "/euro", server.port)
    assert (result["body"], result["body_encoding"], result["truncated"]) == (
        "€" * 333,
        "text",
        True,
    )


async def test_binary_bodies_are_base64(server: LocalServer) -> None:
    result = await fetch(fetcher_for(server), "/binary", server.port)
    assert result["body_encoding"] == "base64"
    assert base64.b64decode(result["body"]) == bytes(range(256))


async def test_redirects_are_returned_not_followed(server: LocalServer) -> None:
    result = await fetch(fetcher_for(server), "/redirect", server.port)
    assert result["status"] == 302
    assert result["headers"]["location"] == "http://169.254.169.254/"
    assert len(server.requests) == 1


async def test_http_errors_are_answers(server: LocalServer) -> None:
    result = await fetch(fetcher_for(server), "/missing", server.port)
    assert (result["status"], result["body"]) == (404, "no such page")


async def test_head_and_configured_post(server: LocalServer) -> None:
    fetcher = fetcher_for(server, methods=["GET", "HEAD", "POST"])
    head = await fetch(fetcher, "/hello", server.port, method="HEAD")
    assert (head["status"], head["body"]) == (200, "")
    posted = await fetch(
        fetcher,
        "/echo",
        server.port,
        method="POST",
        body='{"q": "€"}',
        headers={"Content-Type": "application/json", "X-Trace": "t1"},
    )
    echo = json.loads(posted["body"])
    assert echo["method"] == "POST"
    assert echo["body"] == '{"q": "€"}'
    assert echo["headers"]["content-type"] == "application/json"
    assert echo["headers"]["x-trace"] == "t1"


async def test_a_slow_server_times_out(server: LocalServer) -> None:
    fetcher = fetcher_for(server, timeout_s=0.2)
    with pytest.raises(FetchFailed, match=r"no complete answer within 0\.2 s"):
        await fetch(fetcher, "/slow", server.port)
    # The caller's own limit applies when it is shorter.
    with trio.fail_after(WAIT_S), pytest.raises(FetchFailed, match=r"within 0\.1 s"):
        await fetcher_for(server).fetch(
            {"url": f"http://api.example.test:{server.port}/slow"}, timeout_s=0.1
        )
