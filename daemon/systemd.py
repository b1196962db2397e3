"""systemd integration: socket activation, readiness and the watchdog, with no dependencies.

The three protocols are small and stable, so they are spoken directly rather than through
python-systemd (a C extension that would have to be built wherever Conduit is installed):

- ``listen_fds()`` is ``sd_listen_fds(3)``: sockets arrive as fds 3, 4, ... described by
  ``LISTEN_PID``, ``LISTEN_FDS`` and ``LISTEN_FDNAMES``.
- ``Notifier`` is ``sd_notify(3)``: ``FIELD=value`` lines in one datagram to the AF_UNIX
  socket named by ``NOTIFY_SOCKET``. Without ``NOTIFY_SOCKET`` it does nothing, so the
  daemon calls it unconditionally.
- ``watchdog_interval_s()`` and ``serve_watchdog()`` are ``sd_watchdog_enabled(3)`` plus the
  task that keeps pinging.

This module deliberately knows nothing about configuration, signals or shutdown order:
``listeners.py`` decides what to serve on the inherited sockets, and ``server.py`` decides
when the daemon is ready, reloading or stopping.

Every reader takes the environment as a parameter and, by default, removes the variables
it read (as ``sd_listen_fds(unset_environment=1)`` does), so the programs the daemon runs
never inherit a socket-activation or notify channel that was meant for the daemon alone.
"""

from __future__ import annotations

import enum
import logging
import os
import socket
import time
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass
from typing import NoReturn

import trio

from conduit.core.errors import ConfigError

__all__ = [
    "NOTIFY_SEND_TIMEOUT_S",
    "SD_LISTEN_FDS_START",
    "InheritedSocket",
    "Notifier",
    "SocketKind",
    "listen_fds",
    "serve_watchdog",
    "watchdog_interval_s",
]

_log = logging.getLogger(__name__)

# sd_listen_fds(3): passed sockets start right after stdin, stdout and stderr.
SD_LISTEN_FDS_START = 3

# PID 1 drains its notify socket promptly, so a datagram that cannot be queued within
# this long means the manager is wedged. sd_notify() would block; we give up instead, so a
# watchdog ping or STOPPING=1 never holds up the daemon's own shutdown.
NOTIFY_SEND_TIMEOUT_S = 5.0

# The name systemd reports for a socket whose unit sets no FileDescriptorName=.
_UNNAMED_FD = "unknown"

_LISTEN_VARS = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")
_NOTIFY_VARS = ("NOTIFY_SOCKET",)
_WATCHDOG_VARS = ("WATCHDOG_USEC", "WATCHDOG_PID")


# ---------------------------------------------------------------------------------------
# Socket activation
# ---------------------------------------------------------------------------------------


class SocketKind(enum.Enum):
    """The kinds of inherited socket the daemon can serve JSON-RPC on."""

    UNIX_STREAM = "unix-stream"
    TCP_STREAM = "tcp-stream"


@dataclass(frozen=True, slots=True)
class InheritedSocket:
    """One listening socket passed in by systemd.

    ``socket`` owns ``fd``. It is a plain ``socket.socket``, not a Trio one, because
    ``listen_fds()`` may run before ``trio.run`` and a Trio socket can only be closed inside
    it. Whoever receives an ``InheritedSocket`` either calls ``listener()`` once (the
    listener then owns the socket) or calls ``close()``. Neither touches systemd's own
    copy, so the socket unit keeps listening and the next connection re-activates the
    service.
    """

    fd: int
    """The descriptor number systemd used (3, 4, ...), kept for log messages."""
    name: str
    """``FileDescriptorName=`` from the socket unit, or ``"unknown"`` if it set none."""
    kind: SocketKind
    address: str
    """Where it listens, for logs: a path, ``@name`` (abstract), ``host:port``."""
    socket: socket.socket

    def listener(self) -> trio.SocketListener:
        """Wrap the socket for ``trio.serve_listeners``; the listener takes ownership.

        Call it at most once. The socket becomes non-blocking, as Trio requires. Works
        outside ``trio.run`` too.
        """
        return trio.SocketListener(trio.socket.from_stdlib_socket(self.socket))

    def close(self) -> None:
        """Close the socket when it will not be served; idempotent."""
        self.socket.close()


