"""`serve()`: the daemon's root nursery and everything it owns.

```
serve(config, *, task_status)         root nursery
├── audit.run → the audit store's writer and upkeep
├── registry.serve → each executor's pool
├── catalogue.serve → one task per upstream, holding its MCP session
├── metrics endpoint (HTTP, loopback) → one task per scrape
├── MCP over HTTP (loopback, if configured) → one task per HTTP connection, session expiry
├── watchdog, signal receiver
└── connections nursery ← one Connection.run per accepted stream
    (acceptors: one accept loop per listener, cancelled first on shutdown)
```

Shutdown drains the way hypercorn does: stop accepting, let connections finish their
in-flight requests within `grace_period_s`, then cancel what is still running (those
executions answer `cancelled` with their partial output), remove the socket file.

Error handling: whatever one connection raises (a reply that cannot be written, a bug)
is logged with an error id and closes that connection alone; it never reaches the
connections nursery, which would take every other connection and the daemon with it.
Each listener kind has its own `ConnectionBudget`, so a flood on TCP never keeps the
owner off the Unix socket, nor the sandboxes off their callback socket. Refusing a
connection, or failing to accept one, is logged at most once per kind every
`REFUSAL_LOG_EVERY_S`, the next line counting those left out (`suppressed`): a peer
connecting in a loop must not flood the log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import os
import re
import resource
import secrets
import signal
import stat
import sys
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import trio

from conduit.core.errors import ConfigError, Overloaded
from conduit.core.left_calls import LeftCalls
from conduit.core.protocol import encode, error_reply
from conduit.core.redaction import redact
from conduit.daemon import systemd
from conduit.daemon.audit import AuditStore
from conduit.daemon.auth import (
    Authenticator,
    PeerCredentials,
    Principal,
    peer_credentials,
    resolve_master_token,
)
from conduit.daemon.bridge import SessionBridge
from conduit.daemon.config import Config, parse_tcp_address
from conduit.daemon.connection import Connection, ConnectionLimits
from conduit.daemon.control import DaemonStatistics
from conduit.daemon.dispatcher import Dispatcher
from conduit.daemon.events import EventBus
from conduit.daemon.executions import Executions
from conduit.daemon.http_origin import OriginPolicy
from conduit.daemon.limits import Admission, ConnectionBudget, ConnectionSlot, RateLimiter
from conduit.daemon.listeners import (
    BoundListener,
    open_sandbox_listener,
    open_tcp_listener,
    open_unix_listener,
    remove_socket_file,
)
from conduit.daemon.mcp_http import HttpLimits, McpHttpEndpoint
from conduit.daemon.mcp_sessions import McpSessions
from conduit.daemon.methods import method_table
from conduit.daemon.metrics import CONTENT_TYPE, GaugeSources, Metrics
from conduit.daemon.metrics_endpoint import MetricsEndpoint
from conduit.daemon.policy import Policy
from conduit.daemon.sessions import Sessions
from conduit.daemon.tool_access import ToolAccess
from conduit.daemon.wiring import build_catalogue, build_registry, language_defaults
from conduit.executors.base import CallbackAddress
from conduit.executors.registry import ExecutorRegistry
from conduit.gateway.keeper import RateLimit

__all__ = ["Daemon", "ServingInfo", "serve"]

log = logging.getLogger("conduit.server")

# After the grace period, cancelled executions still need a moment to report back.
_CANCEL_REPORT_S = 2.0
# How long to back off when accept() fails for lack of file descriptors.
_ACCEPT_BACKOFF_S = 0.1
# How long the line telling a refused peer why may take: it must not hold the fd longer.
_REFUSAL_S = 1.0
# A peer can be refused as often as it connects; a line of each kind this often (with
# how many were left out) tells an operator as much as a line per connection would.
REFUSAL_LOG_EVERY_S = 10.0
# Bytes read from standard input at a time, when its end is what is awaited.
_STDIN_CHUNK = 4096


@dataclass(frozen=True, slots=True)
class ServingInfo:
    """Where the daemon listens, handed to whoever started it."""

    unix_path: str | None
    tcp_address: tuple[str, int] | None
    token_source: str
    listeners: tuple[str, ...] = field(default=())
    # Where GET /metrics answers (None: metrics off, or the port could not be bound).
    metrics_address: tuple[str, int] | None = None
    # Where MCP over HTTP answers (None: not configured).
    mcp_http_address: tuple[str, int] | None = None


class Daemon:
    """The daemon: builds its parts from the configuration, and `serve` runs them.

    Its parts are handed what they use of each other, not the daemon: methods reach
    them through their `CallContext`, and `config/reload` and `daemon/status` reach
    the daemon itself as its `Control`.
    """

    def __init__(
        self,
        config: Config,
        *,
        reload: Callable[[], Config] | None = None,
        owns_process: bool = False,
    ) -> None:
        _prepare_state_dir(config.server.state_dir)
        self.config = config
        self._reload = reload
        # Whether the process is this daemon's alone (`conduit serve`): its start-up
        # objects are then set apart from the collector (`_freeze_start_up`).
        self._owns_process = owns_process
        master_token, self.token_source = resolve_master_token(config.auth, config.server.state_dir)
        redact(master_token)
        self.auth = Authenticator(master_token, config.auth)
        limits = config.limits
        self.admission = Admission(
            limits.max_concurrent_executions, limits.queue_size, limits.queue_timeout_s
        )
        self.rate_limiter = RateLimiter(limits.executions_per_minute, limits.burst)
        self.events = EventBus(buffer=config.events.subscriber_buffer)
        self.methods = method_table()
        self.connections: set[Connection] = set()
        # Before the executions: their answers wait for its commits.
        self.audit = AuditStore(config.audit, config.server.state_dir)
        # Sandboxes' calls going on after their workers exited (`LeftRequests`).
        self.left_calls = LeftCalls()
        # The executors are built by `serve`, once it knows where sandboxes call back.
        self.executions = Executions(
            limits,
            Policy(config.policy),
            registry=ExecutorRegistry([], {}),
            admission=self.admission,
            rate_limiter=self.rate_limiter,
            events=self.events,
            open_bridge=self.open_bridge,
            wait_recorded=self.audit.wait_recorded if config.audit.enabled else None,
        )
        self.sessions = Sessions(
            config.sessions,
            registry=self.executions.registry,
            events=self.events,
            limits_for=self.executions.limits_for,
            queue_timeout_s=limits.queue_timeout_s,
            charge=self.rate_limiter.check,
        )
        self.tools = ToolAccess(
            build_catalogue(config),
            events=self.events,
            ledger=self.executions,
            call_timeout_s=config.gateway.call_timeout_s,
        )
        self.tools.catalogue.watch(self._tools_changed)
        self.metrics = Metrics(
            self.methods,
            GaugeSources(
                connections=self.connections,
                auth=self.auth,
                events=self.events,
                admission=self.admission,
                executions=self.executions,
                catalogue=self.tools.catalogue,
                sessions=self.sessions,
                audit=self.audit,
            ),
        )
        self.events.add_sink(self.metrics.observe)
        if config.audit.enabled:
            self.events.add_sink(self.audit.record_nowait)
        # Where the metrics are served, or why they are not (set by `serve`).
        self.metrics_address: tuple[str, int] | None = None
        self.metrics_error: str | None = None
        self.dispatcher = Dispatcher(
            self.methods,
            executions=self.executions,
            tools=self.tools,
            events=self.events,
            audit=self.audit,
            admission=self.admission,
            control=self,
            sessions=self.sessions,
            count_request=self.metrics.count_request,
        )
        self.callback_address: CallbackAddress | None = None
        mcp_http = config.mcp_http
        self.mcp_sessions = McpSessions(
            mcp_http.max_sessions_per_principal,
            mcp_http.max_sessions,
            mcp_http.session_idle_timeout_s,
        )
        self.mcp_http: McpHttpEndpoint | None = None
        self.mcp_http_address: tuple[str, int] | None = None
        self.budgets = _budgets(config)
        self.started_at = trio.current_time() if _in_trio() else 0.0
        self._notifier = systemd.Notifier(None)
        self._acceptors: trio.CancelScope | None = None
        self._stopping = False  # shutdown() was asked
        self._refusal_log = _ThrottledLog(REFUSAL_LOG_EVERY_S)

    @property
    def registry(self) -> ExecutorRegistry:
        """The executors programs run on (empty until `serve` builds them)."""
        return self.executions.registry

    @property
    def policy(self) -> Policy:
        """What programs are checked against before they run."""
        return self.executions.policy

    def open_bridge(
        self,
        execution_id: str,
        tool_patterns: tuple[tuple[str, ...], ...],
        owner: str | None = None,
    ) -> SessionBridge:
        """One execution's way back in for its tool calls (started by `owner`), under
        a session token of its own that ends when the bridge exits."""
        return SessionBridge(
            self.auth,
            self.dispatcher.dispatch,
            execution_id,
            tool_patterns,
            owner=owner,
            callback=self.callback_address,
        )

    def statistics(self) -> DaemonStatistics:
        """A snapshot of the daemon's own state (`daemon/status`)."""
        sandboxes = sum(c.transport == "sandbox" for c in self.connections)
        return DaemonStatistics(
            uptime_s=trio.current_time() - self.started_at,
            config_source=self.config.source or None,
            connections=len(self.connections) - sandboxes,
            sandbox_connections=sandboxes,
            auth_failures=self.auth.failures,
            metrics_enabled=self.config.metrics.enabled,
            metrics_url=self.metrics_url(),
            metrics_error=self.metrics_error,
            mcp_http_url=self.mcp_http_url(),
            mcp_http_sessions=len(self.mcp_sessions),
            unready_reason=self.unready_reason(),
            preparing=tuple(self.registry.preparing()),
        )

    def _tools_changed(self) -> None:
        """Tell every MCP client its tool list changed (the capability `initialize` states).

        Every one hears it, whatever it may see: re-listing costs a client little, and
        the execute tools' descriptions, which list the callable tools, change too.
        """
        for connection in list(self.connections):
            if connection.mcp_session:
                connection.notify_nowait("notifications/tools/list_changed", {})
        for session in self.mcp_sessions.sessions():  # those with a standalone stream
            if session.mcp_session:
                session.notify_nowait("notifications/tools/list_changed", {})

    # ---- running -----------------------------------------------------------------

    async def serve(
        self,
        *,
        handle_signals: bool = False,
        allow_no_listener: bool = False,
        task_status: trio.TaskStatus[ServingInfo] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve until `shutdown()` (or SIGTERM with `handle_signals`); then drain.

        With `allow_no_listener`, a configuration without `server.socket` or
        `server.tcp` opens no client listener (clients come through `serve_stream`)
        instead of being refused; the sandboxes' callback socket opens regardless.
        """
        self.started_at = trio.current_time()
        _raise_fd_limit()
        self._notifier = systemd.Notifier.from_environ()
        bound = await self._open_listeners(allow_none=allow_no_listener)
        try:
            sandbox = await open_sandbox_listener(_unix_directory(bound))
            bound.append(sandbox)
            self.callback_address = CallbackAddress(
                unix_path=sandbox.address, max_message_bytes=self.config.server.max_message_bytes
            )
            async with trio.open_nursery() as root:
                await root.start(self.audit.run)
                self.executions.registry = build_registry(self.config, self.callback_address)
                self.sessions.registry = self.executions.registry
                await root.start(self.registry.serve)
                if self._owns_process:
                    root.start_soon(_freeze_start_up, self.registry)
                await root.start(self.sessions.serve)
                await root.start(self.tools.catalogue.serve)
                await self._start_metrics(root)
                await self._start_mcp_http(root)
                if handle_signals:
                    root.start_soon(self._handle_signals)
                interval = systemd.watchdog_interval_s()
                if interval:
                    root.start_soon(systemd.serve_watchdog, self._notifier, interval)
                await self._serve_connections(bound, task_status)
                root.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await _close_listeners(bound)
            log.info("stopped")

    async def _serve_connections(
        self, bound: list[BoundListener], task_status: trio.TaskStatus[ServingInfo]
    ) -> None:
        async with trio.open_nursery() as connections:
            async with trio.open_nursery() as acceptors:
                self._acceptors = acceptors.cancel_scope
                if self._stopping:  # asked while starting
                    acceptors.cancel_scope.cancel()
                # Holds the nursery open until shutdown() even with no listener at all.
                acceptors.start_soon(trio.sleep_forever)
                for listener in bound:
                    acceptors.start_soon(self._accept_loop, listener, connections)
                info = self._serving_info(bound)
                self._announce(info)
                task_status.started(info)
                await self._notifier.ready(f"listening on {', '.join(info.listeners)}")
            with trio.CancelScope(shield=True):
                await _close_listeners(bound)
            await self._drain(connections)

    async def _start_metrics(self, root: trio.Nursery) -> None:
        """Serve the metrics in `root`, if enabled. A port that cannot be bound is
        logged and left out rather than stopping the daemon: metrics are for watching
        it work, not a reason for it not to."""
        settings = self.config.metrics
        if not settings.enabled:
            return
        try:
            bound = await open_tcp_listener(*parse_tcp_address(settings.listen))
        except ConfigError as exc:
            self.metrics_error = (
                f"{exc}; set metrics.listen to a free port or metrics.enabled = false"
            )
            log.error("metrics not served", extra={"reason": self.metrics_error})
            return
        endpoint = MetricsEndpoint(self.metrics.exposition, CONTENT_TYPE, self.unready_reason)
        await root.start(endpoint.serve, bound.listener)
        self.metrics_address = parse_tcp_address(bound.address)

    async def _start_mcp_http(self, root: trio.Nursery) -> None:
        """Serve MCP over HTTP in `root`, if configured. Unlike the metrics, a port
        that cannot be bound stops the start (`ConfigError`): clients depend on it."""
        settings = self.config.mcp_http
        if not settings.listen:
            return
        bound = await open_tcp_listener(*parse_tcp_address(settings.listen))
        server = self.config.server
        endpoint = McpHttpEndpoint(
            self.dispatcher,
            authenticate=self.auth.authenticate_token,
            sessions=self.mcp_sessions,
            origins=OriginPolicy.from_config(settings.allowed_origins),
            limits=HttpLimits(
                max_body_bytes=server.max_message_bytes,
                max_connections=settings.max_connections,
                max_in_flight=server.max_in_flight_per_connection,
            ),
            path=settings.path,
        )
        await root.start(endpoint.serve, bound.listener)
        self.mcp_http = endpoint
        self.mcp_http_address = parse_tcp_address(bound.address)

    def mcp_http_url(self) -> str | None:
        """Where MCP clients connect over HTTP, once the endpoint serves."""
        if self.mcp_http_address is None:
            return None
        host, port = self.mcp_http_address
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}{self.config.mcp_http.path}"

    def unready_reason(self) -> str | None:
        """Why the daemon should be sent no new clients now (starting, draining, or a
        language it runs by default that nothing can run); None when it should."""
        if self._acceptors is None:
            return "starting"
        if self.executions.draining or self._acceptors.cancel_called:
            return "draining"
        return self.registry.unready_reason()

    def shutdown(self) -> None:
        """Stop accepting and drain; `serve` returns once drained. Asked before the
        daemon accepts, it stops as soon as it would start to."""
        self._stopping = True
        if self._acceptors is not None:
            self._acceptors.cancel()

    async def _drain(self, connections: trio.Nursery) -> None:
        self.executions.draining = True
        await self._notifier.stopping("draining")
        log.info("draining", extra={"running": len(self.executions)})
        for connection in list(self.connections):
            connection.stop_reading()
        if self.mcp_http is not None:
            self.mcp_http.stop_accepting()
        with trio.move_on_after(self.config.server.grace_period_s):
            await self.executions.wait_idle()
        self.executions.cancel_all()
        with trio.move_on_after(_CANCEL_REPORT_S):
            await self.executions.wait_idle()
            if self.mcp_http is not None:  # its answers, written before the root stops
                await self.mcp_http.wait_idle()
        with trio.CancelScope(shield=True), trio.move_on_after(_CANCEL_REPORT_S):
            await self.sessions.close_all()
        connections.cancel_scope.deadline = trio.current_time() + _CANCEL_REPORT_S

    async def _accept_loop(self, bound: BoundListener, connections: trio.Nursery) -> None:
        while True:
            try:
                stream = await bound.listener.accept()
            except OSError as exc:
                kind = ("accept", bound.transport, exc.errno)
                self._refusal_log.warning(kind, "accept failed", error=str(exc))
                await trio.sleep(_ACCEPT_BACKOFF_S)
                continue
            connections.start_soon(self._serve_stream, stream, bound.transport)

    async def _serve_stream(self, stream: trio.SocketStream, transport: str) -> None:
        """Admit and serve one accepted stream; never raises but `Cancelled`."""
        try:
            await self._admit(stream, transport)
        except* Exception as group:
            _log_connection_failure(transport, group)
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()  # idempotent; the connection may have closed it

    async def _admit(self, stream: trio.SocketStream, transport: str) -> None:
        sock = stream.socket
        try:
            peer = peer_credentials(sock) if transport == "unix" else None  # type: ignore[arg-type]
            # Whose unauthenticated connections count together: a uid on Unix, a
            # source address on TCP (every sandbox is the daemon's own uid).
            key = sock.getpeername()[0] if transport == "tcp" else (peer.uid if peer else None)
        except OSError:
            return  # gone before it was served
        principal = None if transport == "sandbox" else self.auth.authenticate_peer(peer)
        owner = peer is not None and peer.uid == self.auth.daemon_uid
        slot = self.budgets[transport].admit(
            key, authenticated=principal is not None, reserved=owner
        )
        if not isinstance(slot, ConnectionSlot):
            # The reason's counts vary from one refusal to the next; its kind does not.
            kind = ("refused", transport, re.sub(r"\d+", "#", slot))
            self._refusal_log.warning(kind, "connection refused", transport=transport, reason=slot)
            await _refuse(stream, slot)
            return
        try:
            connection = self._connection(
                stream,
                transport,
                self._limits(transport),
                principal=principal,
                peer=peer,
                on_authenticated=slot.authenticated,
            )
            await self._run_connection(connection)
        finally:
            slot.release()

    def _connection(
        self,
        stream: trio.abc.Stream,
        transport: str,
        limits: ConnectionLimits,
        *,
        principal: Principal | None,
        peer: PeerCredentials | None = None,
        on_authenticated: Callable[[], None] | None = None,
    ) -> Connection:
        # On the sandboxes' socket only session tokens count: peer credentials there
        # would be the daemon's own uid, and nothing else should reach it.
        sessions_only = transport == "sandbox"
        return Connection(
            stream,
            self.dispatcher,
            limits,
            transport=transport,
            authenticate=partial(self.auth.authenticate_token, sessions_only=sessions_only),
            principal=principal,
            peer=peer,
            on_authenticated=on_authenticated,
            left_calls=self.left_calls if sessions_only else None,
        )

    def _limits(self, transport: str | None) -> ConnectionLimits:
        """The limits of a connection accepted on `transport`'s listener (None: a
        stream handed to `serve_stream`, whose peer is known and never timed out)."""
        server = self.config.server
        limits = ConnectionLimits(
            max_message_bytes=server.max_message_bytes,
            max_in_flight=server.max_in_flight_per_connection,
            max_auth_failures=self.config.auth.max_failures_per_connection,
        )
        if transport is None or transport == "sandbox":
            # No deadlines for sandboxes: a warm worker connects before its job (and
            # token) exists, then waits for it, and a program thinks between tool calls.
            # The socket lives in the 0700 runtime directory, so only the daemon's own
            # uid reaches it, and its budget is its own: holding its connections locks
            # no client out.
            return limits
        idle_s = server.idle_timeout_s or None
        return dataclasses.replace(limits, auth_s=server.auth_timeout_s, idle_s=idle_s)

    async def serve_stream(
        self, stream: trio.abc.Stream, *, transport: str, principal: Principal | None = None
    ) -> None:
        """Serve one stream the daemon did not accept itself, as a client connection.

        Returns when the peer has left (or the connection was cancelled), its stream
        closed. `principal` authenticates the peer up front, for a stream whose far end
        is known (`conduit mcp` on stdio); otherwise it logs in like any client. While
        the daemon drains, the connection stops reading and finishes what it has.
        """
        connection = self._connection(stream, transport, self._limits(None), principal=principal)
        await self._run_connection(connection)

    async def _run_connection(self, connection: Connection) -> None:
        self.connections.add(connection)
        try:
            await connection.run()
        except* Exception as group:
            _log_connection_failure(connection.transport, group)
        finally:
            self.connections.discard(connection)

    async def _handle_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async for signum in signals:
                if signum == signal.SIGHUP:
                    await self._reload_on_signal()
                else:
                    log.info("shutting down", extra={"signal": signal.Signals(signum).name})
                    self.shutdown()

    async def _reload_on_signal(self) -> None:
        try:
            await self.reload()
        except ConfigError as exc:
            log.error("config not reloaded, the old one stays", extra={"reason": str(exc)})

    async def reload(self) -> Config:
        """Re-read the configuration and apply it; a bad one is refused, the old kept."""
        if self._reload is None:
            raise ConfigError("this daemon was started without a configuration to reload")
        await self._notifier.reloading()
        try:
            new = self._reload()
            self._apply(new)
        finally:
            await self._notifier.ready()
        log.info("configuration reloaded", extra={"source": new.source})
        return new

    def _apply(self, new: Config) -> None:
        master_token, source = resolve_master_token(new.auth, new.server.state_dir)
        redact(master_token)
        self.auth.reconfigure(master_token, new.auth)
        self.token_source = source
        self.executions.reconfigure(new.limits, Policy(new.policy))
        self.sessions.reconfigure(new.sessions, new.limits.queue_timeout_s)
        self.tools.call_timeout_s = new.gateway.call_timeout_s
        limits = new.limits
        self.admission.reconfigure(
            limits.max_concurrent_executions, limits.queue_size, limits.queue_timeout_s
        )
        self.rate_limiter.reconfigure(limits.executions_per_minute, limits.burst)
        for transport, caps in _budget_caps(new).items():
            self.budgets[transport].reconfigure(*caps)
        self.events.buffer = new.events.subscriber_buffer  # for new subscriptions
        self.registry.set_defaults(language_defaults(new))
        self.audit.reconfigure(new.audit)
        if (new.server.socket, new.server.tcp, new.metrics, new.mcp_http) != (
            self.config.server.socket,
            self.config.server.tcp,
            self.config.metrics,
            self.config.mcp_http,
        ):
            log.warning("listener changes take effect on restart")
        if _packages(new) != _packages(self.config):
            log.warning("executor package changes take effect on restart (and build once)")
        self.config = new

    def metrics_url(self) -> str | None:
        """The URL Prometheus scrapes, once the endpoint serves."""
        if self.metrics_address is None:
            return None
        host, port = self.metrics_address
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/metrics"

    # ---- set-up ------------------------------------------------------------------

    async def _open_listeners(self, *, allow_none: bool = False) -> list[BoundListener]:
        inherited = systemd.listen_fds()
        if inherited:
            return [_from_inherited(item) for item in inherited]
        server = self.config.server
        bound: list[BoundListener] = []
        try:
            if server.socket:
                bound.append(await open_unix_listener(server.socket))
            if server.tcp:
                bound.append(await open_tcp_listener(*parse_tcp_address(server.tcp)))
        except BaseException:
            with trio.CancelScope(shield=True):
                await _close_listeners(bound)
            raise
        if not bound and not allow_none:
            raise ConfigError("no listener configured: set server.socket or server.tcp")
        return bound

    def _serving_info(self, bound: list[BoundListener]) -> ServingInfo:
        unix = next((b.address for b in bound if b.transport == "unix"), None)
        tcp = next((b.address for b in bound if b.transport == "tcp"), None)
        return ServingInfo(
            unix_path=unix,
            tcp_address=parse_tcp_address(tcp) if tcp else None,
            token_source=self.token_source,
            listeners=tuple(
                f"{b.transport}:{b.address}" for b in bound if b.transport != "sandbox"
            ),
            metrics_address=self.metrics_address,
            mcp_http_address=self.mcp_http_address,
        )

    def _announce(self, info: ServingInfo) -> None:
        how = (
            "peer credentials (same uid) or the master token"
            if self.config.auth.peer_credentials
            else "the master token"
        )
        log.info(
            "conduit listening",
            extra={
                "listeners": ", ".join(info.listeners) or "none (clients come in on stdio)",
                "auth": how,
                "token": info.token_source,
                "metrics": self.metrics_url() or ("not served" if self.metrics_error else "off"),
                "mcp_http": self.mcp_http_url() or "off",
                "pid": os.getpid(),
            },
        )


def _prepare_state_dir(path: str) -> None:
    """Create the state directory 0700, or make an existing one 0700.

    Raises `ConfigError` when it is a symlink, not a directory, or another uid's: it
    holds the master token, and a directory someone else controls would hand it over.
    """
    directory = Path(path)
    if directory.is_symlink():
        raise ConfigError(
            f"server.state_dir {path} is a symlink: point it at the real directory, "
            "which this user must own"
        )
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        # No following a symlink swapped in since the check above.
        descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ConfigError(
            f"server.state_dir {path} is not a usable directory ({exc.strerror}): "
            "point it at a real directory (not a symlink) that this user owns"
        ) from None
    try:
        info = os.fstat(descriptor)
        if info.st_uid != os.getuid():
            raise ConfigError(
                f"server.state_dir {path} belongs to uid {info.st_uid}, not to this "
                f"daemon's uid {os.getuid()}: chown it, or choose another directory"
            )
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.fchmod(descriptor, 0o700)
            log.info(
                "state directory made private",
                extra={"path": path, "mode": oct(stat.S_IMODE(info.st_mode))},
            )
    finally:
        os.close(descriptor)


def _raise_fd_limit() -> None:
    """Raise the soft limit on open files to the hard one: each connection holds one,
    and the default soft limit (often 1024) is below `server.max_connections` alone."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (OSError, ValueError) as exc:
            log.warning("open-file limit not raised", extra={"soft": soft, "error": str(exc)})


