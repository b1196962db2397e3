"""The Python program contract, run by this interpreter: the same module every Python
executor's guest runs (the executors' own tests run it inside their sandboxes)."""

from __future__ import annotations

import io
import json
import sys
from typing import Any

import pytest

from conduit.shims import python_program


def no_daemon(method: str, params: str) -> str:
    raise AssertionError(f"unexpected host call {method}")


def run(code: str, **request: Any) -> dict[str, Any]:
    return json.loads(python_program.execute({"code": code, **request}, no_daemon))


async def run_async(code: str, host_call: Any = no_daemon) -> dict[str, Any]:
    return json.loads(await python_program.execute_async({"code": code}, host_call))


@pytest.mark.parametrize(
    ("code", "result"),
    [
        ("x = 20\nx + 22", 42),
        ("for i in range(5):\n    if i == 3:\n        return i", 3),
        ("x = 1", None),
        ("{1, 2}", "{1, 2}"),
        ("float('nan')", "nan"),
    ],
)
def test_results(code: str, result: Any) -> None:
    assert run(code) == {"result": result}


def test_inputs_are_a_variable() -> None:
    assert run("inputs['n'] * 2", inputs={"n": 21}) == {"result": 42}


def test_errors_keep_only_the_program_s_frames() -> None:
    error = run("def f():\n    raise KeyError('k')\nf()")["error"]
    assert error["type"] == "KeyError"
    assert 'File "<program>", line 2, in f' in error["traceback"]
    assert "python_program" not in error["traceback"]


async def test_top_level_await_with_and_without_a_return() -> None:
    code = "import trio\nawait trio.sleep(0)\nx = 5\nx * 2"
    assert await run_async(code) == {"result": 10}
    assert await run_async("import trio\nawait trio.sleep(0)\nreturn 7") == {"result": 7}
    assert (await run_async("import trio\nawait trio.sleep(0)\n1 / 0"))["error"]["type"] == (
        "ZeroDivisionError"
    )


async def test_tools_go_through_the_host_call_synchronously() -> None:
    calls = []

    def host_call(method: str, params: str) -> str:
        calls.append((method, json.loads(params)))
        return json.dumps({"result": {"value": {"echo": json.loads(params)["arguments"]}}})

    answer = await run_async("tools.echo.echo(text='hi')", host_call)
    assert answer == {"result": {"echo": {"text": "hi"}}}
    assert calls == [
        ("tools/call", {"name": "echo.echo", "arguments": {"text": "hi"}, "shape": "value"})
    ]


async def test_nan_and_infinity_in_arguments_are_refused_before_the_call() -> None:
    """Not sent as JSON's `null` (the tool got null on wasm-python) nor as a `NaN`
    token the daemon refuses: CPython's own ValueError, and no call."""
    calls = []

    def host_call(method: str, params: str) -> str:
        calls.append(params)
        return json.dumps({"result": {"value": None}})

    code = (
        "out = []\nfor bad in (float('nan'), float('inf')):\n    try:\n"
        "        tools.echo.echo(text=bad)\n    except ValueError as e:\n"
        "        out.append('JSON' in str(e))\nout"
    )
    assert await run_async(code, host_call) == {"result": [True, True]}
    assert calls == []


async def test_refused_calls_raise_tool_error_with_the_daemon_code() -> None:
    def host_call(method: str, params: str) -> str:
        return json.dumps({"error": {"code": -32003, "message": "not allowed"}})

    code = "try:\n    tools.a.b()\nexcept ToolError as e:\n    return [e.code, e.tool, e.message]"
    assert await run_async(code, host_call) == {"result": [-32003, "a.b", "not allowed"]}


def test_sleep_wakes_by_the_execution_end() -> None:
    import time

    original = time.sleep
    try:
        started = time.monotonic()
        assert run("import time\ntime.sleep(5)\n'woke'", timeout_ms=100) == {"result": "woke"}
        assert time.monotonic() - started < 1
    finally:
        time.sleep = original


async def test_a_scope_the_caller_keeps_carries_a_session_from_run_to_run() -> None:
    scope: dict[str, Any] = {}

    async def step(code: str, **request: Any) -> dict[str, Any]:
        answer = await python_program.execute_async(
            {"code": code, **request}, no_daemon, scope=scope
        )
        return json.loads(answer)

    assert await step("x = 20\ndef f():\n    return x + 1") == {"result": None}
    assert await step("x += 1\nf()") == {"result": 22}
    # Each run's result and inputs are its own, not the last run's.
    assert await step("y = inputs", inputs=7) == {"result": None}
    assert await step("y, inputs") == {"result": [7, None]}
    assert run("x")["error"]["type"] == "NameError"  # a run of its own has none of it


def test_session_steps_share_one_namespace_and_fresh_runs_do_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(python_program, "_SESSION_SCOPE", {})
    assert run("import math\ndef f(n):\n    return math.sqrt(n)\nx = 1", session=True) == {
        "result": None
    }
    assert run("x += 1\n[x, f(16)]", session=True) == {"result": [2, 4.0]}
    assert run("'x' in globals()") == {"result": False}
    # A step's result and inputs are its own.
    assert run("x", session=True, inputs=5) == {"result": 2}
    assert run("y = inputs", session=True) == {"result": None}


# Programs that close or break their own output: the program's outcome stands, and a
# flush failing once it has ended only loses what it could not write, as in CPython.
CLOSED_OUTPUT_PROGRAMS = [
    ("import sys\nsys.stdout.close()\n5", {"result": 5}),
    ("import sys\nsys.stderr.close()\nraise KeyError('mine')", "KeyError"),
    (
        "import sys\nclass Out:\n    def write(self, text):\n        return len(text)\n"
        "    def flush(self):\n        raise OSError('disk full')\nsys.stdout = Out()\n5",
        {"result": 5},
    ),
    ("import sys\nsys.stdout.close()\nraise SystemExit(3)", "SystemExit"),
]


@pytest.mark.parametrize(("code", "outcome"), CLOSED_OUTPUT_PROGRAMS)
def test_a_program_that_breaks_its_output_keeps_its_outcome(
    monkeypatch: pytest.MonkeyPatch, code: str, outcome: dict[str, Any] | str
) -> None:
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO()))
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(io.BytesIO()))
    answer = run(code)
    if isinstance(outcome, str):
        assert answer["error"]["type"] == outcome, answer
    else:
        assert answer == outcome


def test_a_session_step_runs_after_an_earlier_one_closed_stdout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(python_program, "_SESSION_SCOPE", {})
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO()))
    assert run("import sys\nsys.stdout.close()\nx = 1", session=True) == {"result": None}
    assert run("x + 1", session=True, live_output=True) == {"result": 2}