def listen_fds(
    environ: MutableMapping[str, str] = os.environ, *, unset: bool = True
) -> list[InheritedSocket]:
    """Adopt the listening sockets systemd passed in, in fd order.

    Returns an empty list when the process was not socket-activated: ``LISTEN_PID`` or
    ``LISTEN_FDS`` is missing, or ``LISTEN_PID`` names another process (the variables
    leaked from a parent that did not unset them). Every passed fd is made close-on-exec
    before anything else, as ``sd_listen_fds`` does.

    With ``unset`` (the default) the ``LISTEN_*`` variables are removed from ``environ``
    whatever the outcome, so a second call returns ``[]`` and no child process sees them.

    Raises ``ConfigError`` when the variables are malformed, when ``LISTEN_FDNAMES`` does not
    have one name per fd, or when a passed fd is not a listening Unix or TCP stream socket
    (the message says which unit setting to fix). Sockets adopted before the failure are
    closed; the daemon is expected to exit.
    """
    try:
        named_fds = _passed_fds(environ)
    finally:
        if unset:
            _unset(environ, _LISTEN_VARS)
    for fd, name in named_fds:
        _set_cloexec(fd, name)
    adopted: list[InheritedSocket] = []
    try:
        for fd, name in named_fds:
            adopted.append(_adopt(fd, name))
    except BaseException:
        for inherited in adopted:
            inherited.close()
        raise
    return adopted


def _passed_fds(environ: MutableMapping[str, str]) -> list[tuple[int, str]]:
    """Read ``LISTEN_*`` and return ``(fd, name)`` pairs meant for this process."""
    pid_text = environ.get("LISTEN_PID")
    if pid_text is None:
        return []
    if _parse_count("LISTEN_PID", pid_text) != os.getpid():
        return []
    count_text = environ.get("LISTEN_FDS")
    if count_text is None:
        return []
    count = _parse_count("LISTEN_FDS", count_text)
    names = _fd_names(environ.get("LISTEN_FDNAMES"), count)
    return [(SD_LISTEN_FDS_START + index, name) for index, name in enumerate(names)]


def _fd_names(raw: str | None, count: int) -> list[str]:
    """Split ``LISTEN_FDNAMES`` into exactly ``count`` names."""
    if count == 0:
        return []
    if raw is None:
        return [_UNNAMED_FD] * count
    names = raw.split(":")
    if len(names) != count:
        raise ConfigError(
            f"LISTEN_FDNAMES={raw!r} names {len(names)} sockets but LISTEN_FDS={count}; "
            "the environment was not set by systemd or was edited on the way"
        )
    return names


def _set_cloexec(fd: int, name: str) -> None:
    """Stop ``fd`` leaking into the programs the daemon runs."""
    try:
        os.set_inheritable(fd, False)
    except OSError as exc:
        raise ConfigError(
            f"LISTEN_FDS promises fd {fd} ({name!r}) but it is not open ({exc.strerror}); "
            "start the daemon through its socket unit, not with LISTEN_* set by hand"
        ) from exc


def _adopt(fd: int, name: str) -> InheritedSocket:
    """Wrap one passed fd, refusing anything the daemon cannot accept connections on."""
    try:
        # With only fileno= given, the kernel reports the family and type.
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise ConfigError(
            f"systemd passed fd {fd} ({name!r}) but it is not a socket ({exc.strerror}); "
            "use ListenStream= in conduit.socket"
        ) from exc
    try:
        kind = _kind_of(sock, fd, name)
        _require_listening(sock, fd, name)
        address = _describe_address(sock.getsockname())
    except BaseException:
        sock.close()
        raise
    return InheritedSocket(fd=fd, name=name, kind=kind, address=address, socket=sock)


def _kind_of(sock: socket.socket, fd: int, name: str) -> SocketKind:
    if sock.type == socket.SOCK_STREAM:
        if sock.family == socket.AF_UNIX:
            return SocketKind.UNIX_STREAM
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            return SocketKind.TCP_STREAM
    raise ConfigError(
        f"systemd passed fd {fd} ({name!r}) as a {_enum_name(sock.family)} "
        f"{_enum_name(sock.type)} "
        "socket; conduit serves only Unix and TCP stream sockets: use ListenStream= "
        "in conduit.socket"
    )


def _enum_name(value: int) -> str:
    # The kernel may report a family or type the socket module has no enum member for.
    return getattr(value, "name", str(value))


def _require_listening(sock: socket.socket, fd: int, name: str) -> None:
    """Refuse a connected socket: that is what ``Accept=yes`` passes."""
    try:
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    except OSError:
        # Not every platform answers SO_ACCEPTCONN; trio.SocketListener trusts it too.
        return
    if not listening:
        raise ConfigError(
            f"systemd passed fd {fd} ({name!r}) as a connected socket, not a listening one; "
            "set Accept=no in conduit.socket: the daemon accepts connections itself"
        )


