"""The operating-system sandbox under Deno's workers, from the attacker's side.

The programs here run with every Deno permission granted (`deno run -A`), in the
sandbox a worker gets (`OsSandbox.spawn`, with a worker's confinement): as if Deno's
permission checks were gone. What still stops them is the sandbox alone. Then the
Deno executor itself: its workers are inside it, and `executors.os_sandbox` decides
what happens where it cannot be made.
"""

from __future__ import annotations

import json
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio._core._thread_cache as thread_cache

from conduit.executors import os_sandbox
from conduit.executors._trio_threads import keep_worker_threads
from conduit.executors.base import Job
from conduit.executors.deno import DenoExecutor, find_deno
from conduit.executors.os_sandbox import (
    BLOCKED_SYSCALLS,
    Confinement,
    OsSandbox,
    find_bwrap,
    run_confined,
    runtime_returncode,
    seccomp_program,
    worker_run,
)
from conduit.executors.process import sandbox_process_options
from tests.processes import deno_children, namespaced_pids
from tests.sandboxes import WAIT_S, NoBridge, wait_for

SHIMS = Path(__file__).resolve().parents[2] / "shims"

# What the program tries, each answered "ok: ..." or "<error name>: ...".
ATTACK = Path(__file__).resolve().parents[1] / "fixtures" / "os_sandbox_attack.js"

EPERM = 1


@pytest.fixture(scope="module")
def sandbox() -> OsSandbox:
    bwrap, deno = find_bwrap(), find_deno()
    assert bwrap is not None, "bubblewrap is needed: apt install bubblewrap"
    assert deno is not None
    return OsSandbox(bwrap, deno, seccomp_program())


@pytest.fixture
def listening(short_dir: Path) -> Iterator[tuple[int, Path, Path]]:
    """A TCP port on the host's loopback, the callback socket and a socket beside it
    (the daemon's client socket, say), all listening."""
    tcp = socket.create_server(("127.0.0.1", 0))
    callback, neighbour = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
    callback.bind(str(short_dir / "sandbox.sock"))
    neighbour.bind(str(short_dir / "conduit.sock"))
    for server in (callback, neighbour):
        server.listen()
    try:
        yield tcp.getsockname()[1], short_dir / "sandbox.sock", short_dir / "conduit.sock"
    finally:
        for server in (tcp, callback, neighbour):
            server.close()


def confinement_of(worker: str, tmp_path: Path, callback: Path) -> Confinement:
    """What a `worker` ("deno" or "pyodide") process is given (as `DenoExecutor` and
    `PyodideExecutor` confine theirs): a Deno worker its working directory read-write,
    a Pyodide one its files (here, a directory standing for them) read-only."""
    workdir, deno_dir = tmp_path / "work", tmp_path / "deno-dir"
    workdir.mkdir()
    deno_dir.mkdir()
    if worker == "deno":
        return Confinement(workdir, (SHIMS,), (deno_dir, workdir), (callback,))
    pyodide_files = tmp_path / "pyodide"
    pyodide_files.mkdir()
    return Confinement(workdir, (workdir, SHIMS, pyodide_files), (deno_dir,), (callback,))


