"""Escape attempts against the wasm-python sandbox, with real Wasmtime.

Each attempt is refused or stopped and reported, and the next execution still works.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from conduit.daemon.errors import Forbidden, InvalidRequest, MethodNotFound
from conduit.executors.base import Job, Limits, Outcome, Status
from conduit.executors.wasm import RUNNERS
from conduit.executors.wasm_python import WasmPythonExecutor
from tests.conftest import MASTER_TOKEN
from tests.sandboxes import WAIT_S, NoBridge


async def run(executor: WasmPythonExecutor, code: str, **limits: Any) -> Outcome:
    with trio.fail_after(WAIT_S):
        outcome = await executor.run(Job("ex_attack", "python", code, Limits(**limits)), NoBridge())
        assert (await executor.run(Job("ex_next", "python", "1", Limits()), NoBridge())).result == 1
    return outcome


@pytest.mark.parametrize(
    ("code", "error_type"),
    [
        ("open('/etc/passwd').read()", "FileNotFoundError"),
        ("import os\nos.listdir('/')", "FileNotFoundError"),
        ("import os\nos.listdir('.')", "FileNotFoundError"),
        ("import socket", "ModuleNotFoundError"),
        ("import subprocess", "ModuleNotFoundError"),
        ("import os\nos.system('id')", "AttributeError"),
        ("import ctypes", "ModuleNotFoundError"),
        ("import importlib\nimportlib.import_module('socket')", "ModuleNotFoundError"),
        ("import sys\nsys.modules['os'].fork()", "AttributeError"),
        ("__import__('urllib.request')", "ModuleNotFoundError"),
    ],
)
async def test_host_access_is_refused(wasm: WasmPythonExecutor, code: str, error_type: str) -> None:
    outcome = await run(wasm, code)
    assert outcome.status is Status.ERROR, outcome
    assert outcome.error is not None and outcome.error.type == error_type, outcome.error


async def test_raw_sockets_cannot_connect_or_resolve(wasm: WasmPythonExecutor) -> None:
    code = """
import _socket
refused = []
for attempt in (
    lambda: _socket.socket().connect(("127.0.0.1", 22)),
    lambda: _socket.getaddrinfo("example.com", 80),
    lambda: _socket.socket().bind(("0.0.0.0", 8080)),
):
    try:
        attempt()
    except Exception as exc:
        refused.append(type(exc).__name__)
