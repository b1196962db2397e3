"""systemd integration against real sockets, real fds and real child processes.

Socket activation is tested the way systemd does it: the sockets are moved onto fds 3, 4,
... in a child, ``LISTEN_PID`` is set to that child's pid, and the child ``exec``s the
program under test (exec keeps the pid). The program reports what ``listen_fds()`` saw as
JSON on stdout. Notifications go to a real AF_UNIX datagram socket that stands in for
PID 1's notify socket.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import secrets
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.core.errors import ConfigError
from conduit.daemon.systemd import (
    Notifier,
    listen_fds,
    serve_watchdog,
    watchdog_interval_s,
)

# Bounds every wait in this file: generous for a loaded CI machine, short enough to fail.
WAIT_S = 30.0

LISTEN_VARS = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")
SYSTEMD_VARS = (*LISTEN_VARS, "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")

# Plays systemd between fork and exec: argv is the fds to pass, "self" or "keep" for
# LISTEN_PID, and the code of the program under test.
LAUNCHER = """
import fcntl, os, sys
passed = [int(fd) for fd in sys.argv[1].split(",") if fd]
# Park every fd above the target range first, so moving one onto 3 cannot clobber
# another passed fd that already sits at 3 or 4.
parked = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in passed]
for fd in passed:
    os.close(fd)
for index, fd in enumerate(parked):
    os.dup2(fd, 3 + index)  # inheritable, as systemd leaves them
    os.close(fd)
if sys.argv[2] == "self":
    os.environ["LISTEN_PID"] = str(os.getpid())
os.execv(sys.executable, [sys.executable, "-c", sys.argv[3]])
"""

# The program under test: adopts the sockets and reports, as JSON, what it got, which fds
# are still inheritable, and what its environment and its own child's look like.
REPORTER = """
import json, os, subprocess, sys
from conduit.core.errors import ConduitError
from conduit.daemon.systemd import listen_fds

VARS = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")
count = int(os.environ["TEST_FD_COUNT"])
report = {}
try:
    inherited = listen_fds()
except ConduitError as exc:
    report["error"] = {"type": type(exc).__name__, "message": str(exc)}
    inherited = []
report["sockets"] = [
    {"fd": s.fd, "name": s.name, "kind": s.kind.value, "address": s.address}
    for s in inherited
]

def inheritable(fd):
    try:
        return os.get_inheritable(fd)
    except OSError:
        return "closed"

report["inheritable"] = {fd: inheritable(fd) for fd in range(3, 3 + count)}
report["environ"] = {name: os.environ.get(name) for name in VARS}
grandchild = subprocess.run(
    [sys.executable, "-c",
     "import json, os; print(json.dumps({n: os.environ.get(n) for n in %r}))" % (VARS,)],
    capture_output=True, text=True, check=True,
)
report["grandchild_environ"] = json.loads(grandchild.stdout)
print(json.dumps(report))
"""

# The program under test for the end-to-end check: serves one connection per inherited
# socket through trio.SocketListener and answers with the socket's name.
ACCEPTOR = """
import trio
from conduit.daemon.systemd import listen_fds

async def main():
    async def answer(inherited):
        async with inherited.listener() as listener:
            stream = await listener.accept()
            async with stream:
                await stream.send_all(f"{inherited.name} {inherited.kind.value}\\n".encode())

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for inherited in listen_fds():
                nursery.start_soon(answer, inherited)

trio.run(main)
"""

UNSET = dict.fromkeys(LISTEN_VARS)


def child_environ(**extra: str) -> dict[str, str]:
    """The test's environment without any systemd variables of its own, plus ``extra``."""
    environ = {k: v for k, v in os.environ.items() if k not in SYSTEMD_VARS}
    environ.update(extra)
    return environ


