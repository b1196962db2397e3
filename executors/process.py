"""Helpers for sandbox subprocesses: resource limits, process groups, environment.

A sandbox subprocess starts in its own session (so its process group id is its pid and
the whole group can be killed at once), with a minimal environment, and gets its
resource limits from the parent (`apply_limits`) right after it starts: setting them
between fork and exec would need a `preexec_fn`, which makes every start fork the whole
daemon (~0.5 ms holding the GIL) instead of vfork-ing. The runtime's own start-up is
trusted code; limits are in place before any program is handed over. Limits that
depend on the job are tightened later on the live process with `lower_rlimit`, which is
how a warm worker started before its job gets that job's limits.

This module knows nothing about any particular runtime. RLIMIT_AS is deliberately not
used: V8 reserves gigabytes of address space it never touches. RLIMIT_DATA, which
counts only writable private memory, is the memory backstop instead (see
`data_limit_bytes`).
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import trio

__all__ = [
    "Limited",
    "ProcessLimits",
    "apply_limits",
    "cpu_backstop_s",
    "cpu_seconds",
    "describe_returncode",
    "kill_process_group",
    "lower_rlimit",
    "minimal_env",
    "read_vm_data_bytes",
    "sandbox_process_options",
    "set_soft_limit",
    "signal_process_group",
]


class Limited(Protocol):
    """A process limits are set on: a `trio.Process`, or a runtime inside an operating-
    system sandbox (`os_sandbox.SandboxedProcess`). `returncode` is None only while
    `pid` is known to name it."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...


# The CPU limit is a backstop behind the wall-clock timeout, which is what normally
# stops a program. CPU time adds up over all threads (V8 collects garbage in helper
# threads), so it may run ahead of the wall clock: allow twice the timeout plus slack
# for start-up before the kernel steps in.
CPU_BACKSTOP_FACTOR = 2
CPU_BACKSTOP_SLACK_S = 5

# Unless a sandbox may write files of its own (the Deno executor sets its own cap from
# `limits.disk_mb`), the only files written are the runtime's caches (a transpiled
# program, small SQLite files), so a file larger than this is a runaway.
DEFAULT_FILE_BYTES = 16 * 1024 * 1024

# An idle Deno worker holds about 25 descriptors (stdio, epoll, SQLite caches); this
# leaves room for a few connections back to the daemon without allowing fd exhaustion.
DEFAULT_OPEN_FILES = 64

# Variables every sandbox gets: a UTF-8 locale so messages and I/O do not depend on
# the daemon's environment, and UTC, the only time zone the WebAssembly guests know,
# so a program's dates mean the same on every executor (Deno would take the host's
# /etc/localtime where no sandbox hides it).
BASE_ENV: Mapping[str, str] = {"LC_ALL": "C.UTF-8", "TZ": "UTC"}


@dataclass(frozen=True, slots=True)
class ProcessLimits:
    """Resource limits applied to a sandbox process before it runs anything.

    `cpu_s` is the soft CPU limit (SIGXCPU); the hard limit is one second later
    (SIGKILL). `file_bytes` caps any single file the process writes (SIGXFSZ).
    Core dumps are always disabled: they would write the sandbox's memory to disk.
    """

    cpu_s: int
    file_bytes: int = DEFAULT_FILE_BYTES
    open_files: int = DEFAULT_OPEN_FILES

    def rlimits(self) -> list[tuple[int, tuple[int, int]]]:
        """The (resource, (soft, hard)) pairs to set."""
        return [
            (resource.RLIMIT_CORE, (0, 0)),
            (resource.RLIMIT_CPU, (self.cpu_s, self.cpu_s + 1)),
            (resource.RLIMIT_FSIZE, (self.file_bytes, self.file_bytes)),
            (resource.RLIMIT_NOFILE, (self.open_files, self.open_files)),
        ]


def cpu_backstop_s(timeout_s: float) -> int:
    """The CPU-seconds limit that backs up a wall-clock timeout of `timeout_s`."""
    return math.ceil(timeout_s * CPU_BACKSTOP_FACTOR) + CPU_BACKSTOP_SLACK_S


def apply_limits(process: Limited, limits: ProcessLimits) -> None:
    """Set `limits` on the live `process` (only ever lowering them).

    Raises `ProcessLookupError` if the process is gone.
    """
    for which, (soft, hard) in limits.rlimits():
        lower_rlimit(process, which, soft, hard)


