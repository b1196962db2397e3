"""Escape attempts against the wasm-python sandbox, with real Wasmtime.

Each attempt is refused or stopped and reported, and the next execution still works.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import trio

from conduit.core.errors import Forbidden, InvalidRequest, MethodNotFound
from conduit.executors.base import Job, Limits, Outcome, Status
from conduit.executors.wasm import CONCURRENT_EXECUTIONS, RUNNERS
from conduit.executors.wasm_python import WasmPythonExecutor
from tests.conftest import MASTER_TOKEN
from tests.sandboxes import (
    FLOODS_OUTPUT,
    RUNS_OUT_OF_MEMORY,
    TIMES_OUT,
    WAIT_S,
    NoBridge,
)


class RefusingBridge:
    """A daemon that refuses every call, as it refuses a session what it may not do."""

    session_token = "unused"
    callback = None

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        raise Forbidden(f"{method} is not for sandboxes")


async def run(executor: WasmPythonExecutor, code: str, **limits: Any) -> Outcome:
    with trio.fail_after(WAIT_S):
        outcome = await executor.run(Job("ex_attack", "python", code, Limits(**limits)), NoBridge())
        assert (await executor.run(Job("ex_next", "python", "1", Limits()), NoBridge())).result == 1
    return outcome


@pytest.mark.parametrize(
    ("code", "error_type"),
    [
        # files: the execution's own directory and the read-only library, nothing else
        ("open('/etc/passwd').read()", "FileNotFoundError"),
        ("import os\nos.listdir('/')", "FileNotFoundError"),
        ("import os\nos.listdir('..')", "PermissionError"),
        ("open('/tmp/../etc/passwd').read()", "PermissionError"),
        ("import os\nos.open('/dev/zero', os.O_RDONLY)", "FileNotFoundError"),
        ("import os\nos.stat('/')", "FileNotFoundError"),
        ("import os\nos.mkdir('/conduit-escape')", "FileNotFoundError"),
        ("import os\nos.chdir('/')", "FileNotFoundError"),
        ("open('/proc/self/environ', 'rb').read()", "FileNotFoundError"),
        ("import os\nos.symlink('/etc/passwd', 'x')\nopen('x').read()", "PermissionError"),
        ("import os\nos.symlink('..', 'up')\nos.listdir('up')", "PermissionError"),
        ("open('/python/os.py', 'a').write('x')", "PermissionError"),
        ("import os\nos.rename('/python/os.py', '/tmp/os.py')", "PermissionError"),
        ("import os\nos.remove('/python/json/__init__.py')", "PermissionError"),
        # network: the modules import, and reach nothing
        ("import socket\nsocket.create_connection(('127.0.0.1', 22))", "gaierror"),
        ("import socket\nsocket.socket().connect(('127.0.0.1', 22))", "PermissionError"),
        ("import urllib.request\nurllib.request.urlopen('http://127.0.0.1:1/')", "URLError"),
        (
            "import http.client\nhttp.client.HTTPConnection('127.0.0.1', 1).request('GET', '')",
            "gaierror",
        ),
        ("import ssl", "ModuleNotFoundError"),
        ("import _socket\n_socket.socket().connect(('127.0.0.1', 22))", "PermissionError"),
        ("import _socket\ns = _socket.socket()\ns.settimeout(5)\ns.accept()", "PermissionError"),
        # processes and threads
        ("import subprocess\nsubprocess.run(['id'])", "OSError"),
        ("import os\nos.system('id')", "AttributeError"),
        ("import os\nos.fork()", "AttributeError"),
        ("import os\nos.execv('/bin/sh', ['sh'])", "AttributeError"),
        ("import os\nos.kill(1, 9)", "AttributeError"),
        ("import os\nos.posix_spawn('/bin/sh', ['sh'], {})", "AttributeError"),
        ("import sys\nsys.modules['os'].fork()", "AttributeError"),
        ("import multiprocessing\nmultiprocessing.Process(target=print).start()", "AttributeError"),
        ("import threading\nthreading.Thread(target=print).start()", "RuntimeError"),
        ("import ctypes", "ModuleNotFoundError"),
        # native code and imports from elsewhere
        ("import _imp\n_imp.create_dynamic(None)", "AttributeError"),
        ("import sys\nsys.path.insert(0, '/')\nimport etc", "ModuleNotFoundError"),
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
        ("while True: pass", *TIMES_OUT),
        ("x = []\nwhile True: x.append(bytearray(1 << 20))", *RUNS_OUT_OF_MEMORY),
        ("b = bytearray(1 << 30)", *RUNS_OUT_OF_MEMORY),
        ("while True: print('x' * 1000)", *FLOODS_OUTPUT),
        (
            "import sys\nwhile True: sys.stderr.write('e\\n')",
            {"output_lines": 100},
            Status.OUTPUT_LIMIT,
        ),
        ("sum(range(10**12))", *TIMES_OUT),
        ("import re\nre.match('(a+)+$', 'a' * 64 + 'b')", *TIMES_OUT),
        ("x = 10 ** 10 ** 8", *TIMES_OUT),
        ("def f():\n    while True: yield\nfor _ in f(): pass", *TIMES_OUT),
        ("x = 'x' * (1 << 30)", *RUNS_OUT_OF_MEMORY),
        ("x = [0] * (1 << 28)", *RUNS_OUT_OF_MEMORY),
        ("while True: print('x' * 10**5)", *FLOODS_OUTPUT),
        ("import os\nwhile True: os.write(1, b'x' * 8192)", *FLOODS_OUTPUT),
        ("'x' * (2 << 20)", {}, Status.ERROR),  # larger than the result may be
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
    outcome = await run(wasm, "import time\nprint('zz')\ntime.sleep(3)", timeout_ms=1000)
    assert outcome.status is Status.TIMEOUT, outcome
    assert outcome.stdout == "zz\n"
    assert trio.current_time() - started < WAIT_S
    # The sleep itself woke at the deadline: no thread was left behind.
    assert wasm.info().pool["lingering_threads"] == 0


# Every way found to wait past the deadline without the program runner's own bound on
# `time.sleep`. The host ends each wait by the deadline (`wasm_clock`), so each is a
# timeout and leaves no runner behind; those the guest cannot even express are refused.
SAVED_SLEEP = "import sys\nsleep = sys.modules['python_program']._SLEEP\n"
BLOCKING_ATTEMPTS = [
    (SAVED_SLEEP + "sleep(30)", None),
    (SAVED_SLEEP + "while True: sleep(0.001)", None),
    (SAVED_SLEEP + "try:\n    sleep(30)\nfinally:\n    sleep(30)", None),
    ("import importlib, time\nimportlib.reload(time).sleep(30)", None),
    ("import sys\ndel sys.modules['time']\nimport time\ntime.sleep(30)", None),
    ("import time, sys\ntime.sleep = sys.modules['python_program']._SLEEP\ntime.sleep(30)", None),
    (
        "import sys\npp = sys.modules['python_program']\npp.bound_sleep(10**9)\n"
        "import time\ntime.sleep(30)",
        None,
    ),
    ("import sys, time\nsys.modules['python_program'].SLEEP_SLACK_S = 10**9\ntime.sleep(30)", None),
    ("import time\ntime.sleep(float('inf'))", None),
    ("import time\ntime.sleep(10**9)", None),
    ("import select\nselect.select([], [], [], 30)", None),
    ("import select\nwhile True: select.select([0], [], [], 30)", None),
    ("import select\nselect.poll().poll(30_000)", None),
    (
        "import _thread\nlock = _thread.allocate_lock()\nlock.acquire()\n"
        "while not lock.acquire(True, 30): pass",
        None,
    ),
    ("import os\nwhile True: os.read(0, 1)", None),
    ("import asyncio\nasyncio.run(asyncio.sleep(30))", None),
    ("import selectors\nselectors.DefaultSelector().select(30)", None),
    ("import signal\nsignal.pause()", "AttributeError"),
    ("import time\ntime.sleep.__closure__[1].cell_contents(30)", "TypeError"),
]


@pytest.mark.parametrize(("code", "refused"), BLOCKING_ATTEMPTS)
async def test_waits_past_the_deadline_end_at_it_on_the_host(
    wasm: WasmPythonExecutor, code: str, refused: str | None
) -> None:
    # A refusal comes at once, after an import that may take a busy machine longer
    # than the 300 ms the waits are given.
    outcome = await run(wasm, code, timeout_ms=300 if refused is None else 10_000)
    if refused is None:
        assert outcome.status is Status.TIMEOUT, outcome
    else:
        assert outcome.status is Status.ERROR, outcome
        assert outcome.error is not None and outcome.error.type == refused, outcome.error
    # The guest's thread is back once its wait ends at the deadline: within seconds
    # under any load, never the 30 s the program asked for.
    with trio.fail_after(BACK_WITHIN_S):
        while wasm.info().pool["lingering_threads"]:
            await trio.sleep(0.05)


# How long a guest's thread may take to come back from a wait the host ended, on a
# loaded machine: far under the waits the programs ask for.
BACK_WITHIN_S = 10


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


def assert_valid_text(outcome: Outcome) -> None:
    """The outcome as the daemon would send it: JSON in valid UTF-8."""
    error = outcome.error
    fields = [outcome.result, outcome.stdout, outcome.stderr]
    fields += [error.type, error.message, error.traceback] if error is not None else []
    json.dumps(fields, ensure_ascii=False).encode("utf-8")


# Text that is not Unicode (lone surrogates, invalid UTF-8) in what a program returns,
# raises or writes: it comes back replaced by U+FFFD, never as an exception out of run().
UNICODE_ATTEMPTS = [
    ('raise ValueError("\\ud800")', Status.ERROR, lambda o: o.error.message == "\ufffd"),
    ('"\\ud800"', Status.OK, lambda o: o.result == "\ufffd"),
    ('{"\\udfff": ["\\ud800x"]}', Status.OK, lambda o: o.result == {"\ufffd": ["\ufffdx"]}),
    ('print("\\ud800")', Status.ERROR, lambda o: o.error.type == "UnicodeEncodeError"),
    (
        "import sys\nsys.stdout.buffer.write(b'\\xed\\xa0\\x80\\xff')",
        Status.OK,
        lambda o: o.stdout == "\ufffd" * 4,
    ),
    (
        'class E(Exception): pass\nE.__name__ = "\\ud800"\nraise E("\\udc00")',
        Status.ERROR,
        lambda o: "\ud800" not in o.error.type,
    ),
    (
        "import sys\nsys.stdout.reconfigure(errors='surrogatepass')\nprint('\\ud800')",
        Status.OK,
        lambda o: "\ufffd" in o.stdout,
    ),
    ("import sys\nsys.set_int_max_str_digits(0)\n10 ** 5000", Status.CRASHED, lambda o: True),
]


@pytest.mark.parametrize(("code", "status", "check"), UNICODE_ATTEMPTS)
async def test_text_that_is_not_unicode_comes_back_replaced(
    wasm: WasmPythonExecutor, code: str, status: Status, check: Any
) -> None:
    outcome = await run(wasm, code)
    assert outcome.status is status, outcome
    assert check(outcome), outcome
    assert_valid_text(outcome)


# A program that replaces the shim's own helpers forges its answer: whatever it makes
# of it, the executor reports an outcome and raises nothing.
FORGED_ANSWERS = [
    ("import json\njson.dumps = lambda *a, **k: '{\"result\": 1'\n1", Status.CRASHED),
    ("import json\njson.dumps = lambda *a, **k: '[1]'\n1", Status.CRASHED),
    ("import json\njson.dumps = lambda *a, **k: 5\n1", Status.ERROR),
    ('import json\njson.dumps = lambda *a, **k: \'{"result": "\\ud800"}\'\n1', Status.OK),
    (
        'import json\njson.dumps = lambda *a, **k: \'{"error": {"type": [1], "message": {}}}\'\n1',
        Status.ERROR,
    ),
    ("import json\njson.dumps = lambda *a, **k: '{\"result\": NaN}'\n1", Status.OK),
    ("import json\njson.dumps = lambda *a, **k: '[' * 100000\n1", Status.CRASHED),
]


@pytest.mark.parametrize(("code", "status"), FORGED_ANSWERS)
async def test_a_forged_answer_is_reported_not_raised(
    wasm: WasmPythonExecutor, code: str, status: Status
) -> None:
    outcome = await run(wasm, code)
    assert outcome.status is status, outcome
    assert outcome.result != 1, outcome  # the program's real result never got through
    assert_valid_text(outcome)


# The raw `host-call` with what no SDK would send: each is answered with an error the
# program can read, and the executor goes on.
RAW_HOST_CALLS = [
    ("tools/call", "not json", -32700),
    ("tools/call", "[1, 2]", -32602),
    ("tools/call", '{"name": NaN}', Forbidden.code),
    ("tools/call", '{"name": "\\ud800"}', Forbidden.code),
    ("tools/call", "[" * 100_000, -32700),
    ("x" * 100_000, "{}", Forbidden.code),
]


@pytest.mark.parametrize(("method", "params", "code"), RAW_HOST_CALLS)
async def test_raw_host_calls_with_malformed_params_are_answered_with_errors(
    wasm: WasmPythonExecutor, method: str, params: str, code: int
) -> None:
    program = "import json, wit_world\njson.loads(wit_world.host_call(inputs[0], inputs[1]))"
    with trio.fail_after(WAIT_S):
        job = Job("ex_forged", "python", program, Limits(), inputs=[method, params])
        outcome = await wasm.run(job, RefusingBridge())
    assert outcome.status is Status.OK, outcome
    assert outcome.result["error"]["code"] == code, outcome.result
    assert (await run(wasm, "1 + 1")).result == 2


# What the soak below runs, round after round: every blocking attempt that could hold
# a runner if the host did not end it.
SOAK_ATTEMPTS = [code for code, refused in BLOCKING_ATTEMPTS if refused is None]
SOAK_ROUNDS = 100
# Generous: the store pool, compiled code and allocator arenas settle in the first
# rounds; leaked stores would hold far more (each at least the guest's base memory).
RSS_GROWTH_LIMIT_BYTES = 64 << 20


def rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def test_a_hundred_attempts_to_block_leave_the_executor_as_it_was(
    wasm: WasmPythonExecutor,
) -> None:
    for _ in range(3):  # the process's memory settles before the baseline is taken
        await run(wasm, SOAK_ATTEMPTS[0], timeout_ms=50)
    baseline = rss_bytes()

    # As many at once as the executor runs: each starts its clock when it can run,
    # so each really reaches its blocking call.
    running = trio.CapacityLimiter(CONCURRENT_EXECUTIONS)

    async def attempt(index: int) -> None:
        code = SOAK_ATTEMPTS[index % len(SOAK_ATTEMPTS)]
        async with running:
            job = Job(f"ex_block_{index}", "python", code, Limits(timeout_ms=100))
            outcome = await wasm.run(job, NoBridge())
        assert outcome.status is Status.TIMEOUT, (code, outcome)

    with trio.fail_after(WAIT_S * 10):
        async with trio.open_nursery() as nursery:
            for index in range(SOAK_ROUNDS):
                nursery.start_soon(attempt, index)
    # A runner given up on at its timeout finishes its guest's trap after the answer
    # went out: on a loaded machine the last of them may still be on its way back.
    with trio.fail_after(WAIT_S):
        while wasm.info().pool["lingering_threads"]:
            await trio.sleep(0.05)
    assert wasm.info().pool["runner_threads"] == RUNNERS
    with trio.fail_after(WAIT_S):
        outcome = await wasm.run(Job("ex_after", "python", "1 + 1", Limits()), NoBridge())
    assert outcome.status is Status.OK and outcome.result == 2, outcome
    assert rss_bytes() - baseline < RSS_GROWTH_LIMIT_BYTES