async def run_activated(
    program: str, fds: list[int], *, listen_pid: str = "self", **environ: str
) -> trio.Process:
    """Run ``program`` with ``fds`` passed as 3, 4, ... and return the finished process.

    ``LISTEN_FDS`` defaults to the number of fds, as systemd sets it.
    """
    environ.setdefault("LISTEN_FDS", str(len(fds)))
    command = [
        sys.executable,
        "-c",
        LAUNCHER,
        ",".join(map(str, fds)),
        listen_pid,
        program,
    ]
    with trio.fail_after(WAIT_S):
        process = await trio.run_process(
            command,
            pass_fds=fds,
            env=child_environ(TEST_FD_COUNT=str(len(fds)), **environ),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert process.returncode == 0, process.stderr.decode()
    return process


async def report_of(fds: list[int], **environ: str) -> dict[str, Any]:
    process = await run_activated(REPORTER, fds, **environ)
    return json.loads(process.stdout)


@pytest.fixture
def sockets() -> Iterator[ExitStack]:
    """Closes every socket a test opens, after the child has its copies."""
    with ExitStack() as stack:
        yield stack


def unix_listener(stack: ExitStack, path: Path) -> socket.socket:
    sock = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
    sock.bind(str(path))
    sock.listen()
    return sock


def tcp_listener(stack: ExitStack) -> socket.socket:
    sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


# ---------------------------------------------------------------------------------------
# listen_fds() in a socket-activated child
# ---------------------------------------------------------------------------------------


async def test_listen_fds_adopts_unix_and_tcp_listeners_in_order(
    tmp_path: Path, sockets: ExitStack
) -> None:
    unix = unix_listener(sockets, tmp_path / "c.sock")
    tcp = tcp_listener(sockets)
    port = tcp.getsockname()[1]

    report = await report_of(
        [unix.fileno(), tcp.fileno()], LISTEN_FDS="2", LISTEN_FDNAMES="conduit:conduit-tcp"
    )

    assert report == {
        "sockets": [
            {"fd": 3, "name": "conduit", "kind": "unix-stream", "address": str(unix.getsockname())},
            {"fd": 4, "name": "conduit-tcp", "kind": "tcp-stream", "address": f"127.0.0.1:{port}"},
        ],
        # Close-on-exec, so the programs the daemon runs never hold its listeners.
        "inheritable": {"3": False, "4": False},
        "environ": UNSET,
        "grandchild_environ": UNSET,
    }


async def test_listen_fds_names_sockets_unknown_without_fdnames(
    tmp_path: Path, sockets: ExitStack
) -> None:
    unix = unix_listener(sockets, tmp_path / "c.sock")

    report = await report_of([unix.fileno()], LISTEN_FDS="1")

    assert report["sockets"] == [
        {"fd": 3, "name": "unknown", "kind": "unix-stream", "address": str(unix.getsockname())}
    ]


async def test_listen_fds_ignores_variables_meant_for_another_process(
    tmp_path: Path, sockets: ExitStack
) -> None:
    unix = unix_listener(sockets, tmp_path / "c.sock")

    # LISTEN_PID names the test process, as if a parent had leaked its variables.
    report = await report_of(
        [unix.fileno()], listen_pid="keep", LISTEN_PID=str(os.getpid()), LISTEN_FDS="1"
    )

    assert report == {
        "sockets": [],
        "inheritable": {"3": True},  # not ours, so left alone
        "environ": UNSET,  # but still unset, so it leaks no further
        "grandchild_environ": UNSET,
    }


async def test_inherited_sockets_serve_connections_through_trio_listeners(
    tmp_path: Path, sockets: ExitStack
) -> None:
    path = tmp_path / "c.sock"
    unix = unix_listener(sockets, path)
    tcp = tcp_listener(sockets)
    port = tcp.getsockname()[1]
    answers: dict[str, bytes] = {}

    async def ask(key: str, connect: Callable[[], Awaitable[trio.SocketStream]]) -> None:
        stream = await connect()
        async with stream:
            answers[key] = await stream.receive_some()

    with trio.fail_after(WAIT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_activated, ACCEPTOR, [unix.fileno(), tcp.fileno()])
            # Connections queue in the shared backlog until the child accepts them.
            nursery.start_soon(ask, "unix", partial(trio.open_unix_socket, str(path)))
            nursery.start_soon(ask, "tcp", partial(trio.open_tcp_stream, "127.0.0.1", port))

    assert answers == {"unix": b"unknown unix-stream\n", "tcp": b"unknown tcp-stream\n"}


def connected_socket(stack: ExitStack) -> int:
    # What Accept=yes passes: one end of a connection.
    left, right = socket.socketpair()
    stack.enter_context(left)
    stack.enter_context(right)
    return left.fileno()


def datagram_socket(stack: ExitStack) -> int:
    # What ListenDatagram= passes.
    sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    sock.bind(("127.0.0.1", 0))
    return sock.fileno()


def pipe(stack: ExitStack) -> int:
    # What ListenFIFO= passes, near enough: not a socket at all.
    read_fd, write_fd = os.pipe()
    stack.callback(os.close, read_fd)
    stack.callback(os.close, write_fd)
    return read_fd


@pytest.mark.parametrize(
    ("make_fd", "advice"),
    [
        (connected_socket, "set Accept=no in conduit.socket"),
        (datagram_socket, "use ListenStream= in conduit.socket"),
        (pipe, "use ListenStream= in conduit.socket"),
    ],
)
async def test_listen_fds_refuses_what_it_cannot_serve(
    tmp_path: Path, sockets: ExitStack, make_fd: Any, advice: str
) -> None:
    good = unix_listener(sockets, tmp_path / "c.sock")
    bad_fd = make_fd(sockets)

    report = await report_of([good.fileno(), bad_fd], LISTEN_FDS="2", LISTEN_FDNAMES="a:b")

    assert report["error"]["type"] == "ConfigError"
    assert "fd 4 ('b')" in report["error"]["message"]
    assert advice in report["error"]["message"]
    assert report["sockets"] == []
    # The socket adopted before the failure was closed, not leaked.
    assert report["inheritable"]["3"] == "closed"
    assert report["environ"] == UNSET


# ---------------------------------------------------------------------------------------
# listen_fds() in this process: only paths that return before touching any fd
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"LISTEN_FDS": "1"},
        {"LISTEN_PID": "1", "LISTEN_FDS": "1", "LISTEN_FDNAMES": "conduit"},
        {"LISTEN_PID": str(os.getpid())},
        {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "0"},
    ],
)
def test_listen_fds_without_activation_for_this_process_is_empty(
    environ: dict[str, str],
) -> None:
    assert listen_fds(environ) == []
    assert environ == {}


