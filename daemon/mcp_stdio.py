"""`conduit mcp`: Conduit as an MCP server on standard input and output.

MCP clients (desktop apps, IDEs, agents) start a server as a child process and speak
newline-delimited JSON-RPC on its stdin and stdout. Two ways to be that server:

- **embedded** (`serve_embedded`, the default): a whole daemon runs in this process and
  serves one connection, stdio, as any socket client is served (`Daemon.serve_stream`).
  It opens no client socket unless asked (`--socket`), so it never competes with a
  `conduit serve` for the configured path; the sandboxes' callback socket opens as
  always, in a private directory, and sandboxes still authenticate with their session
  tokens. The stdio peer is the user who started the process, who could read the master
  token file anyway: it gets every scope, as that user does on the Unix socket, unless
  `--client NAME` narrows it to a configured client's scopes and `allowed_tools`. When
  stdin closes, what is in flight is answered and the daemon drains and stops.
- **connect** (`relay_to_daemon`, `--connect [PATH]` or `--connect-tcp HOST:PORT`):
  lines are relayed both ways between stdio and a running daemon's socket, after an
  `auth/login` with `CONDUIT_TOKEN`, or with the master token file when a Unix socket's
  peer credentials have not let the connection in already (`conduit.client.LoginToken`).
  Lines are framed and bounded both ways, never parsed: requests, answers and
  notifications pass unchanged.

Standard output carries nothing but protocol. `claim_stdio` runs first: it moves the
protocol's two descriptors off fds 0 and 1, points fd 1 at stderr and fd 0 at
/dev/null. Whatever else in this process, or any child it starts (Deno, a component
build, npm, an upstream server), writes to fd 1 lands in the log, and nothing can read
the client's requests from under the connection.

Resource handling: `open_stdio_stream` hands out one stream over the claimed fds and,
on the way out, puts them back in blocking mode (Trio made them non-blocking, a change
a terminal would otherwise keep after we exit).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from conduit.client import ConnectionFailed, LoginToken
from conduit.core.errors import ConfigError, InternalError, InvalidRequest, RpcError
from conduit.core.framing import LineReader, Oversize
from conduit.core.protocol import decode, encode, error_reply
from conduit.daemon.auth import ALL_SCOPES, Principal
from conduit.daemon.client_settings import login_token
from conduit.daemon.config import Config, parse_tcp_address
from conduit.daemon.logs import configure_logging

if TYPE_CHECKING:  # the relay never loads the daemon (~45 MB, seconds of imports)
    from conduit.daemon.server import Daemon

__all__ = [
    "StdioFds",
    "claim_stdio",
    "open_stdio_stream",
    "relay_to_daemon",
    "run_command",
    "serve_embedded",
    "stdio_principal",
]

log = logging.getLogger("conduit.mcp")

# A reply carries at most the configured maxima of output and result (16 MiB each by
# default), JSON-escaped; this bounds what a relay buffers for a daemon gone wrong, and
# is no workload's limit.
MAX_REPLY_BYTES = 256 * 1024 * 1024
# The relay's own request, which no client can have sent before it.
_AUTH_ID = "conduit-mcp:auth"


@dataclass(frozen=True, slots=True)
class StdioFds:
    """The protocol's descriptors once claimed: the client's requests and our answers."""

    read_fd: int
    write_fd: int


def claim_stdio() -> StdioFds:
    """Take fds 0 and 1 for the protocol alone; call it before anything can print.

    Returns private duplicates of them (not inherited by children); fd 1 then refers to
    stderr and fd 0 to /dev/null, for this process and every child it starts.
    """
    fds = StdioFds(os.dup(0), os.dup(1))
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(devnull, 0)
    finally:
        os.close(devnull)
    os.dup2(2, 1)
    return fds


@asynccontextmanager
async def open_stdio_stream(fds: StdioFds) -> AsyncIterator[trio.StapledStream]:
    """One Trio stream over the claimed fds; they are closed and back in blocking mode
    afterwards (whoever holds the stream may close it first: `Connection` does)."""
    stream = trio.StapledStream(
        trio.lowlevel.FdStream(os.dup(fds.write_fd)), trio.lowlevel.FdStream(os.dup(fds.read_fd))
    )
    try:
        yield stream
    finally:
        with trio.CancelScope(shield=True):
            await stream.aclose()
        for fd in (fds.read_fd, fds.write_fd):
            os.set_blocking(fd, True)
            os.close(fd)


# ---- embedded -------------------------------------------------------------------------


def stdio_principal(daemon: Daemon, client: str | None) -> Principal:
    """Who the stdio peer is: this process's user with every scope, or client `client`.

    Raises `ConfigError` if `auth.clients` has no client named `client`.
    """
    if client is None:
        return Principal(f"uid:{os.getuid()}", "peer", ALL_SCOPES)
    principal = daemon.auth.client_principal(client)
    if principal is None:
        known = ", ".join(c.name for c in daemon.config.auth.clients) or "none"
        raise ConfigError(
            f"--client {client}: no such client in auth.clients (configured: {known}); "
            "add it with `conduit token new --name NAME`"
        )
    return principal


async def serve_embedded(
    config: Config,
    fds: StdioFds,
    *,
    reload: Callable[[], Config] | None = None,
    client: str | None = None,
) -> None:
    """Run a daemon for `config` and serve MCP on the claimed stdio until stdin closes.

    Returns once the daemon has drained and stopped: after stdin closes (in-flight
    requests are answered first) or on SIGTERM/SIGINT (the daemon's drain, within
    `server.grace_period_s`). Raises `ConfigError` if the daemon cannot start.
    """
    from conduit.daemon.server import Daemon

    # `conduit mcp` is a process of the daemon's own, as `conduit serve` is.
    daemon = Daemon(config, reload=reload, owns_process=True)
    principal = stdio_principal(daemon, client)
    async with open_stdio_stream(fds) as stdio, trio.open_nursery() as nursery:
        await nursery.start(_serve_until_stopped, daemon, nursery.cancel_scope)
        log.info("serving MCP on stdio", extra={"principal": principal.name})
        await daemon.serve_stream(stdio, transport="stdio", principal=principal)
        daemon.shutdown()


async def _serve_until_stopped(
    daemon: Daemon,
    scope: trio.CancelScope,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The daemon's `serve`; once it returns (a signal drained it), stdio goes too."""
    await daemon.serve(handle_signals=True, allow_no_listener=True, task_status=task_status)
    scope.cancel()