def _describe_address(address: object) -> str:
    if isinstance(address, bytes):
        # Python reports abstract Unix names as bytes starting with NUL; systemd writes '@'.
        if address.startswith(b"\0"):
            return "@" + address[1:].decode(errors="backslashreplace")
        return address.decode(errors="backslashreplace")
    if isinstance(address, str):
        return address
    if isinstance(address, tuple):
        host, port = address[0], address[1]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return repr(address)


# ---------------------------------------------------------------------------------------
# Notification
# ---------------------------------------------------------------------------------------


class Notifier:
    """Sends ``sd_notify`` state changes to systemd; a silent no-op outside systemd.

    Each message opens a fresh non-blocking datagram socket, as ``sd_notify`` does, so a
    ``Notifier`` holds no resources and needs no closing. Every send is awaited on the Trio
    loop, bounded by ``NOTIFY_SEND_TIMEOUT_S``, and never raises for delivery problems: a
    daemon that cannot reach systemd keeps serving, and the failure is logged. Only a
    malformed message raises, as that is a bug in the caller.

    A send is a Trio checkpoint: inside an already cancelled scope it raises ``Cancelled``
    without sending. Send ``STOPPING=1`` before cancelling the work it announces, or under
    ``CancelScope(shield=True)``, which is safe because every send is time-bounded.

    Send from the daemon's main process: the service uses ``NotifyAccess=main``, so systemd
    drops datagrams from any child.
    """

    __slots__ = ("_address",)

    def __init__(self, notify_socket: str | None) -> None:
        """``notify_socket`` is a ``NOTIFY_SOCKET`` value, or ``None`` to disable sending.

        Raises ``ConfigError`` for a value that is neither a path (``/run/...``) nor an
        abstract name (``@...``): other transports, such as ``vsock:``, are not supported.
        """
        self._address = _notify_address(notify_socket) if notify_socket else None

    @classmethod
    def from_environ(
        cls, environ: MutableMapping[str, str] = os.environ, *, unset: bool = True
    ) -> Notifier:
        """Build from ``NOTIFY_SOCKET``; with ``unset`` (the default) remove it afterwards.

        Call it once at start-up: after unsetting, a second call returns a disabled notifier.
        """
        try:
            return cls(environ.get("NOTIFY_SOCKET"))
        finally:
            if unset:
                _unset(environ, _NOTIFY_VARS)

    @property
    def enabled(self) -> bool:
        """Whether messages go anywhere (``NOTIFY_SOCKET`` was set)."""
        return self._address is not None

    def __repr__(self) -> str:
        if self._address is None:
            return "<Notifier disabled>"
        return f"<Notifier {_describe_address(self._address)}>"

    async def notify(self, **fields: str | int) -> bool:
        """Send ``FIELD=value`` lines in one datagram, e.g. ``notify(READY=1, STATUS="up")``.

        Returns ``True`` once systemd's socket has the message, ``False`` when disabled or
        when delivery failed or timed out (logged as a warning). Raises ``ValueError`` if a
        value contains a newline, which would smuggle in another field, or a NUL byte, which
        makes systemd drop the whole message.
        """
        payload = _encode(fields)
        if self._address is None:
            await trio.lowlevel.checkpoint()
            return False
        return await self._send(payload)

    async def ready(self, status: str | None = None) -> bool:
        """``READY=1``: start-up (or a reload) finished; units ordered after us may start."""
        return await self.notify(READY=1, **_status_field(status))

    async def reloading(self) -> bool:
        """``RELOADING=1``: a reload began. Send ``ready()`` when it is done.

        ``MONOTONIC_USEC`` lets systemd tell this reload from an earlier one.
        """
        monotonic_usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return await self.notify(RELOADING=1, MONOTONIC_USEC=monotonic_usec)

    async def stopping(self, status: str | None = None) -> bool:
        """``STOPPING=1``: draining began; systemd shows the unit as deactivating."""
        return await self.notify(STOPPING=1, **_status_field(status))

    async def watchdog(self) -> bool:
        """``WATCHDOG=1``: the event loop is alive."""
        return await self.notify(WATCHDOG=1)

    async def status(self, text: str) -> bool:
        """``STATUS=text``, shown by ``systemctl status``; newlines become spaces."""
        return await self.notify(**_status_field(text))

    async def _send(self, payload: bytes) -> bool:
        address = self._address
        assert address is not None
        try:
            with trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                with trio.move_on_after(NOTIFY_SEND_TIMEOUT_S):
                    await sock.sendto(payload, address)
                    return True
        except OSError as exc:
            _log.warning(
                "could not notify systemd at %s (%s); systemd may consider the service "
                "not ready or hung. Check that NOTIFY_SOCKET is the manager's socket and "
                "that the daemon is the unit's main process (NotifyAccess=main).",
                _describe_address(address),
                exc,
            )
            return False
        _log.warning(
            "systemd did not take a notification within %.0f s; is PID 1 responsive?",
            NOTIFY_SEND_TIMEOUT_S,
        )
        return False