def test_listen_fds_can_leave_the_environment_alone() -> None:
    environ = {"LISTEN_PID": "1", "LISTEN_FDS": "1"}

    assert listen_fds(environ, unset=False) == []

    assert environ == {"LISTEN_PID": "1", "LISTEN_FDS": "1"}


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"LISTEN_PID": "self?", "LISTEN_FDS": "1"}, "LISTEN_PID='self?'"),
        ({"LISTEN_PID": "+1", "LISTEN_FDS": "1"}, "LISTEN_PID='+1'"),
        ({"LISTEN_FDS": "-1"}, "LISTEN_FDS='-1'"),
        ({"LISTEN_FDS": "2", "LISTEN_FDNAMES": "conduit"}, "names 1 sockets but LISTEN_FDS=2"),
    ],
)
def test_listen_fds_refuses_malformed_variables_and_still_unsets_them(
    environ: dict[str, str], message: str
) -> None:
    environ.setdefault("LISTEN_PID", str(os.getpid()))

    with pytest.raises(ConfigError, match=re.escape(message)):
        listen_fds(environ)

    assert environ == {}


# ---------------------------------------------------------------------------------------
# Notifier
# ---------------------------------------------------------------------------------------


def bound_datagram_socket(address: str | bytes) -> trio.socket.SocketType:
    # Bound through the stdlib because Trio's bind() is async and fixtures here are not.
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    return trio.socket.from_stdlib_socket(sock)


async def received(sock: trio.socket.SocketType) -> bytes:
    with trio.fail_after(WAIT_S):
        return await sock.recv(4096)


