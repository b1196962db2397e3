"""HTTP upstreams through the daemon: credentials, the SSRF guard, and the fetch tool."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from tests.e2e.helpers import execute, wait_upstreams
from tests.fixtures.mcp_echo_server import running_http

SECRET = "tok-0123456789-do-not-log"


async def test_http_upstream_with_bearer_credentials_and_no_secret_in_logs(
    start_daemon: Any, connect: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with running_http() as http:
        upstream = {
            "name": "remote",
            "transport": "http",
            "url": http.url,
            "trusted": True,  # loopback: the guard would refuse it, as the next test shows
            "auth": {"type": "bearer", "token": SECRET},
        }
        server, info = await start_daemon(upstreams=[upstream])
        await wait_upstreams(server, "remote")
        client = await connect(info)
        code = "await tools.remote.header({ name: 'authorization' })"
        result = await execute(client, code)
        assert result["status"] == "ok", result
        # The program got the upstream's answer; the credential never entered the sandbox.
        assert result["result"] == f"Bearer {SECRET}"
        leaked = await execute(client, "JSON.stringify(Object.keys(globalThis))")
        assert SECRET not in json.dumps(leaked)
    assert SECRET not in caplog.text
    assert SECRET not in repr(server.config)


async def test_untrusted_http_upstream_on_loopback_is_refused_by_the_guard(
    start_daemon: Any, connect: Any
) -> None:
    async with running_http() as http:
        upstream = {"name": "sneaky", "transport": "http", "url": http.url}
        server, info = await start_daemon(upstreams=[upstream])
        [status] = await wait_upstreams(server, "sneaky", state="backing_off")
        assert "DestinationRefused" in status.last_error
        assert "127.0.0.1" in status.last_error
        client = await connect(info)
        [listed] = (await client.call("upstreams/list"))["upstreams"]
        # Backing off, or already retrying: never ready, and the refusal stays on record.
        assert listed["state"] in ("backing_off", "starting"), listed
        assert "DestinationRefused" in listed["last_error"]
        assert listed["tools"] == 0
        # The daemon keeps serving.
        assert (await execute(client, "1 + 1"))["result"] == 2


async def test_fetch_tool_refuses_hosts_off_the_allowlist_and_private_addresses(
    start_daemon: Any, connect: Any
) -> None:
    fetch = {"fetch": {"enabled": True, "allowed_hosts": ["localhost"], "allow_http": True}}
    _, info = await start_daemon(gateway=fetch)
    client = await connect(info)
    code = """
const out = {};
for (const url of ["http://example.invalid/", "http://localhost/", "http://localhost:8080/"]) {
  try { await tools.fetch.fetch({ url }); out[url] = "fetched"; }
  catch (e) { out[url] = [e.code, e.message]; }
}
return out;
"""
    result = (await execute(client, code))["result"]
    assert result["http://example.invalid/"] == [
        -32007,
        "fetch: host example.invalid is not in the operator's allowed_hosts",
    ]
    # Allowed by name, refused by address: the guard checks what the name resolves to.
    assert "refused to connect to localhost" in result["http://localhost/"][1]
    assert "loopback" in result["http://localhost/"][1]
    assert "port 8080 is not allowed" in result["http://localhost:8080/"][1]