# ---- connect --------------------------------------------------------------------------


async def _open_daemon_stream(unix_path: str | None, tcp: str | None) -> trio.SocketStream:
    where = tcp or unix_path
    try:
        if tcp:
            return await trio.open_tcp_stream(*parse_tcp_address(tcp))
        return await trio.open_unix_socket(str(unix_path))
    except (OSError, ValueError) as exc:
        raise ConnectionFailed(
            f"cannot reach the daemon at {where}: {getattr(exc, 'strerror', None) or exc}; "
            "is `conduit serve` running there?"
        ) from None


async def _log_in(
    stream: trio.SocketStream, replies: AsyncIterator[object], login: LoginToken
) -> None:
    """Authenticate the relayed connection as `conduit.client` does; raises the daemon's
    `RpcError` if the token is refused."""
    if login.fallback and (await _ask(stream, replies, "auth/whoami", {})).get("authenticated"):
        return
    await _ask(stream, replies, "auth/login", {"token": login.token})


async def _ask(
    stream: trio.SocketStream, replies: AsyncIterator[object], method: str, params: dict[str, Any]
) -> dict[str, Any]:
    """One request of the relay's own before relaying starts: its result."""
    request = {"jsonrpc": "2.0", "id": _AUTH_ID, "method": method, "params": params}
    await stream.send_all(encode(request) + b"\n")
    try:
        line = await anext(replies)
    except StopAsyncIteration:
        raise ConnectionFailed(f"the daemon closed the connection during {method}") from None
    reply = decode(line) if isinstance(line, bytes) else None
    if not isinstance(reply, dict) or reply.get("id") != _AUTH_ID:
        raise ConnectionFailed(f"the daemon did not answer {method}: {line!r:.200}")
    if "error" in reply:
        raise RpcError.from_wire(reply["error"])
    result = reply.get("result")
    return result if isinstance(result, dict) else {}


