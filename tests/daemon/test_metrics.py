"""Prometheus metrics: scraped over HTTP from a real daemon and read with the Prometheus
client's own parser, the collector on its own, the endpoint's HTTP behaviour, and its
configuration."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from conduit.core.errors import ConfigError, MethodNotFound, ParseError, Unauthenticated
from conduit.daemon.auth import Authenticator
from conduit.daemon.config import AuthConfig, load_config
from conduit.daemon.events import EventBus
from conduit.daemon.metrics import GaugeSources, Metrics
from conduit.daemon.metrics_endpoint import (
    MAX_REQUEST_BYTES,
    MAX_SCRAPES,
    RENDER_INTERVAL_S,
    REQUEST_TIMEOUT_S,
    MetricsEndpoint,
)
from conduit.gateway.catalogue import Catalogue
from tests.conftest import WAIT_S
from tests.daemon.fakes import ExecutionsFixture, FakeExecutor
from tests.e2e.helpers import wait_upstreams
from tests.fixtures.mcp_echo_server import command as echo_command

ECHO = {
    "name": "echo",
    "transport": "stdio",
    "command": echo_command()[0],
    "args": echo_command()[1:],
}
# A command that does not exist: the upstream never comes up.
BROKEN = {"name": "broken", "transport": "stdio", "command": "/nonexistent/conduit-test-upstream"}


async def http(address: tuple[str, int], request: bytes) -> tuple[str, dict[str, str], bytes]:
    """Send one raw HTTP request; the status line, headers and body of the answer."""
    with trio.fail_after(WAIT_S):
        stream = await trio.open_tcp_stream(*address)
        async with stream:
            await stream.send_all(request)
            data = b""
            while chunk := await stream.receive_some(65536):
                data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return status, headers, body


async def scrape(address: tuple[str, int]) -> dict[str, Any]:
    """GET /metrics, parsed by prometheus_client's parser: families by name."""
    status, headers, body = await http(address, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == "HTTP/1.1 200 OK"
    assert headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert int(headers["content-length"]) == len(body)
    assert headers["connection"] == "close"
    return {family.name: family for family in text_string_to_metric_families(body.decode())}


def value(families: dict[str, Any], sample: str, **labels: str) -> float:
    """The value of the one sample named `sample` whose labels include `labels`."""
    family = families[sample.removesuffix("_total").removesuffix("_count").removesuffix("_sum")]
    found = [
        s.value for s in family.samples if s.name == sample and labels.items() <= s.labels.items()
    ]
    assert len(found) == 1, (sample, labels, family.samples)
    return found[0]


def series(families: dict[str, Any], sample: str, label: str) -> set[str]:
    """Every value `label` takes among the samples named `sample`."""
    family = families[sample.removesuffix("_total")]
    return {s.labels[label] for s in family.samples if s.name == sample}


async def test_a_scrape_reports_executions_tools_requests_pools_and_upstreams(
    start_daemon: Any, connect: Any
) -> None:
    # Deno only: its warm pool is what the pool metrics describe.
    executors = {"wasm_python": {"enabled": False}, "wasm_js": {"enabled": False}}
    daemon, info = await start_daemon(upstreams=[ECHO, BROKEN], executors=executors)
    await wait_upstreams(daemon, "echo")
    assert info.metrics_address is not None
    client = await connect(info)

    result = await client.call("execute", {"language": "typescript", "code": "1 + 1"})
    assert result["status"] == "ok", result
    failed = await client.call("execute", {"language": "typescript", "code": "throw new Error()"})
    assert failed["status"] == "error", failed
    await client.call("tools/call", {"name": "echo__echo", "arguments": {"text": "hi"}})
    await client.call("tools/call", {"name": "echo__fail", "arguments": {}})
    # Hostile method names: each is refused, none becomes a label of its own.
    for n in range(20):
        assert (await client.request(f"no/such/method/{n}"))["error"]["code"] == MethodNotFound.code
    await client.send_line("{not json")
    assert (await client.recv())["error"]["code"] == ParseError.code
    wrong = await client.request("ping", auth={"bearerToken": "cdt_wrong-token-0123456789abcdef"})
    assert wrong["error"]["code"] == Unauthenticated.code

    # A worker is out of use once its process is reaped, a moment after its answer.
    with trio.fail_after(WAIT_S):
        while True:
            families = await scrape(info.metrics_address)
            if value(families, "conduit_pool_workers", executor="deno", state="in_use") == 0:
                break
            await trio.sleep(0.05)

    # Every metric is Conduit's (or the standard process ones) and says what it is.
    for name, family in families.items():
        assert name.startswith(("conduit_", "process_")), name
        assert family.documentation, f"{name} has no help text"

    ok = {"executor": "deno", "language": "typescript", "status": "ok"}
    assert value(families, "conduit_executions_total", **ok) == 1
    assert value(families, "conduit_executions_total", executor="deno", status="error") == 1
    durations = value(families, "conduit_execution_duration_seconds_count", executor="deno")
    assert durations == 2
    assert value(families, "conduit_execution_duration_seconds_sum", executor="deno") > 0
    assert value(families, "conduit_execution_queue_wait_seconds_count") == 2
    assert value(families, "conduit_executions_active") == 0
    assert value(families, "conduit_executions_queued") == 0
    assert value(families, "conduit_execution_slots") == 16

    assert value(families, "conduit_tool_calls_total", upstream="echo", outcome="ok") == 1
    assert value(families, "conduit_tool_calls_total", upstream="echo", outcome="error") == 1
    assert value(families, "conduit_tool_call_duration_seconds_count", upstream="echo") == 2

    assert value(families, "conduit_rpc_requests_total", method="execute", code="ok") == 2
    assert value(families, "conduit_rpc_requests_total", method="unknown", code="-32601") == 20
    assert value(families, "conduit_rpc_requests_total", method="invalid", code="-32700") == 1
    assert value(families, "conduit_rpc_requests_total", method="ping", code="-32002") == 1
    methods = series(families, "conduit_rpc_requests_total", "method")
    assert methods == {"execute", "tools/call", "unknown", "invalid", "ping"}
    assert value(families, "conduit_auth_failures_total") == 1

    assert value(families, "conduit_upstream_up", upstream="echo") == 1
    assert value(families, "conduit_upstream_up", upstream="broken") == 0
    assert value(families, "conduit_upstream_tools", upstream="echo") > 0

    # Only this daemon's executors: those the configuration leaves out have no series.
    assert value(families, "conduit_executor_available", executor="deno") == 1
    assert series(families, "conduit_executor_available", "executor") == {"deno"}
    # The test's pool of one, or two once an execution found it empty.
    assert value(families, "conduit_pool_target_workers", executor="deno") in (1, 2)
    states = series(families, "conduit_pool_workers", "state")
    assert states == {"idle", "starting", "in_use"}
    assert value(families, "conduit_pool_workers", executor="deno", state="in_use") == 0
    # The first fill and the refill after the execution: each start is timed.
    refills = value(families, "conduit_pool_refill_seconds_count", executor="deno")
    assert refills >= 1
    assert value(families, "conduit_pool_refill_seconds_sum", executor="deno") > 0
    assert value(families, "conduit_pool_last_refill_seconds", executor="deno") > 0
    assert value(families, "conduit_pool_cold_starts_total", executor="deno") >= 0
    assert value(families, "conduit_pool_waited_for_start_total", executor="deno") >= 0

    assert value(families, "conduit_connections", transport="unix") == 1
    assert value(families, "conduit_session_tokens") == 0
    assert value(families, "conduit_draining") == 0
    assert value(families, "conduit_sessions") == 0
    assert value(families, "conduit_build_info") == 1
    assert value(families, "process_resident_memory_bytes") > 0


async def test_the_endpoint_is_discoverable_and_answers_only_metrics(
    start_daemon: Any, connect: Any
) -> None:
    daemon, info = await start_daemon(**_no_executors())
    address = info.metrics_address
    assert address is not None and address[0] == "127.0.0.1" and address[1] > 0
    status = await (await connect(info)).call("daemon/status")
    assert status["metrics"] == {
        "enabled": True,
        "url": f"http://127.0.0.1:{address[1]}/metrics",
        "error": None,
    }

    missing = await http(address, b"GET / HTTP/1.1\r\n\r\n")
    assert missing[0] == "HTTP/1.1 404 Not Found"
    assert b"/metrics" in missing[2]
    posted = await http(address, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    assert posted[0] == "HTTP/1.1 405 Method Not Allowed"
    assert posted[1]["allow"] == "GET, HEAD"
    head = await http(address, b"HEAD /metrics HTTP/1.1\r\n\r\n")
    assert head[0] == "HTTP/1.1 200 OK" and int(head[1]["content-length"]) > 0
    assert head[2] == b""
    garbage = await http(address, b"hello\r\n\r\n")
    assert garbage[0] == "HTTP/1.1 400 Bad Request"
    too_long = await http(address, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * MAX_REQUEST_BYTES)
    assert too_long[0] == "HTTP/1.1 431 Request Header Fields Too Large"
    # A person with nc sends bare line feeds; a query string is ignored.
    by_hand = await http(address, b"GET /metrics?x=1 HTTP/1.0\n\n")
    assert by_hand[0] == "HTTP/1.1 200 OK" and b"conduit_build_info" in by_hand[2]
    # After all that, a plain scrape still works, and saw none of it as RPC.
    families = await scrape(address)
    assert series(families, "conduit_rpc_requests_total", "method") == {"daemon/status"}


async def test_metrics_can_be_turned_off(start_daemon: Any, connect: Any) -> None:
    daemon, info = await start_daemon(metrics={"enabled": False}, **_no_executors())
    assert info.metrics_address is None
    status = await (await connect(info)).call("daemon/status")
    assert status["metrics"] == {"enabled": False, "url": None, "error": None}


async def test_a_taken_port_is_reported_and_the_daemon_still_serves(
    start_daemon: Any, connect: Any, make_config: Any, short_dir: Path
) -> None:
    first, first_info = await start_daemon(**_no_executors())
    assert first_info.metrics_address is not None
    host, port = first_info.metrics_address
    second, second_info = await start_daemon(
        server={"socket": str(short_dir / "second.sock")},
        metrics={"listen": f"{host}:{port}"},
        **_no_executors(),
    )
    assert second_info.metrics_address is None
    client = await connect(second_info)
    status = await client.call("daemon/status")
    assert status["metrics"]["url"] is None
    assert "cannot listen on" in status["metrics"]["error"]
    assert "metrics.listen" in status["metrics"]["error"]
    # Each daemon counts its own: the first never saw the second's request.
    families = await scrape(first_info.metrics_address)
    assert "daemon/status" not in series(families, "conduit_rpc_requests_total", "method")


def test_a_non_loopback_address_needs_explicit_permission(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[metrics]\nlisten = "0.0.0.0:9100"\n')
    with pytest.raises(ConfigError, match=r"metrics\.listen .* not a loopback address"):
        load_config(path, environ={})
    path.write_text('[metrics]\nlisten = "0.0.0.0:9100"\nallow_remote = true\n')
    assert load_config(path, environ={}).metrics.listen == "0.0.0.0:9100"
    path.write_text('[metrics]\nlisten = "0.0.0.0:9100"\nenabled = false\n')
    assert not load_config(path, environ={}).metrics.enabled
    path.write_text('[metrics]\nlisten = "localhost"\n')
    with pytest.raises(ConfigError, match=r"metrics\.listen"):
        load_config(path, environ={})


# ---- the endpoint on its own, on a virtual clock -------------------------------------


async def _endpoint(
    nursery: trio.Nursery, render: Any, unready_reason: Any = lambda: None
) -> tuple[str, int]:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    endpoint = MetricsEndpoint(render, "text/plain; version=0.0.4; charset=utf-8", unready_reason)
    await nursery.start(endpoint.serve, listeners[0])
    return listeners[0].socket.getsockname()[:2]


async def _closed_after(stream: trio.SocketStream) -> tuple[bytes, float]:
    """What the server sent before closing `stream`, and when it closed it."""
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    return data, trio.current_time()


async def test_a_silent_client_is_dropped_after_the_timeout(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    address = await _endpoint(nursery, lambda: b"m 1\n")
    start = trio.current_time()
    async with await trio.open_tcp_stream(*address) as silent:
        await silent.send_all(b"GET /metr")  # and nothing more
        data, closed_at = await _closed_after(silent)
    assert data == b""
    assert closed_at - start == pytest.approx(REQUEST_TIMEOUT_S, abs=0.1)


async def test_connections_beyond_the_cap_are_closed_at_once(nursery: trio.Nursery) -> None:
    address = await _endpoint(nursery, lambda: b"m 1\n")
    held = [await trio.open_tcp_stream(*address) for _ in range(MAX_SCRAPES)]
    with trio.fail_after(WAIT_S):
        await trio.testing.wait_all_tasks_blocked()  # the endpoint holds all of them
        start = trio.current_time()
        async with await trio.open_tcp_stream(*address) as extra:
            data, closed_at = await _closed_after(extra)
    assert data == b""
    # Closed unanswered at once, not after the others' read timeout.
    assert closed_at - start < REQUEST_TIMEOUT_S / 2
    for stream in held:
        await stream.aclose()
    with trio.fail_after(WAIT_S):
        await trio.testing.wait_all_tasks_blocked()
    assert (await http(address, b"GET /metrics HTTP/1.1\r\n\r\n"))[2] == b"m 1\n"


async def test_scrapes_in_quick_succession_share_one_render(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    renders: list[float] = []

    def render() -> bytes:
        renders.append(trio.current_time())
        return f"m {len(renders)}\n".encode()

    address = await _endpoint(nursery, render)
    request = b"GET /metrics HTTP/1.1\r\n\r\n"
    bodies = [(await http(address, request))[2] for _ in range(5)]
    assert bodies == [b"m 1\n"] * 5
    await trio.sleep(RENDER_INTERVAL_S)  # virtual time passing, not a wait for anything
    assert (await http(address, request))[2] == b"m 2\n"


async def test_a_failing_render_is_a_500_and_serving_goes_on(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # configure_logging (the CLI) stops propagation; caplog listens at the root.
    monkeypatch.setattr(logging.getLogger("conduit"), "propagate", True)
    calls = []

    def render() -> bytes:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("collector broke")
        return b"m 1\n"

    address = await _endpoint(nursery, render)
    status, _, body = await http(address, b"GET /metrics HTTP/1.1\r\n\r\n")
    assert status == "HTTP/1.1 500 Internal Server Error"
    assert b"log" in body
    assert any("rendering the metrics failed" in r.getMessage() for r in caplog.records)
    assert (await http(address, b"GET /metrics HTTP/1.1\r\n\r\n"))[0] == "HTTP/1.1 200 OK"


async def test_ready_says_whether_and_why_not_and_live_that_it_answers(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logging.getLogger("conduit"), "propagate", True)
    reasons: list[Any] = [None, "draining", "python: lone \udc80 surrogate", RuntimeError("x")]

    def unready_reason() -> str | None:
        reason = reasons.pop(0)
        if isinstance(reason, Exception):
            raise reason
        return reason

    address = await _endpoint(nursery, lambda: b"m 1\n", unready_reason)
    answers = [await http(address, b"GET /ready HTTP/1.1\r\n\r\n") for _ in range(4)]
    assert [(status, body) for status, _, body in answers] == [
        ("HTTP/1.1 200 OK", b"ready\n"),
        ("HTTP/1.1 503 Service Unavailable", b"not ready: draining\n"),
        ("HTTP/1.1 503 Service Unavailable", b"not ready: python: lone \\udc80 surrogate\n"),
        ("HTTP/1.1 500 Internal Server Error", b"judging readiness failed\n"),
    ]
    assert any("judging readiness failed" in r.getMessage() for r in caplog.records)
    live = await http(address, b"GET /live HTTP/1.1\r\n\r\n")
    assert (live[0], live[2]) == ("HTTP/1.1 200 OK", b"live\n")
    head = await http(address, b"HEAD /live HTTP/1.1\r\n\r\n")
    assert head[0] == "HTTP/1.1 200 OK" and head[2] == b""
    assert (await http(address, b"GET /metrics HTTP/1.1\r\n\r\n"))[2] == b"m 1\n"


async def test_a_daemon_without_executors_is_not_ready(start_daemon: Any) -> None:
    _, info = await start_daemon(**_no_executors())
    assert info.metrics_address is not None
    status, _, body = await http(info.metrics_address, b"GET /ready HTTP/1.1\r\n\r\n")
    assert status == "HTTP/1.1 503 Service Unavailable"
    assert body == b"not ready: no executor is enabled\n"


async def test_a_daemon_is_ready_when_it_can_run_its_languages_and_not_when_draining(
    start_daemon: Any,
) -> None:
    # The languages it runs are those of the executors it has.
    python_only = {"deno": {"enabled": False}, "wasm_js": {"enabled": False}}
    daemon, info = await start_daemon(executors=python_only)
    assert info.metrics_address is not None
    assert (await http(info.metrics_address, b"GET /ready HTTP/1.1\r\n\r\n"))[2] == b"ready\n"
    daemon.shutdown()
    assert daemon.unready_reason() == "draining"


async def test_status_says_what_ready_says_and_what_is_still_preparing(
    start_daemon: Any, connect: Any, tmp_path: Path
) -> None:
    # JavaScript only on a Deno that is not there: settled, and unready until fixed.
    missing = {
        "deno": {"binary": str(tmp_path / "no-deno")},
        "wasm_js": {"enabled": False},
        "wasm_python": {"enabled": False},
    }
    daemon, info = await start_daemon(executors=missing)
    client = await connect(info)
    with trio.fail_after(WAIT_S):
        while (ready := (await client.call("daemon/status"))["ready"])["preparing"]:
            await trio.sleep(0.05)
    assert ready["ok"] is False
    assert ready["reason"] == daemon.unready_reason()
    # And what a client needs to know how long an answer may take.
    executions = (await client.call("daemon/status"))["executions"]
    assert (executions["queue_timeout_s"], executions["default_timeout_ms"]) == (30.0, 10_000)
    assert ready["reason"].startswith("javascript: ")
    assert info.metrics_address is not None
    body = (await http(info.metrics_address, b"GET /ready HTTP/1.1\r\n\r\n"))[2]
    assert body == f"not ready: {ready['reason']}\n".encode()


def _no_executors() -> dict[str, Any]:
    """Executors off: these tests are about the endpoint, not about running programs."""
    return {
        "executors": {
            "deno": {"enabled": False},
            "wasm_python": {"enabled": False},
            "wasm_js": {"enabled": False},
        }
    }


# ---- the collector on its own, from the parts it reads --------------------------------


class _Connection:
    def __init__(self, transport: str) -> None:
        self.transport = transport


def test_metrics_read_the_parts_they_are_given() -> None:
    fx = ExecutionsFixture(FakeExecutor(), capacity=3, queue_size=7)
    auth = Authenticator("master-token-0123456789", AuthConfig())
    assert auth.authenticate_token("wrong") is None
    metrics = Metrics(
        {"ping"},
        GaugeSources(
            connections=[_Connection("unix"), _Connection("sandbox"), _Connection("sandbox")],
            auth=auth,
            events=EventBus(),
            admission=fx.admission,
            executions=fx.executions,
            catalogue=Catalogue(),
        ),
    )
    metrics.count_request("ping", "ok")
    metrics.count_request("no/such", MethodNotFound.code)
    metrics.count_request(None, ParseError.code)
    text = metrics.exposition().decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert value(families, "conduit_rpc_requests_total", method="ping", code="ok") == 1
    assert value(families, "conduit_rpc_requests_total", method="unknown", code="-32601") == 1
    assert value(families, "conduit_rpc_requests_total", method="invalid", code="-32700") == 1
    assert value(families, "conduit_connections", transport="sandbox") == 2
    assert value(families, "conduit_connections", transport="tcp") == 0
    assert value(families, "conduit_auth_failures_total") == 1
    assert value(families, "conduit_execution_slots") == 3
    assert value(families, "conduit_execution_queue_size") == 7
    assert value(families, "conduit_executor_available", executor="fake") == 1