def _packages(config: Config) -> tuple[tuple[str, ...], ...]:
    """The packages each Python executor installs: built as it starts, never on reload."""
    return (config.executors.wasm_python.packages, config.executors.pyodide.packages)


def _budget_caps(config: Config) -> dict[str, tuple[int, int | None]]:
    """Each listener kind's connection cap and per-peer cap on unauthenticated ones."""
    server = config.server
    per_peer = server.max_unauthenticated_per_peer
    return {
        "unix": (server.max_connections, per_peer),
        "tcp": (server.max_connections, per_peer),
        # Every sandbox is this daemon's uid: one cap for all, the budget itself.
        "sandbox": (server.max_sandbox_connections, None),
    }


def _budgets(config: Config) -> dict[str, ConnectionBudget]:
    return {kind: ConnectionBudget(*caps) for kind, caps in _budget_caps(config).items()}


class _ThrottledLog:
    """Warnings a peer can cause at will: of each kind, one line every `every_s` at most.

    A line logged after some of its kind were left out says how many (`suppressed`).
    Kinds are few (what happened, on which listener), so one bucket each is kept.
    """

    def __init__(self, every_s: float) -> None:
        self._every_s = every_s
        self._limits: dict[Hashable, RateLimit] = {}

    def warning(self, kind: Hashable, message: str, **fields: object) -> None:
        limit = self._limits.get(kind)
        if limit is None:
            limit = self._limits[kind] = RateLimit(burst=1, per_s=1 / self._every_s)
        if not limit.allow():
            return
        if suppressed := limit.take_suppressed():
            fields["suppressed"] = suppressed
        log.warning(message, extra=fields)


