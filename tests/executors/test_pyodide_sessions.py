"""Pyodide sessions with real Deno and real Pyodide: what a step defines is there for
the next, a step that could not end well starts the session afresh, and nothing of a
session reaches a fresh execution, another session, or outlives its close.

Slow, so the module's tests share one executor (served in a thread of its own, as in
test_pyodide.py), which holds at most two sessions.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.core.errors import Overloaded, SandboxCrashed
from conduit.executors.base import Job, Limits, Outcome, SessionSpec, Status, StopSignal
from conduit.executors.pyodide import PyodideExecutor
from conduit.executors.pyodide_sessions import PyodideSession
from tests.executors.test_pyodide import pyodide_workers
from tests.processes import namespaced_pids
from tests.sandboxes import LOAD_WAIT_S, WAIT_S, NoBridge, start_pyodide
from tests.served import Served, serving_in_a_thread

pytestmark = [pytest.mark.slow, pytest.mark.no_wasm]

MAX_SESSIONS = 2


class Sessions:
    """The shared executor, and its sessions, driven from a test's own Trio run."""

    def __init__(self, served: Served[PyodideExecutor]) -> None:
        self._served = served

    async def open(self, name: str, memory_mb: int = 128) -> PyodideSession:
        spec = SessionSpec(f"se_{name}", "python", memory_mb)
        opened = await self._served.call(self._served.value.open_session, spec)
        assert isinstance(opened, PyodideSession)
        return opened

    async def step(
        self, session: PyodideSession, code: str, stop: StopSignal | None = None, **limits: Any
    ) -> Outcome:
        with trio.fail_after(LOAD_WAIT_S):
            job = Job("ex_session", "python", code, Limits(**limits), stop=stop or StopSignal())
            return await self._served.call(session.run, job, NoBridge())

    async def ok(self, session: PyodideSession, code: str) -> Any:
        """The result of a step that must end well and keep the session."""
        done = await self.step(session, code)
        assert (done.status, done.session_reset) == (Status.OK, False), done
        return done.result

    async def close(self, session: PyodideSession) -> None:
        await self._served.call(session.aclose)

    async def run(self, code: str) -> Outcome:
        with trio.fail_after(LOAD_WAIT_S):
            job = Job("ex_fresh", "python", code)
            return await self._served.call(self._served.value.run, job, NoBridge())

    async def process_of(self, session: PyodideSession) -> int:
        """The pid of the worker process `session` holds."""

        def pid() -> int:
            assert session._host is not None, session
            return session._host.process.pid

        return await self._served.call_sync(pid)

    async def runtime_of(self, session: PyodideSession) -> int:
        """The pid of the Deno process inside the sandbox of the worker `session` holds."""

        def pid() -> int:
            assert session._host is not None, session
            return session._host.limited.pid

        return await self._served.call_sync(pid)

    async def counts(self) -> dict[str, Any]:
        """The executor's count of sessions and of the processes they hold."""
        info = await self._served.call_sync(self._served.value.info)
        assert info.pool is not None
        return dict(info.pool["sessions"])


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory, pyodide_install: Path) -> Iterator[Sessions]:
    cache_dir = tmp_path_factory.mktemp("pyodide-sessions")

    start = partial(
        start_pyodide, cache_dir=cache_dir, install_dir=pyodide_install, max_sessions=MAX_SESSIONS
    )
    with serving_in_a_thread(start) as served:
        yield Sessions(served)


@pytest.fixture
async def session(sessions: Sessions) -> AsyncIterator[PyodideSession]:
    opened = await sessions.open("one")
    yield opened
    await sessions.close(opened)


async def test_the_worker_runs_inside_the_operating_system_sandbox(
    sessions: Sessions, session: PyodideSession
) -> None:
    assert (await sessions.step(session, "1")).result == 1
    info = await sessions._served.call_sync(sessions._served.value.info)
    assert info.pool["os_sandbox"] == "bubblewrap"
    runtime = await sessions.runtime_of(session)
    assert runtime != await sessions.process_of(session)  # bwrap's child, not bwrap
    assert namespaced_pids(runtime) == [runtime, 1]  # PID 1 of a namespace of its own


async def test_variables_are_kept_from_step_to_step(
    sessions: Sessions, session: PyodideSession
) -> None:
    assert await sessions.ok(session, "x = 1") is None
    assert await sessions.ok(session, "x += 1\nx") == 2
    # A step without a last expression has no result, not the last step's.
    assert await sessions.ok(session, "y = x") is None


async def test_functions_and_imports_are_kept(sessions: Sessions, session: PyodideSession) -> None:
    await sessions.ok(session, "import json\ndef double(v):\n    return v * 2")
    assert await sessions.ok(session, "json.dumps({'n': double(21)})") == '{"n": 42}'


async def test_files_are_kept(sessions: Sessions, session: PyodideSession) -> None:
    await sessions.ok(session, "with open('/tmp/notes.txt', 'w') as f:\n    f.write('kept')")
    assert await sessions.ok(session, "open('/tmp/notes.txt').read()") == "kept"


async def test_an_exception_keeps_the_session(sessions: Sessions, session: PyodideSession) -> None:
    await sessions.ok(session, "x = 1")
    failed = await sessions.step(session, "x = 2\nraise ValueError('no')")
    assert (failed.status, failed.session_reset) == (Status.ERROR, False), failed
    assert failed.error is not None and failed.error.type == "ValueError"
    assert await sessions.ok(session, "x") == 2