async def attack_findings(
    sandbox: OsSandbox, worker: str, tmp_path: Path, *args: str
) -> dict[str, Any]:
    """ATTACK's findings, run as a worker is: with -A, in a worker's confinement."""
    confinement = confinement_of(worker, tmp_path, Path(args[3]))
    workdir, deno_dir = confinement.cwd, tmp_path / "deno-dir"
    (workdir / "attack.js").write_text(ATTACK.read_text())
    command = [sandbox.runtime, "run", "-A", "--no-prompt", "attack.js", *args]
    env = {"DENO_DIR": str(deno_dir), "NO_COLOR": "1", "HOME": str(Path.home())}
    with trio.fail_after(WAIT_S):
        done = await run_confined(sandbox, command, confinement, env)
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("worker", ["deno", "pyodide"])
async def test_a_program_with_every_permission_still_reaches_nothing(
    sandbox: OsSandbox, worker: str, tmp_path: Path, listening: tuple[int, Path, Path]
) -> None:
    state = tmp_path / "daemon-state"
    state.mkdir()
    (state / "secret").write_text("the master token")
    port, callback, neighbour = listening
    home = str(Path.home())
    token = secrets.token_hex(8)
    planted = [Path(f"{where}/conduit-planted-{token}") for where in ("/etc", "", "/usr", "/tmp")]
    try:
        places = (str(state), home, str(port), str(callback), str(neighbour), token)
        tried = await attack_findings(sandbox, worker, tmp_path, *places)
        assert not [path for path in planted if path.exists()]
    finally:
        for path in planted:
            path.unlink(missing_ok=True)

    # The daemon's files, home and the system's secrets are not there at all.
    for name in ("read state", "list home", "read shadow", "read passwd"):
        assert tried[name].startswith("NotFound"), (name, tried[name])
    # Nothing outside the private /tmp (and the working directory) can be written.
    for name in ("write /etc", "write /", "write /usr"):
        assert not tried[name].startswith("ok"), (name, tried[name])
    assert tried["write tmp"] == 'ok: "written"'  # its own /tmp, gone with it
    # Its own PID namespace: it is PID 1 and sees no other process.
    assert (tried["pid"], tried["processes"]) == ("ok: 1", 'ok: ["1"]')
    assert tried["hostname"] == 'ok: "sandbox"'  # not the host's name
    # Its own network namespace: loopback only, and the host's loopback is not it.
    assert tried["interfaces"] == 'ok: ["lo"]'
    assert tried["tcp to the host"].startswith("ConnectionRefused"), tried["tcp to the host"]
    # No program to run, and of the daemon's sockets only the callback.
    assert tried["shell"].startswith("NotFound"), tried["shell"]
    assert tried["neighbour socket"].startswith("NotFound"), tried["neighbour socket"]
    assert tried["callback"] == 'ok: "connected"'
    # The seccomp filter: no tracing, no new namespaces, no mounts.
    for name in ("ptrace", "unshare user", "mount"):
        assert tried[name] == f"ok: [-1,{EPERM}]", (name, tried[name])


def test_the_filter_names_what_a_runtime_never_needs() -> None:
    for name in ("ptrace", "mount", "keyctl", "bpf", "perf_event_open", "userfaultfd"):
        assert name in BLOCKED_SYSCALLS
    assert {"init_module", "finit_module", "unshare", "setns"} <= set(BLOCKED_SYSCALLS)
    assert seccomp_program()  # libseccomp made a program of it


def test_a_signal_that_ended_the_runtime_reads_as_one() -> None:
    assert runtime_returncode(None) is None
    assert runtime_returncode(0) == 0
    assert runtime_returncode(3) == 3
    assert runtime_returncode(128 + 9) == -9  # SIGKILL, as trio.Process says it
    assert runtime_returncode(128 + 5) == -5  # V8's out-of-memory trap


# ---- its life --------------------------------------------------------------------------

# Trio ends a worker thread idle this long (10 s by default).
SHORT_IDLE_S = 0.3


async def alive_after(sandbox: OsSandbox, tmp_path: Path, wait_s: float) -> bool:
    """Whether a sandboxed `sleep` started through Trio (from one of its worker threads,
    as workers are) still runs `wait_s` later, its starting thread idle meanwhile."""
    spawn = sandbox.spawn(["sleep", "60"], Confinement(cwd=tmp_path, read_only=(tmp_path,)))
    options = sandbox_process_options(cwd=tmp_path, env={})
    async with trio.open_nursery() as nursery:
        process = await nursery.start(worker_run(["sleep", "60"], spawn, options))
        try:
            await spawn.child(process)
        finally:
            spawn.close()
        with trio.move_on_after(wait_s):
            await process.wait()
        alive = process.returncode is None
        nursery.cancel_scope.cancel()
    return alive