async def _refuse(stream: trio.SocketStream, reason: str) -> None:
    """Tell a peer there is no room for it, if that can be written at once."""
    error = Overloaded(f"overloaded: {reason}; closing the connection, retry later")
    with (
        trio.move_on_after(_REFUSAL_S),
        contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
    ):
        await stream.send_all(encode(error_reply(None, error)) + b"\n")


def _log_connection_failure(transport: str, group: BaseExceptionGroup) -> None:
    error_id = secrets.token_hex(6)
    log.error(
        "connection failed and was closed",
        exc_info=group,
        extra={"transport": transport, "error_id": error_id},
    )


async def _close_listeners(bound: list[BoundListener]) -> None:
    """Stop listening and remove our socket files; safe to call twice."""
    for listener in bound:
        remove_socket_file(listener)
        await listener.listener.aclose()


def _in_trio() -> bool:
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True


def _from_inherited(item: systemd.InheritedSocket) -> BoundListener:
    transport = "unix" if item.kind is systemd.SocketKind.UNIX_STREAM else "tcp"
    return BoundListener(item.listener(), transport, item.address)


def _unix_directory(bound: list[BoundListener]) -> str | None:
    """The directory of the clients' Unix socket, if the daemon has one."""
    for listener in bound:
        if listener.transport == "unix" and listener.owned_path:
            return os.path.dirname(listener.owned_path)
    return None


