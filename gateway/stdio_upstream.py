"""Upstream MCP servers that run as child processes and speak over stdin/stdout.

`StdioUpstream` is a `SessionKeeper` (see `keeper.py`: handshake, listing, calls,
back-off) over `open_stdio_transport`, a Trio-native transport with the SDK's stream
contract (`SessionMessage`s, one JSON-RPC message per line), plus `DirectRequests` on
the same pipe: tool calls go out from the caller's task and their answers come back
from the reader without passing through the SDK session (see `direct_requests.py`).

Why not the SDK's `mcp.client.stdio.stdio_client`: it runs under Trio, but (as of mcp
2.3.0) it buffers a line without bound and re-joins the buffer for every chunk (a
50 MB answer takes 8 s; a server that never writes a newline grows the daemon without
limit), it skips the process-group kill when the server exits on its own (so the
server's own children outlive it), and it hides the process, so its exit status cannot
be reported. This transport keeps the SDK's shutdown order (close stdin, wait, SIGTERM
the group, SIGKILL the group), bounded and shielded, and adds what is missing.

Resource handling: the process, its pipes and the pump tasks belong to the task that
enters `open_stdio_transport`; leaving it stops the process group within
`EXIT_GRACE_S + TERM_GRACE_S + KILL_REAP_S`, even when cancelled. The child gets its
own session (so its process group can be killed as one), `close_fds`, and an
environment of a few harmless variables plus the upstream's `env`, never the daemon's.

A line longer than `MAX_MESSAGE_BYTES` is skipped unheld (`core.framing`); a response
among them fails only the request it answered, read by its id (see `_answer_skipped`).

This module does not know about tools or the MCP protocol beyond line framing and
the answer to a request whose response was skipped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import mcp_types as types
import trio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

from conduit.core.framing import LineReader, Oversize
from conduit.core.protocol import skipped_response_id
from conduit.gateway.direct_requests import DirectRequests
from conduit.gateway.keeper import (
    MAX_MESSAGE_BYTES,
    Misconfigured,
    RateLimit,
    SessionKeeper,
    TransportStreams,
    answer_too_large,
)
from conduit.gateway.settings import StdioUpstreamSettings

__all__ = ["StdioUpstream", "child_environment", "open_stdio_transport"]

log = logging.getLogger("conduit.gateway.upstream")

# Pipe reads: the kernel's pipe buffer is 64 KiB, so larger reads rarely fill.
READ_CHUNK_BYTES = 64 * 1024
# Stop sequence, as in the SDK: a server exits on its own once stdin closes; 2 s for
# that, 2 s more after SIGTERM, then SIGKILL and up to 2 s to see it reaped.
EXIT_GRACE_S = 2.0
TERM_GRACE_S = 2.0
KILL_REAP_S = 2.0
# After the server process exits, how long its last messages may take to arrive
# before a child that kept stdout open is ignored.
STDOUT_DRAIN_S = 0.5
# stderr goes to the daemon's log line by line; a line longer than this is cut.
MAX_STDERR_LINE_CHARS = 2000
# The last stderr lines are kept to explain a server that dies.
STDERR_TAIL_LINES = 5
# Parts of a line that failed to parse, shown in errors.
PREVIEW_CHARS = 120


def child_environment(env: dict[str, str]) -> dict[str, str]:
    """The environment of an upstream process: the SDK's safe defaults plus `env`.

    The defaults are the variables programs need to find things (PATH, HOME, USER,
    LOGNAME, SHELL, TERM), taken from the daemon's environment; nothing else of the
    daemon's is passed on, so its secrets stay in the daemon.
    """
    return get_default_environment() | env


class StdioUpstream(SessionKeeper):
    """An MCP server Conduit starts, talks to over stdio, and restarts when it dies."""

    transport = "stdio"

    def __init__(self, settings: StdioUpstreamSettings) -> None:
        super().__init__(settings)
        self._stdio = settings
        self._stderr = _StderrLog(settings.name)
        self._exit_status: int | None = None
        self._direct: DirectRequests | None = None

    @asynccontextmanager
    async def _open_transport(
        self, ended: Callable[[str], None]
    ) -> AsyncIterator[TransportStreams]:
        # `ended` is not needed: a stdio connection ends exactly when its read stream does.
        self._exit_status = None
        self._stderr.tail.clear()
        started: list[trio.Process] = []
        try:
            async with open_stdio_transport(self._stdio, on_stderr=self._stderr.feed) as (
                process,
                read_stream,
                write_stream,
                direct,
            ):
                started.append(process)
                self._direct = direct
                yield read_stream, write_stream
        finally:
            self._direct = None
            # Leaving the transport reaped the process; `_explain` reports how it ended.
            if started:
                self._exit_status = started[0].returncode

    def _direct_requests(self) -> DirectRequests | None:
        return self._direct

    def _explain(self, exc: BaseException) -> str:
        parts = [super()._explain(exc)]
        if self._exit_status is not None:
            parts.append(f"the server process exited with {_exit_text(self._exit_status)}")
        if self._stderr.tail:
            parts.append("its last stderr: " + " | ".join(self._stderr.tail))
        return "; ".join(parts)


@asynccontextmanager
async def open_stdio_transport(
    settings: StdioUpstreamSettings, *, on_stderr: Callable[[str], None]
) -> AsyncIterator[
    tuple[
        trio.Process,
        MemoryObjectReceiveStream[SessionMessage | Exception],
        MemoryObjectSendStream[SessionMessage],
        DirectRequests,
    ]
]:
    """Start the server and yield `(process, read_stream, write_stream, direct)`.

    The streams carry `SessionMessage`s (and, on the read side, an `Exception` for a
    line that is not JSON-RPC), as every SDK transport's do. The read stream ends when
    the server closes stdout or exits. `direct` sends requests on the same stdin and
    gets the answers to them before the read stream sees anything; whoever reads the
    read stream should close `direct` when it ends (so that its callers hear of the end
    no sooner than the session does), and leaving the transport closes it anyway.
    Each stderr line goes to `on_stderr`.

    Raises `Misconfigured` if the command cannot be started at all. On exit (also when
    cancelled) the process group is stopped and reaped, within bounded time.
    """
    process = await _spawn(settings)
    # No awaits until the try: a cancellation in between would leak the process.
    read_send, read_receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_receive = anyio.create_memory_object_stream[SessionMessage](0)
    reader = trio.CancelScope()
    assert process.stdin is not None
    # A write that finds the server gone ends the session rather than let requests hang.
    direct = DirectRequests(process.stdin.send_all, broken=reader.cancel)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_read_messages, process.stdout, read_send, reader, direct)
            nursery.start_soon(_write_messages, process.stdin, write_receive, direct, reader)
            nursery.start_soon(_pump_stderr, process.stderr, on_stderr)
            nursery.start_soon(_end_with_process, process, reader)
            try:
                yield process, read_receive, write_send, direct
            finally:
                with trio.CancelScope(shield=True):
                    await _stop(process)
                nursery.cancel_scope.cancel()
    finally:
        direct.close()
        if process.returncode is None:  # `_stop` never ran: the nursery failed to open
            _signal_group(process, signal.SIGKILL)
        # Each side is normally closed by its user; closing again is a no-op.
        for stream in (read_send, read_receive, write_send, write_receive):
            stream.close()


async def _spawn(settings: StdioUpstreamSettings) -> trio.Process:
    try:
        return await trio.lowlevel.open_process(
            [settings.command, *settings.args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_environment(settings.env),
            cwd=settings.cwd,
            # Its own session, so its process group is its pid and can be killed whole.
            start_new_session=True,
            close_fds=True,
        )
    except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        raise Misconfigured(
            f"cannot start {settings.command!r}: {exc.strerror}"
            + (f" ({exc.filename})" if exc.filename else "")
            + "; fix command, args or cwd in the upstream's configuration"
        ) from exc


async def _read_messages(
    stdout: trio.abc.ReceiveStream | None,
    messages: MemoryObjectSendStream[SessionMessage | Exception],
    scope: trio.CancelScope,
    direct: DirectRequests,
) -> None:
    """Split stdout into lines; answers to `direct` requests go to them, every other
    line is parsed for the session. The end of stdout closes `messages`.

    A line longer than `MAX_MESSAGE_BYTES` is skipped, never held (`LineReader`),
    and fails the request it answers (`_answer_skipped`); one that shows no such
    request ends the connection.
    """
    assert stdout is not None
    reader = LineReader(_Pipe(stdout), MAX_MESSAGE_BYTES)
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        async with messages, contextlib.aclosing(reader.__aiter__()) as lines:
            with scope:
                async for line in lines:
                    if isinstance(line, Oversize):
                        if not await _answer_skipped(line, messages, direct):
                            return
                    elif not direct.take(line):
                        await messages.send(_parse(line))


async def _answer_skipped(
    line: Oversize,
    messages: MemoryObjectSendStream[SessionMessage | Exception],
    direct: DirectRequests,
) -> bool:
    """Answer the request a skipped response was for with `answer_too_large`, in place
    of that response: through `direct` if it is one of its requests, else through the
    session. False, having told the session, when the line shows no response id.

    Then the connection must end: the line may have been the answer some request waits
    for, and which one cannot be told, so only closing the connection fails it (at
    once, with the others in flight, rather than after its timeout). Failing the oldest
    call instead could fail another caller's call and leave the right one waiting.
    """
    request_id = skipped_response_id(line.opening, line.ending)
    if request_id is None:
        await messages.send(
            ValueError(
                f"a message of {line.size} bytes exceeds the {MAX_MESSAGE_BYTES} bytes the "
                "daemon reads, and no response id shows at its start or end; disconnecting"
            )
        )
        return False
    error = answer_too_large(line.size, MAX_MESSAGE_BYTES)
    # A float id names no request: the SDK's ids are integers, `direct`'s strings.
    if not direct.answer_error(request_id, error) and not isinstance(request_id, float):
        reply = types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)
        await messages.send(SessionMessage(reply))
    return True


class _Pipe:
    """The upstream's stdout, ending where it breaks or is closed (the process is gone
    either way)."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return await _receive(self._stream, max_bytes or READ_CHUNK_BYTES)