async def test_notifier_sends_each_state_as_one_datagram(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    with bound_datagram_socket(str(path)) as systemd:
        notifier = Notifier(str(path))

        assert await notifier.ready()
        assert await received(systemd) == b"READY=1"
        assert await notifier.ready(status="serving on /run/conduit/conduit.sock")
        assert await received(systemd) == b"READY=1\nSTATUS=serving on /run/conduit/conduit.sock"
        assert await notifier.watchdog()
        assert await received(systemd) == b"WATCHDOG=1"
        assert await notifier.status("2 executions running")
        assert await received(systemd) == b"STATUS=2 executions running"
        assert await notifier.stopping(status="draining")
        assert await received(systemd) == b"STOPPING=1\nSTATUS=draining"
        assert await notifier.notify(EXTEND_TIMEOUT_USEC=5_000_000)
        assert await received(systemd) == b"EXTEND_TIMEOUT_USEC=5000000"

    assert notifier.enabled
    assert repr(notifier) == f"<Notifier {path}>"


async def test_reloading_carries_the_monotonic_clock(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    with bound_datagram_socket(str(path)) as systemd:
        before_usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        assert await Notifier(str(path)).reloading()
        after_usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000

        reloading, monotonic = (await received(systemd)).decode().split("\n")

    assert reloading == "RELOADING=1"
    key, value = monotonic.split("=")
    assert key == "MONOTONIC_USEC"
    assert before_usec <= int(value) <= after_usec


async def test_notifier_reaches_an_abstract_socket_named_in_the_environment() -> None:
    name = f"conduit-test-{os.getpid()}-{secrets.token_hex(8)}"
    with bound_datagram_socket(b"\0" + name.encode()) as systemd:
        environ = {"NOTIFY_SOCKET": f"@{name}", "PATH": "/bin"}
        notifier = Notifier.from_environ(environ)

        assert await notifier.ready()
        assert await received(systemd) == b"READY=1"

    assert environ == {"PATH": "/bin"}
    assert repr(notifier) == f"<Notifier @{name}>"


async def test_status_text_cannot_smuggle_in_other_fields(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    with bound_datagram_socket(str(path)) as systemd:
        notifier = Notifier(str(path))

        assert await notifier.status("upstream said:\nREADY=1\r\nMAINPID=1\0")
        assert await received(systemd) == b"STATUS=upstream said: READY=1 MAINPID=1 "


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"STATUS": "two\nlines"}, "value for STATUS contains a newline or NUL"),
        # systemd drops a whole message that holds a NUL byte.
        ({"STATUS": "nul\0"}, "value for STATUS contains a newline or NUL"),
        ({"READY=1\nSTATUS": "x"}, "field name 'READY=1\\nSTATUS' is not"),
    ],
)
async def test_notify_refuses_malformed_fields(
    tmp_path: Path, fields: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        await Notifier(str(tmp_path / "notify")).notify(**fields)


async def test_notifier_without_notify_socket_does_nothing() -> None:
    environ: dict[str, str] = {}
    notifier = Notifier.from_environ(environ)

    assert not notifier.enabled
    assert repr(notifier) == "<Notifier disabled>"
    assert not await notifier.ready()
    assert not await notifier.reloading()
    assert not await notifier.stopping()
    assert not await notifier.watchdog()
    assert not await notifier.status("idle")
    # A malformed message is a bug even when nobody is listening.
    with pytest.raises(ValueError, match="newline"):
        await notifier.notify(STATUS="a\nb")


async def test_notifier_can_leave_the_environment_alone(tmp_path: Path) -> None:
    environ = {"NOTIFY_SOCKET": str(tmp_path / "notify")}

    assert Notifier.from_environ(environ, unset=False).enabled

    assert environ == {"NOTIFY_SOCKET": str(tmp_path / "notify")}


async def test_notifier_logs_and_carries_on_when_systemd_is_unreachable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    notifier = Notifier(str(tmp_path / "nobody-listens"))

    with caplog.at_level(logging.WARNING, logger="conduit.daemon.systemd"):
        assert not await notifier.ready()

    assert "could not notify systemd" in caplog.text


def test_notifier_refuses_transports_it_cannot_speak() -> None:
    with pytest.raises(ConfigError, match="only AF_UNIX notify sockets"):
        Notifier("vsock:2:9999")


# ---------------------------------------------------------------------------------------
# Watchdog
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "interval_s"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "1"}, 0.0000005),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),
        ({"WATCHDOG_PID": str(os.getpid())}, None),
    ],
)
def test_watchdog_interval_is_half_the_timeout_for_this_process(
    environ: dict[str, str], interval_s: float | None
) -> None:
    assert watchdog_interval_s(environ) == interval_s
    assert environ == {}


def test_watchdog_interval_can_leave_the_environment_alone() -> None:
    environ = {"WATCHDOG_USEC": "30000000"}

    assert watchdog_interval_s(environ, unset=False) == 15.0

    assert environ == {"WATCHDOG_USEC": "30000000"}


@pytest.mark.parametrize(
    "environ",
    [
        {"WATCHDOG_USEC": "0"},
        {"WATCHDOG_USEC": "30s"},
        {"WATCHDOG_USEC": "-5"},
        {"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "me"},
    ],
)
def test_watchdog_interval_refuses_malformed_variables(environ: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="WATCHDOG_"):
        watchdog_interval_s(environ)

    assert environ == {}


async def test_serve_watchdog_pings_every_interval_until_cancelled(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    with bound_datagram_socket(str(path)) as systemd:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_watchdog, Notifier(str(path)), 0.01)
            pings = [await received(systemd) for _ in range(3)]
            nursery.cancel_scope.cancel()

    assert pings == [b"WATCHDOG=1"] * 3


async def test_serve_watchdog_waits_the_interval_between_pings(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    path = tmp_path / "notify"
    with bound_datagram_socket(str(path)) as systemd:
        async with trio.open_nursery() as nursery:
            started_at = trio.current_time()
            await nursery.start(serve_watchdog, Notifier(str(path)), 15.0)
            arrivals = []
            for _ in range(3):
                assert await received(systemd) == b"WATCHDOG=1"
                arrivals.append(trio.current_time() - started_at)
            nursery.cancel_scope.cancel()

    # The first ping goes out at once; the clock only moves while the task sleeps.
    assert arrivals == pytest.approx([0.0, 15.0, 30.0])


@pytest.mark.parametrize("interval_s", [0.0, -1.0, math.nan])
async def test_serve_watchdog_refuses_a_non_positive_interval(interval_s: float) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        await serve_watchdog(Notifier(None), interval_s)