async def serve(
    config: Config,
    *,
    reload: Callable[[], Config] | None = None,
    handle_signals: bool = False,
    until_stdin_closes: bool = False,
    owns_process: bool = False,
    task_status: trio.TaskStatus[ServingInfo] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a daemon for `config` until cancelled or shut down (with `until_stdin_closes`,
    also once its standard input reaches its end: its supervisor is gone).
    `owns_process`: nothing else runs in this process (see `Daemon`).

    `task_status.started()` receives a `ServingInfo` once every listener accepts.
    """
    daemon = Daemon(config, reload=reload, owns_process=owns_process)
    async with trio.open_nursery() as nursery:
        if until_stdin_closes:
            nursery.start_soon(_shutdown_when_stdin_closes, daemon)
        await daemon.serve(handle_signals=handle_signals, task_status=task_status)
        nursery.cancel_scope.cancel()


async def _freeze_start_up(registry: ExecutorRegistry) -> None:
    """Once the executors are prepared, set what start-up made apart from the garbage
    collector (`gc.freeze`): imports, schemas, parsers and components leave ~130,000
    objects, and a full collection walked them all, holding the GIL ~0.1 s, once every
    thousand executions or so, stalling every execution and connection meanwhile. No
    collection first: it would be that stall, as the first requests come (under socket
    activation they are why the daemon started), to free a few dozen objects."""
    await registry.wait_ready()
    gc.freeze()


async def _shutdown_when_stdin_closes(daemon: Daemon) -> None:
    """Read standard input, ignoring what comes, and shut `daemon` down at its end.

    A supervisor that holds the other end of a pipe (`conduit.integrations.ray`) need
    not outlive the daemon to stop it: the kernel closes the pipe whatever way the
    supervisor ends, which no signal sent on its death guarantees.
    """
    async with trio.lowlevel.FdStream(os.dup(sys.stdin.fileno())) as stdin:
        while await stdin.receive_some(_STDIN_CHUNK):
            pass
    log.info("shutting down: standard input closed")
    daemon.shutdown()
