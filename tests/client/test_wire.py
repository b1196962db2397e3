"""The client's sans-I/O parts: framing, message kinds, typed results, where to connect."""

from __future__ import annotations

import random
from typing import Any

import pytest

from conduit.client import ConnectionLost, ExecutionResult, ProgramError
from conduit.client.calls import effective_timeout_s, execute, list_tools
from conduit.client.endpoint import Backoff, Endpoint, LoginToken, resolve_token
from conduit.client.wire import LineBuffer, Notification, Reply, classify
from tests.client.fake_daemon import wire_result


def test_line_buffer_joins_chunks_and_drops_blank_lines_and_cr() -> None:
    buffer = LineBuffer(64)
    assert buffer.feed(b'{"a"') == []
    assert buffer.feed(b':1}\r\n\n{"b":2}\n{"c"') == [b'{"a":1}', b'{"b":2}']
    assert buffer.feed(b":3}\n") == [b'{"c":3}']


def test_line_buffer_lines_are_whole_however_the_bytes_arrive() -> None:
    # Each line is `bytes.split` then `rstrip(b"\r")`, blank ones dropped, whatever
    # the chunks, for lines of a few bytes and of a megabyte alike.
    rng = random.Random(7)
    pieces = [b"", b"\r", b"\r\r", b" \t\x0b", b"x\ry", b'{"a":1}', b"A" * (1 << 20)]
    stream = b"\n".join(rng.choice(pieces) + rng.choice(pieces) for _ in range(300)) + b"\n"
    expected = [line.rstrip(b"\r") for line in stream.split(b"\n")[:-1] if line.strip()]
    buffer = LineBuffer(4 << 20)
    got: list[bytes] = []
    at = 0
    while at < len(stream):
        size = rng.choice((1, 2, 7, 4096, 1 << 16, 1 << 20))
        got += buffer.feed(stream[at : at + size])
        at += size
    assert got == expected
    assert all(type(line) is bytes for line in got)


def test_line_buffer_refuses_a_line_past_its_cap() -> None:
    buffer = LineBuffer(16)
    with pytest.raises(ConnectionLost, match="over 16 bytes"):
        buffer.feed(b"x" * 17)


def test_classify_tells_replies_from_notifications_and_ignores_the_rest() -> None:
    reply = classify(b'{"jsonrpc":"2.0","id":3,"result":{}}')
    assert reply == Reply(3, {"jsonrpc": "2.0", "id": 3, "result": {}})
    note = classify(b'{"jsonrpc":"2.0","method":"event","params":{"type":"x"}}')
    assert note == Notification("event", {"type": "x"})
    for junk in (b"not json", b"[1, 2]", b'{"id": {"a": 1}, "result": 1}', b'{"id": 1}'):
        assert classify(junk) is None, junk


def test_execution_result_reads_the_wire_and_keeps_it() -> None:
    wire = wire_result(
        "ex_1",
        status="timeout",
        stdout="partial",
        truncated={"stdout": True, "stderr": False},
        error={"type": "Timeout", "message": "took too long", "traceback": None},
        added_later=1,
    )
    result = ExecutionResult.from_wire(wire)
    assert (result.status, result.ok, result.stdout, result.truncated_stdout) == (
        "timeout",
        False,
        "partial",
        True,
    )
    assert result.error == ProgramError("Timeout", "took too long")
    assert result.raw["added_later"] == 1


def test_endpoint_prefers_tcp_then_the_path_then_conduit_socket(monkeypatch: Any) -> None:
    monkeypatch.setenv("CONDUIT_SOCKET", "/run/env.sock")
    assert str(Endpoint.resolve(tcp="[::1]:7780", unix_path="/x.sock")) == "tcp:[::1]:7780"
    assert Endpoint.resolve(unix_path="/x.sock").unix_path == "/x.sock"
    assert Endpoint.resolve().unix_path == "/run/env.sock"
    with pytest.raises(ValueError, match="HOST:PORT"):
        Endpoint.resolve(tcp="7780")


def test_token_comes_from_conduit_token_unless_given_or_refused(monkeypatch: Any) -> None:
    monkeypatch.setenv("CONDUIT_TOKEN", "cdt_env")
    assert (resolve_token(None), resolve_token("cdt_given"), resolve_token("")) == (
        LoginToken("cdt_env"),
        LoginToken("cdt_given"),
        None,
    )
    fallback = LoginToken("cdt_file", fallback=True)
    assert resolve_token(fallback) is fallback
    assert "cdt_file" not in repr(fallback)


def test_backoff_doubles_up_to_its_ceiling() -> None:
    assert list(Backoff(attempts=6, first_delay_s=0.5, max_delay_s=3).delays()) == [
        0.5,
        1.0,
        2.0,
        3,
        3,
    ]


def test_an_execute_waits_at_least_its_own_limit_unless_told_otherwise() -> None:
    long = execute("1", language="python", limits={"timeout_ms": 120_000})
    assert effective_timeout_s(long, None, 30.0, given=False) == 150.0
    assert effective_timeout_s(long, 1.0, 30.0, given=True) == 1.0
    assert effective_timeout_s(long, None, 30.0, given=True) is None
    assert effective_timeout_s(list_tools(), None, 30.0, given=False) == 30.0