def _notify_address(notify_socket: str) -> bytes:
    """Turn a ``NOTIFY_SOCKET`` value into an AF_UNIX address."""
    raw = os.fsencode(notify_socket)
    if raw.startswith(b"/"):
        return raw
    if raw.startswith(b"@"):
        # '@' stands for the leading NUL of a Linux abstract socket name.
        return b"\0" + raw[1:]
    raise ConfigError(
        f"NOTIFY_SOCKET={notify_socket!r} is neither a path nor an abstract socket (@name); "
        "conduit supports only AF_UNIX notify sockets"
    )


def _encode(fields: dict[str, str | int]) -> bytes:
    lines = []
    for key, value in fields.items():
        text = str(value)
        if not key.isidentifier():
            raise ValueError(f"sd_notify field name {key!r} is not a plain identifier")
        if "\n" in text or "\0" in text:
            raise ValueError(f"sd_notify value for {key} contains a newline or NUL: {text!r}")
        lines.append(f"{key}={text}")
    return "\n".join(lines).encode()


def _status_field(status: str | None) -> dict[str, str]:
    """A ``STATUS`` field on one line, since a newline would start a new field."""
    if status is None:
        return {}
    return {"STATUS": " ".join(status.replace("\0", " ").splitlines())}


# ---------------------------------------------------------------------------------------
# Watchdog
# ---------------------------------------------------------------------------------------


def watchdog_interval_s(
    environ: MutableMapping[str, str] = os.environ, *, unset: bool = True
) -> float | None:
    """How often to send ``WATCHDOG=1``, or ``None`` when systemd expects no pings.

    That is half of ``WATCHDOG_USEC`` (``WatchdogSec=``), the margin ``sd_watchdog_enabled``
    recommends so that one late ping is not fatal. ``None`` when ``WATCHDOG_USEC`` is unset
    or ``WATCHDOG_PID`` names another process. With ``unset`` (the default) both variables
    are removed from ``environ`` afterwards. Raises ``ConfigError`` for malformed values.
    """
    try:
        usec_text = environ.get("WATCHDOG_USEC")
        if usec_text is None:
            return None
        usec = _parse_count("WATCHDOG_USEC", usec_text)
        if usec == 0:
            raise ConfigError("WATCHDOG_USEC=0 is not a timeout; set WatchdogSec= above zero")
        pid_text = environ.get("WATCHDOG_PID")
        if pid_text is not None and _parse_count("WATCHDOG_PID", pid_text) != os.getpid():
            return None
        return usec / 1_000_000 / 2
    finally:
        if unset:
            _unset(environ, _WATCHDOG_VARS)


async def serve_watchdog(
    notifier: Notifier,
    interval_s: float,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Send ``WATCHDOG=1`` now and every ``interval_s`` seconds; returns only when cancelled.

    Start it with ``await nursery.start(serve_watchdog, notifier, interval_s)`` when
    ``watchdog_interval_s()`` is not ``None``. The pings come from a task on the daemon's
    own Trio loop, so they stop, and systemd restarts the service, exactly when the loop is
    stuck (a blocking call, a busy loop), which is the failure the watchdog exists to catch.
    Raises ``ValueError`` if ``interval_s`` is not positive.
    """
    if not interval_s > 0:  # also refuses NaN
        raise ValueError(f"watchdog interval must be positive, got {interval_s!r}")
    task_status.started()
    while True:
        await notifier.watchdog()
        await trio.sleep(interval_s)


# ---------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------


def _parse_count(variable: str, text: str) -> int:
    """Parse a non-negative decimal integer the way systemd writes one."""
    # int() would also accept '+3', ' 3' and '1_0', none of which systemd produces.
    if not (text.isascii() and text.isdigit()):
        raise ConfigError(f"{variable}={text!r} is not a non-negative integer")
    return int(text)


def _unset(environ: MutableMapping[str, str], names: Iterable[str]) -> None:
    # Deleting from os.environ also calls unsetenv(), so child processes lose them too.
    for name in names:
        environ.pop(name, None)