async def test_a_timeout_resets_the_session(sessions: Sessions, session: PyodideSession) -> None:
    await sessions.ok(session, "x = 1")
    spin = "print('spin', flush=True)\nwhile True: pass"
    spun = await sessions.step(session, spin, timeout_ms=1000)
    assert (spun.status, spun.stdout, spun.session_reset) == (Status.TIMEOUT, "spin\n", True)
    assert (await sessions.counts())["processes"] == 0  # the runaway's process is gone
    # The next step runs afresh, and the session goes on from there.
    assert await sessions.ok(session, "'x' in globals()") is False
    await sessions.ok(session, "x = 'new'")
    assert await sessions.ok(session, "x") == "new"


async def test_a_stopped_or_flooding_step_resets_the_session(
    sessions: Sessions, session: PyodideSession
) -> None:
    await sessions.ok(session, "x = 1")
    stop = StopSignal()
    stop.set()  # before the step: the daemon stopped it as it began
    stopped = await sessions.step(session, "x", stop=stop)
    assert (stopped.status, stopped.session_reset) == (Status.CANCELLED, True), stopped
    await sessions.ok(session, "x = 1")
    flood = await sessions.step(session, "while True: print('x' * 99)", output_bytes=10_000)
    assert (flood.status, flood.session_reset) == (Status.OUTPUT_LIMIT, True), flood
    assert len(flood.stdout) == 10_000
    assert await sessions.ok(session, "'x' in globals()") is False


async def test_a_process_lost_between_steps_resets_the_session(
    sessions: Sessions, session: PyodideSession
) -> None:
    await sessions.ok(session, "x = 1")
    pid = await sessions.process_of(session)
    os.kill(pid, signal.SIGKILL)
    with trio.fail_after(WAIT_S):
        while pid in pyodide_workers():
            await trio.sleep(0.02)
    lost = await sessions.step(session, "x")
    assert (lost.status, lost.session_reset) == (Status.CRASHED, True), lost
    assert await sessions.ok(session, "'x' in globals()") is False


async def test_the_memory_limit_holds_across_steps_and_resets(sessions: Sessions) -> None:
    """128 MB for the whole session: 120 MB in one step fits, twice does not; the step
    that hits the limit resets the session."""
    session = await sessions.open("memory", memory_mb=128)
    try:
        await sessions.ok(session, "first = bytearray(120 << 20)\nlen(first) >> 20")
        second = await sessions.step(session, "second = bytearray(120 << 20)")
        assert (second.status, second.session_reset) == (Status.MEMORY_LIMIT, True), second
        assert await sessions.ok(session, "'first' in globals()") is False
        # Fresh, the same step fits again.
        assert await sessions.ok(session, "again = bytearray(120 << 20)\n'fits'") == "fits"
    finally:
        await sessions.close(session)


async def test_sessions_are_isolated(sessions: Sessions) -> None:
    first = await sessions.open("first")
    second = await sessions.open("second")
    try:
        await sessions.ok(first, "x = 'first'\nopen('/tmp/mine.txt', 'w').write('first')")
        looked = "import os\n['x' in globals(), os.path.exists('/tmp/mine.txt')]"
        assert await sessions.ok(second, looked) == [False, False]
        await sessions.ok(second, "x = 'second'")
        assert await sessions.ok(first, "x, open('/tmp/mine.txt').read()") == ["first", "first"]
        assert await sessions.ok(second, "x") == "second"
    finally:
        await sessions.close(first)
        await sessions.close(second)


# Leaves something everywhere a program can, in Python and in JavaScript.
PLANT = """
import builtins, sys, js
x = 'planted'
builtins.PLANTED = 1
sys.modules['planted'] = sys
open('/tmp/planted.txt', 'w').write('planted')
js.globalThis.PLANTED = 1
"""

LOOK = """
import builtins, os, sys, js
[
    'x' in globals(),
    hasattr(builtins, 'PLANTED'),
    'planted' in sys.modules,
    os.path.exists('/tmp/planted.txt'),
    str(js.eval('typeof globalThis.PLANTED')),
]
"""


async def test_a_fresh_execution_sees_nothing_of_a_session(
    sessions: Sessions, session: PyodideSession
) -> None:
    await sessions.ok(session, PLANT)
    fresh = await sessions.run(LOOK)
    assert (fresh.status, fresh.result) == (Status.OK, [False, False, False, False, "undefined"])
    assert fresh.session_reset is False
    # Nor does the fresh execution change the session.
    assert await sessions.ok(session, LOOK) == [True, True, True, True, "number"]


async def test_aclose_frees_the_interpreter_and_the_cap_holds(sessions: Sessions) -> None:
    first = await sessions.open("first")
    assert await sessions.counts() == {"open": 1, "processes": 0, "max": MAX_SESSIONS}
    await sessions.ok(first, "x = 1")
    assert await sessions.counts() == {"open": 1, "processes": 1, "max": MAX_SESSIONS}
    pid = await sessions.process_of(first)
    assert pid in pyodide_workers()
    second = await sessions.open("second")
    with pytest.raises(Overloaded):
        await sessions.open("third")
    await sessions.close(first)
    await sessions.close(first)  # idempotent
    assert await sessions.counts() == {"open": 1, "processes": 0, "max": MAX_SESSIONS}
    with pytest.raises(SandboxCrashed):
        await sessions.step(first, "x")
    with trio.fail_after(WAIT_S):
        while pid in pyodide_workers():  # killed, and reaped by its task
            await trio.sleep(0.02)
    third = await sessions.open("third")  # room again
    await sessions.close(second)
    await sessions.close(third)
    assert (await sessions.counts())["open"] == 0