async def relay_to_daemon(
    config: Config, fds: StdioFds, *, unix_path: str | None = None, tcp: str | None = None
) -> bool:
    """Relay MCP between the claimed stdio and a running daemon until either side ends.

    Connects to `tcp` (`HOST:PORT`) if given, else to `unix_path`, and logs in first.
    Returns True when the client ended it (closed stdin, and the daemon then answered
    what was in flight; or stopped reading), False when the daemon closed first. Raises
    `ConnectionFailed` if the daemon cannot be reached or there is no token for TCP,
    and the daemon's `RpcError` if the token is refused.
    """
    login = login_token(config)
    if tcp and login is None:
        raise ConnectionFailed(
            "no token to present over TCP: set CONDUIT_TOKEN, or make the master token "
            "file readable (see the daemon's log for its path)"
        )
    stream = await _open_daemon_stream(unix_path, tcp)
    async with stream, aclosing(LineReader(stream, MAX_REPLY_BYTES).__aiter__()) as replies:
        if login is not None:
            await _log_in(stream, replies, login)
        async with open_stdio_stream(fds) as stdio:
            log.info("relaying MCP on stdio", extra={"daemon": tcp or unix_path})
            return await _relay(stdio, stream, replies, config.server.max_message_bytes)


async def _relay(
    stdio: trio.abc.Stream,
    daemon: trio.SocketStream,
    replies: AsyncIterator[object],
    max_request_bytes: int,
) -> bool:
    """Relay until the daemon's side ends; True if the client ended it first."""
    sending = trio.Lock()  # both directions write to stdout: replies, and our refusals
    client_ended = False
    async with trio.open_nursery() as nursery:

        async def to_client(message: bytes) -> None:
            nonlocal client_ended
            try:
                async with sending:
                    await stdio.send_all(message)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                # The client stopped reading: it has gone, and nobody is left to answer.
                client_ended = True
                nursery.cancel_scope.cancel()

        async def requests() -> None:
            nonlocal client_ended
            lines = LineReader(stdio, max_request_bytes).__aiter__()
            try:
                # Closed here whichever way the loop ends, not whenever the collector runs.
                async with aclosing(lines):
                    async for line in lines:
                        if isinstance(line, Oversize):
                            refusal = InvalidRequest(
                                f"message too large: a line may hold at most "
                                f"{max_request_bytes} bytes; the line was discarded"
                            )
                            await to_client(encode(error_reply(None, refusal)) + b"\n")
                        else:
                            await daemon.send_all(line + b"\n")  # type: ignore[operator]
                client_ended = True
                # The daemon answers what is in flight, then closes: the reply loop ends.
                await daemon.send_eof()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the daemon has gone; the reply loop ends with it

        nursery.start_soon(requests)
        try:
            async for line in replies:
                if isinstance(line, Oversize):
                    log.error("dropped a reply larger than %d bytes", MAX_REPLY_BYTES)
                    dropped = InternalError(
                        f"internal error: a reply over {MAX_REPLY_BYTES} bytes was dropped"
                    )
                    await to_client(encode(error_reply(None, dropped)) + b"\n")
                else:
                    await to_client(line + b"\n")  # type: ignore[operator]
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the daemon reset the connection
        nursery.cancel_scope.cancel()
    return client_ended


# ---- the command ----------------------------------------------------------------------


def run_command(args: argparse.Namespace, load_config: Callable[..., Config]) -> int:
    """`conduit mcp`: claim stdio, then serve embedded or relay; the exit status.

    0 when the client ended the session; 3 when the daemon relayed to closed first.
    `load_config(args, **overrides)` reads the configuration; its `ConfigError`, a
    `ConnectionFailed` or a refused login propagate to the command line's handler.
    """
    fds = claim_stdio()
    connect = args.connect is not None or args.connect_tcp
    if connect and (args.socket or args.client):
        raise ConfigError("--socket and --client are for the embedded daemon, not --connect")
    if connect:
        config = load_config(args, **{"server.state_dir": args.state_dir})
        configure_logging(config.server.log_level)
        unix_path = args.connect or config.server.socket
        ended_by_client = trio.run(
            partial(relay_to_daemon, config, fds, unix_path=unix_path, tcp=args.connect_tcp)
        )
        if not ended_by_client:
            where = args.connect_tcp or unix_path
            log.error("the daemon closed the connection", extra={"daemon": where})
            return 3
        return 0
    # The config file's listeners belong to `conduit serve`; this daemon's client is stdio.
    overrides = {
        "server.socket": args.socket or "",
        "server.tcp": "",
        "server.state_dir": args.state_dir,
    }
    reload = partial(load_config, args, **overrides)
    config = reload()
    configure_logging(config.server.log_level)
    trio.run(partial(serve_embedded, config, fds, reload=reload, client=args.client))
    return 0