def sandbox_process_options(
    *, cwd: os.PathLike[str] | str, env: Mapping[str, str]
) -> dict[str, Any]:
    """Keyword arguments for `trio.run_process` that start a sandbox process.

    The process gets its own session (and so its own process group, for
    `kill_process_group`), exactly `env`, `cwd`, and no inherited file descriptors
    beyond the standard three. Call `apply_limits` on it before handing it a program.
    """
    return {
        "start_new_session": True,
        "cwd": os.fspath(cwd),
        "env": dict(env),
        "close_fds": True,
    }


def minimal_env(variables: Mapping[str, str]) -> dict[str, str]:
    """A sandbox environment: `BASE_ENV` plus `variables`, nothing from the daemon's own."""
    return {**BASE_ENV, **variables}


def signal_process_group(process: trio.Process, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to the process group led by `process`, without blocking.

    Nothing is sent once the leader has been reaped: its id may then belong to an
    unrelated process group. Sandboxes are not allowed to start processes, so the
    leader is the group's only member that matters.
    """
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):  # gone between the check and the kill
        os.killpg(process.pid, sig)


async def kill_process_group(process: trio.Process) -> None:
    """SIGKILL the whole process group of `process`.

    Suitable as `trio.run_process(deliver_cancel=...)`: run_process waits for the
    process to exit afterwards.
    """
    signal_process_group(process, signal.SIGKILL)
    await trio.lowlevel.checkpoint()


def _is_infinite(value: int) -> bool:
    return value == resource.RLIM_INFINITY or value < 0


def lower_rlimit(process: Limited, which: int, soft: int, hard: int) -> None:
    """Lower resource limit `which` of the live `process` to (`soft`, `hard`).

    Never raises a limit: a value above the current one is clamped to it, because only
    a privileged process may raise a hard limit. Raises `ProcessLookupError` if the
    process is gone.

    Nothing is set once the process has been reaped: its pid may then be anyone's, and
    a limit set on a pid that now names one of the daemon's own threads would land on
    the daemon itself (pids wrap at 32768 on many hosts). Until it is reaped, even a
    process that has exited keeps its pid.
    """
    if process.returncode is not None:
        raise ProcessLookupError(f"process {process.pid} has exited")
    pid = process.pid
    current_soft, current_hard = resource.prlimit(pid, which)
    if not _is_infinite(current_hard):
        hard = min(hard, current_hard)
    soft = min(soft, hard)
    if not _is_infinite(current_soft):
        soft = min(soft, current_soft)
    resource.prlimit(pid, which, (soft, hard))


def cpu_seconds(pid: int) -> float:
    """The CPU time process `pid` has used (all its threads, user and system).

    Raises `ProcessLookupError` if the process is gone.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except FileNotFoundError as exc:
        raise ProcessLookupError(pid) from exc
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def set_soft_limit(process: Limited, which: int, soft: int) -> None:
    """Set the soft limit `which` of the live `process`, under its hard limit.

    Unlike `lower_rlimit`, this may raise the soft limit again (never past the hard
    one): a long-lived process's limits change with each program it runs. Nothing is
    set once the process has been reaped (its pid may be anyone's). Raises
    `ProcessLookupError` if the process is gone.
    """
    if process.returncode is not None:
        raise ProcessLookupError(f"process {process.pid} has exited")
    _, hard = resource.prlimit(process.pid, which)
    if hard != resource.RLIM_INFINITY and (soft == resource.RLIM_INFINITY or soft > hard):
        soft = hard
    resource.prlimit(process.pid, which, (soft, hard))


def read_vm_data_bytes(pid: int) -> int | None:
    """The writable private memory (VmData) of process `pid`, or None if unknown."""
    return _kib_field(f"/proc/{pid}/status", "VmData:")


def memory_available_bytes() -> int | None:
    """What the kernel says could be allocated without swapping (`MemAvailable`), or
    None if it does not say."""
    return _kib_field("/proc/meminfo", "MemAvailable:")


def _kib_field(path: str, label: str) -> int | None:
    """The bytes of the `label` line (in kB) of a /proc file, or None if unknown."""
    try:
        with open(path, encoding="ascii") as fields:
            for line in fields:
                if line.startswith(label):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def describe_returncode(returncode: int) -> str:
    """Human words for a `trio.Process.returncode` ("exit code 3", "signal SIGKILL")."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        return f"signal {signal.Signals(-returncode).name}"
    except ValueError:
        return f"signal {-returncode}"
