"""An operating-system sandbox under every Deno and Pyodide worker process: bubblewrap's
namespaces, an empty file system holding only what the runtime needs, and a seccomp
filter, so that a bug in V8 or Deno, or a permission granted by mistake, still reaches
nothing of the daemon's.

```
daemon ── bwrap ──▶ deno (PID 1 of its own namespaces)
           new user, mount, PID, network (loopback only), IPC, UTS and cgroup namespaces
           /  an empty tmpfs, and in it, read-only: the runtime's binary and the
              libraries it links, the files the worker loads (`Confinement.read_only`);
              read-write: its DENO_DIR and working directory (`writable`); the
              daemon's callback socket alone (`sockets`); /proc of its own PID
              namespace, a minimal /dev, a private empty /tmp
           no capabilities, no new user namespaces, no new privileges, a session of
           its own, killed when bwrap dies (and bwrap with the daemon: see
           `_trio_threads`); the seccomp filter below
```

The worker's pipes (stdin, stdout, stderr) pass through bwrap unchanged, and its
resource limits are set from outside on the runtime's own process, whose pid bwrap
reports on its info descriptor (`Spawn.child`): `SandboxedProcess` is what the limits
and the memory reading are applied to.

The seccomp filter refuses (EPERM) what a JavaScript runtime never needs and every
kernel escape starts from: tracing and reading other processes (`ptrace`,
`process_vm_*`), namespaces and mounts, keyrings, BPF, perf events, userfaultfd,
kernel modules, kexec, reboot, swap, the clock, io_uring, file handles; `clone3` is
refused as unsupported (ENOSYS) so the C library falls back to `clone`, whose
namespace flags are refused. System calls of another architecture (i386, x32) kill
the process.

`probe` starts the runtime once inside the sandbox: where the host cannot make one
(no bubblewrap, unprivileged user namespaces disabled as on Ubuntu's AppArmor
default, a container without them), it says why, and the executor's configuration
(`executors.os_sandbox`) decides between refusing to run and running under Deno's
permissions alone.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import signal
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Final

import trio

from conduit.executors._trio_threads import keep_worker_threads
from conduit.executors.process import Limited, kill_process_group, signal_process_group

log = logging.getLogger(__name__)

__all__ = [
    "BLOCKED_SYSCALLS",
    "NOT_PROBED",
    "Confinement",
    "Contained",
    "OsSandbox",
    "SandboxChoice",
    "SandboxedProcess",
    "Spawn",
    "Stopper",
    "choose",
    "find_bwrap",
    "probe",
    "run_confined",
    "runtime_returncode",
    "seccomp_program",
    "worker_run",
]

# Refused with EPERM. Grouped by what they would reach.
BLOCKED_SYSCALLS: Final = (
    # other processes' memory and execution
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    # namespaces, mounts and the root
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree",
    "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    # kernel interfaces with a record of escapes
    "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "open_by_handle_at", "name_to_handle_at", "lookup_dcookie",
    # the machine itself
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "reboot", "swapon", "swapoff", "acct", "quotactl", "syslog", "iopl", "ioperm",
    "vhangup", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "personality",
)  # fmt: skip
# `clone` flags that make a namespace: refused, as `unshare` is.
_NAMESPACE_FLAGS: Final = (
    0x10000000,  # CLONE_NEWUSER
    0x00020000,  # CLONE_NEWNS
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
    0x08000000,  # CLONE_NEWIPC
    0x04000000,  # CLONE_NEWUTS
    0x02000000,  # CLONE_NEWCGROUP
)
# The info descriptor's JSON is a few dozen bytes.
_INFO_BYTES: Final = 4096
# How long bwrap may take to report its child (it does so before the child runs).
CHILD_PID_TIMEOUT_S: Final = 10.0
# bwrap's exit status for a runtime killed by signal N is this plus N.
_SIGNALLED: Final = 128
# How long bwrap may take to exit once its runtime is killed (it reaps it, then exits).
BWRAP_EXIT_S: Final = 2.0
# How long the runtime's `--version` may take inside a new sandbox.
PROBE_TIMEOUT_S: Final = 30.0
# Where the sandbox's own directories are mounted.
_SYSTEM_MOUNTS: Final = ("--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp")


def find_bwrap(configured: str | None = None) -> str | None:
    """The bubblewrap binary: `configured` if it is given and exists, else `bwrap` on
    PATH (or Debian's /usr/bin/bwrap)."""
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    return shutil.which("bwrap") or (
        "/usr/bin/bwrap" if os.access("/usr/bin/bwrap", os.X_OK) else None
    )


def seccomp_program() -> bytes:
    """The seccomp filter as a BPF program, for bwrap's `--seccomp`. Raises OSError if
    libseccomp cannot be loaded."""
    import pyseccomp

    rules = pyseccomp.SyscallFilter(defaction=pyseccomp.ALLOW)
    for name in BLOCKED_SYSCALLS:
        try:
            rules.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
        except ValueError:
            continue  # a system call this kernel's architecture does not have
    rules.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
    for flag in _NAMESPACE_FLAGS:
        rules.add_rule(
            pyseccomp.ERRNO(errno.EPERM), "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, flag, flag)
        )
    with os.fdopen(os.memfd_create("conduit-seccomp-build", 0), "w+b") as program:
        rules.export_bpf(program)
        program.seek(0)
        return program.read()


@dataclass(frozen=True, slots=True)
class Confinement:
    """What one worker process may see, besides the runtime and its libraries."""

    cwd: Path
    read_only: tuple[Path, ...] = ()
    writable: tuple[Path, ...] = ()
    # Unix sockets bound alone (the daemon's callback socket).
    sockets: tuple[Path, ...] = ()


@dataclass(eq=False)
class Stopper:
    """Stops a sandboxed runtime from the inside out: the runtime first, so that bwrap
    reaps it and exits. Killing bwrap first would leave the runtime (killed in turn by
    `--die-with-parent`) to the host's init, a zombie wherever that init does not reap.
    `runtime` is set once bwrap has reported it; until then bwrap itself is stopped."""

    runtime: SandboxedProcess | None = None

    def kill(self, process: trio.Process) -> None:
        """SIGKILL the runtime now (or, not known or gone already, bwrap's group)."""
        runtime = self.runtime
        if runtime is not None and runtime.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(runtime.pid, signal.SIGKILL)
            return
        signal_process_group(process)

    async def deliver_cancel(self, process: trio.Process) -> None:
        """`trio.run_process`'s: the runtime, then bwrap if it has not exited in
        BWRAP_EXIT_S."""
        self.kill(process)
        with trio.move_on_after(BWRAP_EXIT_S):
            await process.wait()
        signal_process_group(process)


@dataclass(eq=False)
class Spawn:
    """One sandboxed start: the command to run, the descriptors it inherits, and, once
    it runs, the pid of the runtime inside (`child`). Close it after the start."""

    argv: list[str]
    pass_fds: tuple[int, ...]
    _info_read: int
    _closing: list[int] = field(default_factory=list)
    # How to stop what it starts: `trio.run_process(deliver_cancel=...)`, and kills.
    stopper: Stopper = field(default_factory=Stopper)

    def started(self) -> None:
        """Close the parent's copies of what only the child needs."""
        for fd in self._closing:
            os.close(fd)
        self._closing.clear()

    async def child(self, process: trio.Process) -> SandboxedProcess:
        """The runtime's process, as bwrap reports it; raises OSError if it does not
        within CHILD_PID_TIMEOUT_S (bwrap failed: its stderr says why)."""
        self.started()
        data = b""
        info, self._info_read = trio.lowlevel.FdStream(self._info_read), -1
        async with info:
            with trio.move_on_after(CHILD_PID_TIMEOUT_S):
                while b"}" not in data and len(data) < _INFO_BYTES:
                    chunk = await info.receive_some(_INFO_BYTES)
                    if not chunk:
                        break
                    data += chunk
        try:
            pid = json.loads(data)["child-pid"]
        except (ValueError, KeyError, TypeError):
            raise OSError(f"bubblewrap reported no child: {data[:200]!r}") from None
        if type(pid) is not int or pid <= 1:
            raise OSError(f"bubblewrap reported no child: {data[:200]!r}")
        self.stopper.runtime = SandboxedProcess(process, pid)
        return self.stopper.runtime

    def close(self) -> None:
        """Close every descriptor still held (idempotent)."""
        self.started()
        if self._info_read >= 0:
            os.close(self._info_read)
            self._info_read = -1


class SandboxedProcess:
    """The runtime's process inside a sandbox, for its limits and its memory: `pid`
    is its own, `returncode` is None while it is known to be the one bwrap started.

    The runtime is bwrap's child, not the daemon's, so its pid is reused once bwrap has
    reaped it. bwrap exits right after, and is the daemon's child: while bwrap is not
    reaped its pid is nobody else's, and a process whose parent it is, is the runtime."""

    def __init__(self, process: trio.Process, pid: int) -> None:
        self.process = process
        self.pid = pid

    def __repr__(self) -> str:
        return f"<SandboxedProcess {self.pid} in bwrap {self.process.pid}>"

    @property
    def returncode(self) -> int | None:
        if self.process.returncode is not None:
            return self.process.returncode
        return None if _parent_of(self.pid) == self.process.pid else -1


def runtime_returncode(bwrap_returncode: int | None) -> int | None:
    """How the runtime ended, from how bwrap did: bwrap exits with the runtime's code,
    or 128 plus the signal that killed it, which is read back as `trio.Process` says a
    signal (its negative). A program's own exit code above 128 reads as that signal,
    as a shell reports it."""
    if bwrap_returncode is not None and _SIGNALLED < bwrap_returncode < _SIGNALLED + 65:
        return -(bwrap_returncode - _SIGNALLED)
    return bwrap_returncode


class Contained:
    """What a worker process (Deno's or Pyodide's) shares: `process`, which the daemon
    started (bwrap, or Deno itself without the sandbox), and `stopper`, set once the
    runtime inside bwrap is known (`start_runtime`)."""

    process: trio.Process
    stopper: Stopper | None

    @property
    def limited(self) -> Limited:
        """The process limits and memory readings are for: Deno's own."""
        if self.stopper is not None and self.stopper.runtime is not None:
            return self.stopper.runtime
        return self.process

    @property
    def returncode(self) -> int | None:
        """How Deno's own process ended (None while it runs), as `trio.Process` says it."""
        if self.stopper is None:
            return self.process.returncode
        return runtime_returncode(self.process.returncode)

    def kill_process(self) -> None:
        """SIGKILL Deno's process now (inside the sandbox, the runtime first); the
        worker's task reaps it."""
        if self.stopper is not None:
            self.stopper.kill(self.process)
        else:
            signal_process_group(self.process)

    async def start_runtime(self, spawn: Spawn) -> None:
        """Learn the runtime `spawn` started in the sandbox; on OSError (bwrap reported
        none), the process is killed first."""
        self.stopper = spawn.stopper
        try:
            await spawn.child(self.process)
        except OSError:
            self.kill_process()
            raise
        finally:
            spawn.close()


def worker_run(
    command: list[str], spawn: Spawn | None, options: dict[str, Any]
) -> Callable[..., Awaitable[trio.Process]]:
    """`trio.run_process` of a worker process, its pipes held, for `nursery.start`:
    `command` as it is, or the sandboxed form `spawn` made of it, with its descriptors
    and its way to be stopped. `options`: `process.sandbox_process_options`."""
    if spawn is None:
        argv, extra = command, {"deliver_cancel": kill_process_group}
    else:
        extra = {"pass_fds": spawn.pass_fds, "deliver_cancel": spawn.stopper.deliver_cancel}
        argv = spawn.argv
    return partial(
        trio.run_process,
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        check=False,
        **options,
        **extra,
    )


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("PPid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class OsSandbox:
    """Builds the bwrap command that confines one worker (see the module)."""

    def __init__(self, bwrap: str, runtime: str, program: bytes) -> None:
        self.bwrap = bwrap
        self.runtime = str(Path(runtime).resolve())
        self._program = program
        self._libraries = linked_libraries(self.runtime)
        # The kernel kills bwrap when the thread that started it ends, not the daemon:
        # only while Trio's threads live as long as the daemon (`_trio_threads`).
        self._die_with_parent = keep_worker_threads()

    def __repr__(self) -> str:
        return f"<OsSandbox {self.bwrap} for {self.runtime}>"

    def spawn(self, command: list[str], confinement: Confinement) -> Spawn:
        """The sandboxed form of `command` (whose first word is the runtime)."""
        rules = _memfd("conduit-seccomp", self._program)
        info_read, info_write = os.pipe()
        os.set_inheritable(info_read, False)
        argv = [
            self.bwrap,
            "--unshare-all",
            "--unshare-user",  # which --unshare-all only tries, and skips as root
            "--disable-userns",
            *(["--die-with-parent"] if self._die_with_parent else []),
            "--new-session",
            "--as-pid-1",
            "--cap-drop",
            "ALL",
            "--hostname",  # not the host's, in its own UTS namespace
            "sandbox",
            *_SYSTEM_MOUNTS,
            *self._mounts(confinement),
            # The root, a tmpfs holding the mount points, read-only once they are made.
            "--remount-ro",
            "/",
            "--chdir",
            str(confinement.cwd),
            "--seccomp",
            str(rules),
            "--info-fd",
            str(info_write),
            "--",
            self.runtime,
            *command[1:],
        ]
        return Spawn(argv, (rules, info_write), info_read, [rules, info_write])

    def _mounts(self, confinement: Confinement) -> list[str]:
        mounts: list[str] = []
        for path in (self.runtime, *self._libraries, *confinement.read_only):
            mounts += ["--ro-bind", str(path), str(path)]
        for path in (*confinement.writable, *confinement.sockets):
            mounts += ["--bind", str(path), str(path)]
        return mounts


def linked_libraries(binary: str) -> list[str]:
    """The shared libraries `binary` loads, and its loader, as `ldd` finds them (each
    at the path it is asked for by, and at its real path); [] without `ldd`, then
    the usual library directories."""
    try:
        listing = subprocess.run(
            ["ldd", binary], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return [
            path for path in ("/lib", "/lib64", "/usr/lib", "/usr/lib64") if os.path.exists(path)
        ]
    found: dict[str, None] = {}
    for line in listing.splitlines():
        words = line.split()
        for word in words:
            if word.startswith("/"):
                found[word] = None
                found[os.path.realpath(word)] = None
    for cache in ("/etc/ld.so.cache",):
        if os.path.exists(cache):
            found[cache] = None
    return list(found)


def _memfd(name: str, data: bytes) -> int:
    """An anonymous file holding `data`, read from its start, inheritable."""
    fd = os.memfd_create(name, 0)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
        os.set_inheritable(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


async def probe(sandbox: OsSandbox, cwd: Path) -> str | None:
    """Run the runtime's `--version` inside the sandbox: None if it ran, else why not
    (what bwrap said: no user namespaces, say)."""
    confinement = Confinement(cwd=cwd, read_only=(cwd,))
    try:
        with trio.move_on_after(PROBE_TIMEOUT_S):
            done = await run_confined(
                sandbox, [sandbox.runtime, "--version"], confinement, {"NO_COLOR": "1"}
            )
            if done.returncode == 0:
                return None
            said = done.stderr.decode("utf-8", "replace").strip().splitlines()
            return f"bwrap failed ({said[-1] if said else f'exit {done.returncode}'})"
        return f"bwrap did not finish within {PROBE_TIMEOUT_S:g} s"
    except OSError as exc:
        return f"bwrap could not be run: {exc}"


async def run_confined(
    sandbox: OsSandbox, command: list[str], confinement: Confinement, env: dict[str, str]
) -> subprocess.CompletedProcess[bytes]:
    """Run `command` to its end inside `sandbox`, its output captured."""
    spawn = sandbox.spawn(command, confinement)
    try:
        return await trio.run_process(
            spawn.argv,
            pass_fds=spawn.pass_fds,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=env,
            deliver_cancel=spawn.stopper.deliver_cancel,
        )
    finally:
        spawn.close()


@dataclass(frozen=True, slots=True)
class SandboxChoice:
    """What an executor's workers run in: `sandbox`, or none, and why (`missing`)."""

    sandbox: OsSandbox | None
    missing: str | None = None
    # The executor's reason to be unavailable: a required sandbox is missing.
    refusal: str | None = None

    def state(self) -> str:
        """Its words: "bubblewrap", or "none: <why>" (workers under Deno's permissions)."""
        return "bubblewrap" if self.sandbox is not None else f"none: {self.missing}"


# Before an executor has probed.
NOT_PROBED: Final = SandboxChoice(None, "not probed yet")


async def choose(name: str, mode: str, bwrap: str | None, runtime: str, cwd: Path) -> SandboxChoice:
    """Make the sandbox executor `name`'s workers run in, probing it once; where the
    host cannot, a refusal if `mode` is "required", else none (logged)."""
    found = find_bwrap(bwrap)
    if found is None:
        why = "bubblewrap (bwrap) was not found; install it (Debian: apt install bubblewrap)"
    else:
        try:
            program = await trio.to_thread.run_sync(seccomp_program)
            sandbox = await trio.to_thread.run_sync(OsSandbox, found, runtime, program)
        except OSError as exc:
            why = f"the seccomp filter could not be made: {exc}"
        else:
            why = await probe(sandbox, cwd)
            if why is None:
                return SandboxChoice(sandbox)
    if mode == "required":
        refusal = (
            f"the operating-system sandbox its workers run in cannot be made here: {why}; "
            'set executors.os_sandbox = "optional" to run them under Deno\'s '
            "permissions alone"
        )
        return SandboxChoice(None, why, refusal)
    log.warning(
        "%s: workers run under Deno's permissions alone, without the operating-system "
        'sandbox (executors.os_sandbox = "optional"): %s',
        name,
        why,
    )
    return SandboxChoice(None, why)
