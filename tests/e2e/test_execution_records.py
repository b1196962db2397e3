"""Every execution and every tool call is published once, with what the record must hold."""

from __future__ import annotations

from typing import Any

from conduit.daemon.events import BusEvent, EventType
from conduit.daemon.records import code_digest
from tests.e2e.helpers import execute, wait_upstreams
from tests.e2e.test_tools import ECHO


async def _published(start_daemon: Any, connect: Any) -> tuple[Any, list[BusEvent]]:
    server, info = await start_daemon(upstreams=[ECHO])
    await wait_upstreams(server, "echo")
    seen: list[BusEvent] = []
    server.events.add_sink(seen.append)
    return await connect(info), seen


async def test_an_execution_is_started_then_ended_with_its_record(
    start_daemon: Any, connect: Any
) -> None:
    client, seen = await _published(start_daemon, connect)
    code = 'said = tools.echo.echo(text="hi")\nprint("out")\n{"said": said}'
    result = await execute(client, code, language="python", allowed_tools=["echo.*"])
    assert result["status"] == "ok", result

    kinds = [event.type for event in seen]
    assert kinds == [
        EventType.EXECUTION_STARTED,
        EventType.TOOL_CALLED,
        EventType.EXECUTION_FINISHED,
    ]
    started, called, ended = seen
    assert started.data["execution_id"] == result["execution_id"]
    assert started.data["code_sha256"] == code_digest(code)
    assert called.data["tool"] == "echo__echo"
    assert called.data["outcome"] == "ok"
    assert called.data["execution_id"] == result["execution_id"]
    assert called.principal == started.principal  # the owner, not the sandbox session

    record = ended.record
    assert record is not None
    assert record.execution_id == result["execution_id"]
    assert record.executor == "wasm-python"
    assert record.language == "python"
    assert record.status == "ok"
    assert record.code_bytes == len(code.encode())
    assert record.code_snippet == code
    assert record.allowed_tools == ("echo.*",)
    assert (record.stdout_bytes, record.stdout_head) == (4, "out\n")
    assert record.result_head == '{"said":"hi"}'
    assert [(c.tool, c.outcome) for c in record.tool_calls] == [("echo__echo", "ok")]
    assert record.limit_hit is None
    assert record.duration_ms == result["duration_ms"]


async def test_limits_and_refused_tool_calls_are_named(start_daemon: Any, connect: Any) -> None:
    client, seen = await _published(start_daemon, connect)
    code = "tools.echo.fail(message='no')\n"
    result = await execute(
        client, "while True:\n    pass\n", language="python", limits={"timeout_ms": 200}
    )
    assert result["status"] == "timeout"
    failed = await execute(client, code, language="python", allowed_tools=["echo.echo"])
    assert failed["status"] == "error"

    ended = [e for e in seen if e.record is not None]
    assert [e.type for e in ended] == [EventType.EXECUTION_TIMED_OUT, EventType.EXECUTION_FAILED]
    timed_out, refused = (e.record for e in ended)
    assert timed_out is not None and refused is not None
    assert timed_out.limit_hit == "timeout"
    assert ended[0].data["limit"] == "timeout"
    assert refused.error_type is not None
    # The allowlist refused it before any upstream saw it, and that is on the record.
    assert [(c.tool, c.outcome) for c in refused.tool_calls] == [("echo.fail", "forbidden")]
    (called,) = [e for e in seen if e.type is EventType.TOOL_CALLED]
    assert (called.data["upstream"], called.data["outcome"]) == (None, "forbidden")