async def _receive(stream: trio.abc.ReceiveStream, max_bytes: int = READ_CHUNK_BYTES) -> bytes:
    try:
        return await stream.receive_some(max_bytes)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return b""


def _parse(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError:  # pydantic's ValidationError, invalid JSON included
        preview = line[:PREVIEW_CHARS].decode("utf-8", "replace")
        return ValueError(f"not a JSON-RPC message: {preview!r}")


async def _write_messages(
    stdin: trio.abc.SendStream | None,
    messages: MemoryObjectReceiveStream[SessionMessage],
    direct: DirectRequests,
    reader: trio.CancelScope,
) -> None:
    """One line per message, through `direct` (which owns the writes to stdin); stdin
    closes when the session closes its write side."""
    assert stdin is not None
    try:
        async with messages:
            async for message in messages:
                line = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                await direct.send_line(line.encode() + b"\n")
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        # The server stopped reading: end the session rather than let requests hang.
        reader.cancel()
    finally:
        # Closing stdin is the spec's request for a stdio server to exit.
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stdin.aclose()


async def _pump_stderr(stderr: trio.abc.ReceiveStream | None, sink: Callable[[str], None]) -> None:
    """Hand each stderr line to `sink`, cut at `MAX_STDERR_LINE_CHARS`; never buffers more."""
    assert stderr is not None
    pending = bytearray()
    while chunk := await _receive(stderr):
        pending += chunk
        *lines, rest = pending.split(b"\n")
        for line in lines:
            sink(_stderr_text(line))
        if len(rest) > MAX_STDERR_LINE_CHARS:
            sink(_stderr_text(rest))
            rest = b""
        pending = bytearray(rest)
    if pending:
        sink(_stderr_text(pending))


def _stderr_text(line: bytes | bytearray) -> str:
    text = line[: MAX_STDERR_LINE_CHARS + 1].decode("utf-8", "replace").rstrip()
    return text if len(text) <= MAX_STDERR_LINE_CHARS else text[:MAX_STDERR_LINE_CHARS] + "…"


async def _end_with_process(process: trio.Process, reader: trio.CancelScope) -> None:
    """End the session when the server exits, even if a child keeps stdout open.

    The server's last messages are still on their way when it exits, so the reader
    gets `STDOUT_DRAIN_S` to reach the end of stdout by itself first. What the server
    started goes at once (what it wrote stays in the pipe): its group's id is surely
    still theirs only now (see `_stop`).
    """
    await process.wait()
    _signal_group(process, signal.SIGKILL)
    await trio.sleep(STDOUT_DRAIN_S)
    reader.cancel()


async def _stop(process: trio.Process) -> None:
    """Stop the server and everything it started; every wait is bounded.

    Order as the MCP spec and the SDK: close stdin, wait, SIGTERM, wait, SIGKILL. The
    group is swept with SIGKILL at the end even when the server exited by itself,
    because its children (`npx` starts `node`) would otherwise outlive it; a server
    that had exited before had its group swept then (`_end_with_process`).
    """
    exited_before = process.returncode is not None
    if process.stdin is not None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await process.stdin.aclose()
    with trio.move_on_after(EXIT_GRACE_S):
        await process.wait()
    for sig, wait_s in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, KILL_REAP_S)):
        if process.returncode is not None:
            break
        _signal_group(process, sig)
        with trio.move_on_after(wait_s):
            await process.wait()
    if process.returncode is None:
        log.warning("upstream process %d survived SIGKILL; abandoning it", process.pid)
    # The leader is reaped now, so its pid could in principle be reused; but a process
    # group id stays taken while any member lives, so if children remain the id is still
    # theirs, and if none remain the kill finds nothing (reuse would need the kernel to
    # cycle through every pid between two system calls). Not so for a leader reaped
    # long before: its id may be a new group's by now (a sandboxed worker's, say).
    if not exited_before:
        _signal_group(process, signal.SIGKILL)


def _signal_group(process: trio.Process, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def _exit_text(status: int) -> str:
    if status < 0:
        try:
            return f"signal {signal.Signals(-status).name}"
        except ValueError:
            return f"signal {-status}"
    return f"status {status}"


class _StderrLog:
    """An upstream's stderr in the daemon log: bounded lines, a rate limit, a short tail."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self._limit = RateLimit()

    def feed(self, line: str) -> None:
        if not line:
            return
        self.tail.append(line)
        if not self._limit.allow():
            return
        if suppressed := self._limit.take_suppressed():
            log.info(
                "upstream %s: %d stderr lines not logged (rate limit)",
                self.upstream,
                suppressed,
                extra={"upstream": self.upstream},
            )
        log.info(
            "upstream %s stderr: %s",
            self.upstream,
            line,
            extra={"upstream": self.upstream, "stream": "stderr"},
        )