async def test_a_worker_outlives_the_idle_thread_that_started_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel kills bwrap (`--die-with-parent`) when the thread that started it
    ends, and Trio ends idle threads: the sandbox keeps them (`_trio_threads`)."""
    monkeypatch.setattr(thread_cache, "IDLE_TIMEOUT", SHORT_IDLE_S)
    bwrap = find_bwrap()
    assert bwrap is not None
    sandbox = OsSandbox(bwrap, "/bin/sleep", seccomp_program())
    assert "--die-with-parent" in sandbox.spawn(["sleep"], Confinement(cwd=tmp_path)).argv
    assert await alive_after(sandbox, tmp_path, 10 * SHORT_IDLE_S)


async def test_where_trio_threads_cannot_be_kept_bwrap_outlives_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(thread_cache, "IDLE_TIMEOUT", SHORT_IDLE_S)
    monkeypatch.setattr(os_sandbox, "keep_worker_threads", lambda: False)
    bwrap = find_bwrap()
    assert bwrap is not None
    sandbox = OsSandbox(bwrap, "/bin/sleep", seccomp_program())
    assert "--die-with-parent" not in sandbox.spawn(["sleep"], Confinement(cwd=tmp_path)).argv
    assert thread_cache.IDLE_TIMEOUT == SHORT_IDLE_S  # threads still end
    assert await alive_after(sandbox, tmp_path, 10 * SHORT_IDLE_S)


def test_trio_threads_are_kept_where_trio_allows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(thread_cache, "IDLE_TIMEOUT", 10)
    assert keep_worker_threads()  # the Trio the daemon pins has the setting
    assert thread_cache.IDLE_TIMEOUT == -1
    monkeypatch.delattr(thread_cache, "IDLE_TIMEOUT")
    assert not keep_worker_threads()


# ---- the Deno executor ---------------------------------------------------------------


async def start(nursery: trio.Nursery, tmp_path: Path, **options: Any) -> DenoExecutor:
    executor = DenoExecutor(cache_dir=tmp_path / "deno", pool_size=1, **options)
    with trio.fail_after(WAIT_S):
        await nursery.start(executor.serve)
    return executor


async def pid_of_a_program(executor: DenoExecutor) -> Any:
    with trio.fail_after(WAIT_S):
        outcome = await executor.run(Job("ex_pid", "typescript", "Deno.pid"), NoBridge())
    return outcome.result


async def test_every_worker_runs_inside_the_sandbox(nursery: trio.Nursery, tmp_path: Path) -> None:
    executor = await start(nursery, tmp_path)
    assert executor.info().pool["os_sandbox"] == "bubblewrap"  # type: ignore[index]
    assert await pid_of_a_program(executor) == 1
    # Seen from the host: each worker's Deno is PID 1 of a namespace of its own.
    await wait_for(lambda: executor.info().pool["idle"] == 1)  # type: ignore[index]
    workers = deno_children()
    assert workers
    for pid in workers:
        assert namespaced_pids(pid)[1:] == [1]
        status = dict(
            line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        )
        # No new privileges, a seccomp filter (mode 2), no capabilities at all.
        assert (status["NoNewPrivs"], status["Seccomp"]) == ("1", "2")
        assert int(status["CapEff"], 16) == int(status["CapBnd"], 16) == 0


async def test_without_the_sandbox_a_required_one_makes_the_executor_unavailable(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    executor = await start(nursery, tmp_path, bwrap=str(tmp_path / "no-bwrap"))
    info = executor.info()
    assert not info.available
    assert info.reason is not None
    assert "bubblewrap (bwrap) was not found" in info.reason
    assert 'executors.os_sandbox = "optional"' in info.reason


async def test_an_optional_sandbox_runs_under_denos_permissions_alone_and_says_so(
    nursery: trio.Nursery, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    executor = await start(
        nursery, tmp_path, bwrap=str(tmp_path / "no-bwrap"), os_sandbox="optional"
    )
    info = executor.info()
    assert info.available
    assert info.pool["os_sandbox"].startswith("none: bubblewrap (bwrap) was not found")  # type: ignore[index]
    assert await pid_of_a_program(executor) != 1
    assert any("Deno's permissions alone" in r.getMessage() for r in caplog.records)
