"""Structured logs: JSON lines off a terminal, one event per line whatever the message
holds, and every kind of secret redacted in both formats."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Callable
from typing import Any

import pytest

from conduit.core.redaction import REDACTED, redact
from conduit.daemon.auth import hash_token
from conduit.daemon.logs import configure_logging
from conduit.daemon.server import Daemon

log = logging.getLogger("conduit.test.logs")

# A text event starts with its time and level; anything else is a traceback line.
TEXT_EVENT = re.compile(r"^\d\d:\d\d:\d\d (debug|info|warning|error|critical) ")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def capture(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool], io.StringIO]:
    """Configure logging as the CLI does, onto a buffer that is a terminal or not; the
    `conduit` logger's state is restored after the test."""
    root = logging.getLogger("conduit")
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(root, "propagate", root.propagate)

    def configure(tty: bool) -> io.StringIO:
        stream = _Terminal() if tty else io.StringIO()
        configure_logging("debug", stream)
        return stream

    return configure


def _log_awkward_events() -> None:
    """Three events whose message, fields and exception hold line breaks of every kind."""
    log.info("first line\nforged 12:00:00 error    injected\r\nthird\u2028fourth\x85fifth")
    log.warning("fields", extra={"note": "a\nb", "nested": {"k": ["x\ny", 1]}, "n": 3})
    try:
        raise ValueError("broken\nacross lines")
    except ValueError:
        log.exception("failed")


def test_off_a_terminal_every_event_is_one_json_line(capture: Any) -> None:
    stream = capture(tty=False)
    _log_awkward_events()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3
    events = [json.loads(line) for line in lines]
    assert events[0]["msg"].startswith("first line\nforged")
    assert events[0]["level"] == "info"
    assert events[0]["logger"] == "conduit.test.logs"
    assert events[1]["note"] == "a\nb"
    assert events[1]["nested"] == {"k": ["x\ny", 1]}
    assert events[1]["n"] == 3
    assert "ValueError: broken\nacross lines" in events[2]["exc"]


def test_on_a_terminal_no_message_or_field_can_start_a_line(capture: Any) -> None:
    stream = capture(tty=True)
    _log_awkward_events()
    lines = stream.getvalue().splitlines()
    events = [line for line in lines if TEXT_EVENT.match(line)]
    assert len(events) == 3
    # Whatever is not an event is its traceback, indented.
    assert all(line.startswith("  ") for line in lines if not TEXT_EVENT.match(line))
    assert "first line\\nforged" in events[0]
    assert 'note="a\\nb"' in events[1]
    assert "n=3" in events[1]
    assert any("ValueError: broken" in line for line in lines)


async def test_every_kind_of_secret_is_redacted_in_both_formats(
    capture: Any, make_config: Any
) -> None:
    master = "master-not-token-shaped-0123"
    client_token = "client-secret-not-token-shaped-4567"
    config = make_config(
        auth={
            "token": master,
            "clients": [{"name": "bot", "sha256": hash_token(client_token)}],
        }
    )
    daemon = Daemon(config)  # registers the master token
    assert daemon.auth.authenticate_token(client_token) is not None  # now known
    session = daemon.auth.mint_session("ex_1", (("*",),))
    upstream_key = 'upstream "key" \\ wörd-89'  # JSON would escape all three
    redact(upstream_key)
    unregistered = "cdt_" + "A" * 43  # any token's shape, registered or not
    secrets = [master, client_token, session, upstream_key, unregistered]

    for tty in (False, True):
        stream = capture(tty=tty)
        everything = " ".join(secrets)
        log.info("message %s", everything)
        log.info("fields", extra={"token": master, "deep": {"list": [session, client_token]}})
        log.info("key", extra={upstream_key: "as a field name"})
        try:
            raise RuntimeError(f"upstream refused {upstream_key} and {unregistered}")
        except RuntimeError:
            log.exception("with %s", session)
        written = stream.getvalue()
        decoded = (
            written
            if tty
            else "\n".join(
                json.dumps(json.loads(line), ensure_ascii=False) for line in written.splitlines()
            )
        )
        for secret in secrets:
            assert secret not in written, (tty, secret)
            assert secret not in decoded, (tty, secret)
        assert written.count(REDACTED) >= 11


def test_a_secret_inside_another_is_redacted_whole(capture: Any) -> None:
    short, long = "inner-secret-77", "inner-secret-77-and-the-rest"
    redact(short)
    redact(long)
    stream = capture(tty=False)
    log.info("%s | %s", long, short)
    assert json.loads(stream.getvalue())["msg"] == f"{REDACTED} | {REDACTED}"


def test_values_too_short_to_be_secrets_are_left_alone(capture: Any) -> None:
    redact("abc")  # would redact every "abc" in the log
    stream = capture(tty=False)
    log.info("abc")
    assert json.loads(stream.getvalue())["msg"] == "abc"
