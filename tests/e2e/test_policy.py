"""The pre-execution policy end to end: a real daemon refuses before any sandbox runs,
answers `refused` with the rule and the line, publishes the violation and the ended
execution's record, and keeps serving."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.daemon import cli
from conduit.daemon.events import BusEvent, BusSubscription, EventType
from tests.conftest import WAIT_S
from tests.e2e.test_pyodide_tools import share_install

POLICY = {
    "python": {"forbidden_modules": ["os"], "forbidden_builtins": ["eval"]},
    "javascript": {"forbidden_imports": ["node:*"]},
    "executors": {"deno": {"forbidden_globals": ["Deno"]}},
}


async def next_events(events: BusSubscription, count: int) -> list[BusEvent]:
    received = []
    with trio.fail_after(WAIT_S):
        async for event in events:
            received.append(event)
            if len(received) == count:
                break
    return received


def refused(result: dict[str, Any], executor: str, rule: str, line: int, column: int) -> None:
    """Assert the whole shape of a refusal: nothing ran, and the error says where."""
    error = result["error"]
    assert result == {
        "execution_id": result["execution_id"],
        "status": "refused",
        "result": None,
        "stdout": "",
        "stderr": "",
        "exit_code": None,
        "error": {
            "type": "PolicyViolation",
            "message": error["message"],
            "traceback": "",
            "rule": rule,
            "line": line,
            "column": column,
            "snippet": error["snippet"],
        },
        "truncated": {"stdout": False, "stderr": False},
        "tool_calls": 0,
        "duration_ms": result["duration_ms"],
        "queue_ms": 0.0,
        "executor": executor,
        "memory_peak_bytes": None,
        "session_id": None,
        "session_reset": False,
        "files": [],
    }
    assert result["execution_id"].startswith("ex_")
    assert error["message"].startswith(f"line {line}, column {column}: ")


async def test_python_is_refused_with_its_line_and_the_refusal_is_published(
    start_daemon: Any, connect: Any
) -> None:
    daemon, info = await start_daemon(policy=POLICY)
    client = await connect(info)
    with daemon.events.subscribe() as events:
        result = await client.call(
            "execute", {"language": "python", "code": "x = 1\nimport os\nprint(os.getcwd())"}
        )
        refused(result, "wasm-python", "python.forbidden_import", 2, 1)
        assert "policy.python.forbidden_modules" in result["error"]["message"]
        assert result["error"]["snippet"] == "import os"

        violation, ended = await next_events(events, 2)
        assert violation.type is EventType.POLICY_VIOLATION
        principal = violation.principal  # peer credentials: the daemon's own uid
        assert principal is not None and principal == ended.principal
        assert violation.data == {
            "execution_id": result["execution_id"],
            "principal": principal,
            "executor": "wasm-python",
            "language": "python",
            "code_sha256": violation.data["code_sha256"],
            "message": violation.data["message"],
            "rule": "python.forbidden_import",
            "line": 2,
            "column": 1,
            "snippet": "import os",
        }
        # The audit trail's record: an execution that ended refused, never started.
        assert ended.type is EventType.EXECUTION_FAILED
        record = ended.record
        assert record is not None
        assert (record.execution_id, record.status, record.policy_rule) == (
            result["execution_id"],
            "refused",
            "python.forbidden_import",
        )
        assert record.code_sha256 == violation.data["code_sha256"]
        assert record.code_snippet.startswith("x = 1\nimport os")
        assert record.error_type == "PolicyViolation"
        assert ended.data["rule"] == "python.forbidden_import"
        stored = await client.call("executions/get", {"execution_id": result["execution_id"]})
        assert (stored["status"], stored["policy_rule"]) == ("refused", "python.forbidden_import")
        (listed,) = (await client.call("executions/list", {"status": "refused"}))["executions"]
        assert listed["policy_rule"] == "python.forbidden_import"

        # The words in a string or a comment are no import: this one runs.
        fine = await client.call(
            "execute", {"language": "python", "code": "print('import os')  # eval(x)\n'eval'"}
        )
        assert (fine["status"], fine["stdout"], fine["result"]) == ("ok", "import os\n", "eval")
        started, finished = await next_events(events, 2)
        assert (started.type, finished.type) == (
            EventType.EXECUTION_STARTED,
            EventType.EXECUTION_FINISHED,
        )
        assert started.data["execution_id"] == fine["execution_id"]
    assert cli._exit_status(result) == 77


async def test_typescript_and_javascript_rules_per_executor(
    start_daemon: Any, connect: Any
) -> None:
    _, info = await start_daemon(policy=POLICY)
    client = await connect(info)
    on_deno = await client.call(
        "execute",
        {"language": "typescript", "code": "const n = 1;\nconst home = Deno.env.get('HOME');"},
    )
    refused(on_deno, "deno", "javascript.forbidden_global", 2, 14)
    assert "policy.executors.deno.forbidden_globals" in on_deno["error"]["message"]

    importing = {"language": "javascript", "code": "const fs = await import('node:fs');\nfs"}
    on_wasm_js = await client.call("execute", {**importing, "executor": "wasm-js"})
    refused(on_wasm_js, "wasm-js", "javascript.forbidden_import", 1, 25)
    # Named by none, a program that imports goes where imports load, and meets the rule.
    refused(await client.call("execute", importing), "deno", "javascript.forbidden_import", 1, 25)

    # "Deno" in a string, a comment and a property is not the global; on wasm-js the
    # global is not forbidden at all (it does not exist there).
    fine = await client.call(
        "execute",
        {
            "language": "typescript",
            "code": "// Deno.exit()\nconst o = { Deno: 'Deno' };\no.Deno",
        },
    )
    assert (fine["status"], fine["result"]) == ("ok", "Deno")
    elsewhere = await client.call(
        "execute", {"language": "javascript", "executor": "wasm-js", "code": "typeof Deno"}
    )
    assert (elsewhere["status"], elsewhere["result"]) == ("ok", "undefined")


async def test_seed_aliases_and_builtin_tools_report_the_refusal(
    start_daemon: Any, connect: Any
) -> None:
    _, info = await start_daemon(policy=POLICY)
    client = await connect(info)
    seed = await client.call("mcp.executePython", {"code": "eval('1 + 1')"})
    assert seed["stdout"] == ""
    assert seed["exitCode"] == 1
    assert seed["stderr"].startswith("PolicyViolation: line 1, column 1: the builtin eval")

    tool = await client.call(
        "tools/call", {"name": "execute_python", "arguments": {"code": "import os"}}
    )
    assert tool["isError"] is True
    assert tool["structuredContent"]["status"] == "refused"
    assert tool["structuredContent"]["error"]["rule"] == "python.forbidden_import"


async def test_large_programs_are_checked_off_the_event_loop(
    start_daemon: Any, connect: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon, info = await start_daemon(policy=POLICY)
    client = await connect(info)
    on_main_thread: list[bool] = []
    check = daemon.policy.check

    def spy(*args: Any) -> Any:
        on_main_thread.append(threading.current_thread() is threading.main_thread())
        return check(*args)

    monkeypatch.setattr(daemon.policy, "check", spy)
    small = await client.call("execute", {"language": "python", "code": "import os"})
    code = "".join(f"value_{i} = {i} * 2\n" for i in range(400)) + "import os\n"
    large = await client.call("execute", {"language": "python", "code": code})
    refused(small, "wasm-python", "python.forbidden_import", 1, 1)
    refused(large, "wasm-python", "python.forbidden_import", 401, 1)
    assert on_main_thread == [True, False]


async def test_a_reload_applies_the_new_policy(
    start_daemon: Any, connect: Any, make_config: Any
) -> None:
    daemon, info = await start_daemon()
    client = await connect(info)
    code = {"language": "python", "code": "import os\nos.sep"}
    before = await client.call("execute", code)
    assert (before["status"], before["result"]) == ("ok", "/")
    make_config(policy=POLICY)  # rewrites the daemon's config file
    await daemon.reload()
    after = await client.call("execute", code)
    refused(after, "wasm-python", "python.forbidden_import", 1, 1)


async def test_pyodide_refuses_import_js_by_default_before_any_worker(
    start_daemon: Any, connect: Any, tmp_path: Path, pyodide_install: Path
) -> None:
    """The shipped default: no policy section at all. With no warm worker (pool_size
    0), a refusal costs no Pyodide start."""
    share_install(tmp_path / "state", pyodide_install)
    daemon, info = await start_daemon(executors={"pyodide": {"enabled": True, "pool_size": 0}})
    client = await connect(info)
    code = "from js import Deno\nDeno.exit(3)"
    result = await client.call(
        "execute", {"language": "python", "executor": "pyodide", "code": code}
    )
    refused(result, "pyodide", "python.forbidden_import", 1, 1)
    assert "policy.executors.pyodide.forbidden_modules" in result["error"]["message"]
    pyodide = next(e for e in daemon.registry.infos() if e.name == "pyodide")
    assert pyodide.available
    assert pyodide.pool is not None
    assert (pyodide.pool["handed_out"], pyodide.pool["refills"]) == (0, 0)