refused
"""
    outcome = await run(wasm, code)
    assert outcome.status is Status.OK, outcome
    assert len(outcome.result) == 3, outcome.result


async def test_environment_and_arguments_are_empty(wasm: WasmPythonExecutor) -> None:
    outcome = await run(wasm, "import os, sys\n[dict(os.environ), sys.argv]")
    assert outcome.result in ([{}, []], [{}, [""]])


async def test_the_raw_host_call_is_not_reachable_without_the_daemon(
    wasm: WasmPythonExecutor,
) -> None:
    outcome = await run(wasm, "import wit_world\nwit_world.host_call('execute', '{}')")
    # NoBridge answers nothing: the executor reports the bridge's failure to the guest.
    assert outcome.status is Status.OK
    assert '"error"' in outcome.result


@pytest.mark.parametrize(
    ("code", "limits", "status"),
    [
        ("while True: pass", {"timeout_ms": 300}, Status.TIMEOUT),
        (
            "x = []\nwhile True: x.append(bytearray(1 << 20))",
            {"memory_mb": 48},
            Status.MEMORY_LIMIT,
        ),
        ("b = bytearray(1 << 30)", {"memory_mb": 48}, Status.MEMORY_LIMIT),
        ("while True: print('x' * 1000)", {"output_bytes": 50_000}, Status.OUTPUT_LIMIT),
        (
            "import sys\nwhile True: sys.stderr.write('e\\n')",
            {"output_lines": 100},
            Status.OUTPUT_LIMIT,
        ),
    ],
)
async def test_resource_attacks_are_stopped(
    wasm: WasmPythonExecutor, code: str, limits: dict[str, int], status: Status
) -> None:
    outcome = await run(wasm, code, **limits)
    assert outcome.status is status, outcome


async def test_sleeping_past_the_timeout_is_stopped_at_the_timeout(
    wasm: WasmPythonExecutor,
) -> None:
    started = trio.current_time()
    outcome = await run(wasm, "import time\nprint('zz')\ntime.sleep(3)", timeout_ms=300)
    assert outcome.status is Status.TIMEOUT, outcome
    assert outcome.stdout == "zz\n"
    assert trio.current_time() - started < 1.5
    # The sleep itself woke at the deadline: no thread was left behind.
    assert wasm.info().pool["lingering_threads"] == 0


async def test_a_sleep_the_guest_cannot_bound_is_left_behind_not_waited_for(
    wasm: WasmPythonExecutor,
) -> None:
    # The program runner's own reference to the interpreter's sleep is unbounded: the
    # execution is reported at its deadline anyway, and the thread finishes alone
    # when the sleep returns.
    code = "import sys\nsys.modules['python_program']._SLEEP(2)"
    started = trio.current_time()
    outcome = await run(wasm, code, timeout_ms=300)
    assert outcome.status is Status.TIMEOUT, outcome
    assert trio.current_time() - started < 1.5
    assert wasm.info().pool["lingering_threads"] == 1
    # A new runner took the blocked one's place at once: the executor keeps its
    # capacity while the old one sleeps, and the old one retires when it wakes.
    with trio.fail_after(WAIT_S):
        while wasm.info().pool["standby_instances"] < RUNNERS:
            await trio.sleep(0.01)
    assert (await run(wasm, "6 * 7")).result == 42
    await wait_for_lingering(wasm, 0)


async def wait_for_lingering(executor: Any, count: int) -> None:
    with trio.fail_after(WAIT_S):
        while executor.info().pool["lingering_threads"] != count:
            await trio.sleep(0.05)  # the count changes in a worker thread


async def test_deep_recursion_is_an_error_not_a_crash(wasm: WasmPythonExecutor) -> None:
    outcome = await run(
        wasm, "import sys\nsys.setrecursionlimit(10**6)\ndef f(n): return f(n + 1)\nf(0)"
    )
    assert outcome.status in (Status.ERROR, Status.CRASHED, Status.MEMORY_LIMIT), outcome
    outcome = await run(wasm, "def f(): return f()\nf()")
    assert outcome.status is Status.ERROR
    assert outcome.error is not None and outcome.error.type == "RecursionError"


# What a Python program reaching past its SDK with the raw `host-call` may try, and the
# error each attempt gets: methods closed to session tokens are Forbidden whatever the
# params; auth/login cannot trade up, since a sandbox has no connection to log in.
FORGED_HOST_CALLS = [
    ("execute", {"language": "python", "code": "1"}, Forbidden.code),
    (
        "execute",
        {"language": "python", "code": "1", "auth": {"bearerToken": MASTER_TOKEN}},
        Forbidden.code,
    ),
    (
        "upstreams/register",
        {"upstream": {"name": "x", "transport": "stdio", "command": "/bin/sh"}},
        Forbidden.code,
    ),
    ("config/reload", {}, Forbidden.code),
    ("daemon/status", {}, Forbidden.code),
    ("executors/list", {}, Forbidden.code),
    ("executions/running", {}, Forbidden.code),
    ("tools/call", {"name": "execute_python", "arguments": {"code": "1"}}, Forbidden.code),
    ("auth/login", {"token": MASTER_TOKEN}, InvalidRequest.code),
    ("tokens/create", {"name": "x"}, MethodNotFound.code),
]


async def test_forged_host_calls_are_refused_by_the_session_token(
    start_daemon: Any, connect: Any
) -> None:
    _, info = await start_daemon()
    client = await connect(info)
    code = """
import json, wit_world
def call(method, params):
    return json.loads(wit_world.host_call(method, json.dumps(params)))
answers = [call(method, params) for method, params in inputs]
return {"answers": answers, "whoami": call("auth/whoami", {})}
"""
    attempts = [[method, params] for method, params, _ in FORGED_HOST_CALLS]
    result = await client.call("execute", {"language": "python", "code": code, "inputs": attempts})
    assert result["status"] == "ok", result
    answers = result["result"]["answers"]
    for (method, _, expected), answer in zip(FORGED_HOST_CALLS, answers, strict=True):
        assert answer.get("error", {}).get("code") == expected, (method, answer)
    # Nothing came of them: the program is still its session, and nothing was registered.
    assert result["result"]["whoami"]["result"]["principal"]["kind"] == "session"
    assert (await client.call("upstreams/list"))["upstreams"] == []
    again = await client.call("execute", {"language": "python", "code": "6 * 7"})
    assert again["result"] == 42
