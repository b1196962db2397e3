"""Sessions: a sandbox kept across executions, owned by the principal that made it.

`sessions/create` opens a sandbox on one executor (`Executor.open_session`) and gives
back its id; `execute {session_id}` then runs each step there, one at a time, so what
a step defines is there for the next. A session belongs to its principal alone: to
anyone else it does not exist (`NotFound`, the same answer as for an id never made).

What bounds them:
- at most `max_per_principal` per principal and `max_total` in the daemon: past that,
  `sessions/create` is refused (`Overloaded`), never answered by ending someone's
  live session;
- a session nobody has used for its `idle_timeout_s` ends (`expired`); a step under
  way is use, and its idle time starts when it ends, so a program cannot keep its
  session alive past its own steps;
- sessions end with the daemon (`close_all`): nothing of them is written anywhere.

Resource handling: `serve` owns the expiry task; every sandbox is closed by whoever
removes its session from the table (close, expiry, the daemon stopping), under a
shield, so a cancelled caller never leaks one.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from conduit.core.errors import InvalidParams, NotFound, Overloaded
from conduit.daemon.events import BusEvent, EventType
from conduit.daemon.records import SessionRecord
from conduit.executors.base import ExecutorSession, Limits, SessionSpec

if TYPE_CHECKING:
    from conduit.daemon.config import SessionsConfig
    from conduit.daemon.events import EventBus
    from conduit.executors.registry import ExecutorRegistry

__all__ = ["CloseReason", "LiveSession", "NamedSessions", "Sessions"]

log = logging.getLogger("conduit.sessions")

# What every session's id starts with; the rest is random (64 bits).
ID_PREFIX = "ses_"
# The expiry task looks again at least this often, so a session's end is never much
# later than its idle timeout, and never sooner.
EXPIRY_CHECK_S = 1.0


class CloseReason:
    CLOSED = "closed"  # `sessions/close`, or its MCP connection ended
    EXPIRED = "expired"  # idle past its timeout
    DAEMON_STOPPED = "daemon_stopped"


@dataclass(slots=True, eq=False)
class LiveSession:
    """One live session. `lock` is held while a step runs: steps never overlap."""

    session_id: str
    principal: str
    executor: str
    language: str
    limits: Limits
    idle_timeout_s: float
    sandbox: ExecutorSession
    name: str | None = None
    created_at: float = field(default_factory=time.time)
    # Trio time of the last step's end (or the creation); a step under way is use.
    last_used: float = 0.0
    steps: int = 0
    resets: int = 0
    lock: trio.Lock = field(default_factory=trio.Lock)
    closed: bool = False
    # The table's to hear of each step's end (`Sessions._stepped`).
    on_step: Callable[[LiveSession, bool], None] | None = field(default=None, repr=False)

    @asynccontextmanager
    async def turn(self, within_s: float) -> AsyncIterator[float]:
        """Hold the session for the block: a step, or files moved in or out, never two
        at once. Yields how long the wait was (queueing); `Overloaded` if the session
        stays busy for `within_s`, `NotFound` if it ended meanwhile."""
        began = trio.current_time()
        with trio.move_on_after(within_s) as waiting:
            await self.lock.acquire()
        if waiting.cancelled_caught:
            raise Overloaded(
                f"the session is still busy with an earlier step after {within_s:g} s "
                "(limits.queue_timeout_s); retry later or cancel it with executions/cancel"
            )
        try:
            if self.closed:
                raise NotFound("not found: no such session", {"session_id": self.session_id})
            yield trio.current_time() - began
        finally:
            self.last_used = trio.current_time()  # moving files is use too
            self.lock.release()

    def step_ended(self, *, reset: bool) -> None:
        """A step ended (the lock still held); `reset`: its sandbox was started afresh.
        The session's idle time starts now."""
        self.steps += 1
        self.resets += reset
        self.last_used = trio.current_time()
        if self.on_step is not None:
            self.on_step(self, reset)

    def expires_at(self) -> float:
        """Trio time at which the session ends if unused; never while a step runs."""
        if self.lock.locked():
            return math.inf
        return self.last_used + self.idle_timeout_s

    def record(self, *, ended_at: float | None = None, reason: str | None = None) -> SessionRecord:
        """What the audit store keeps of it: as it is now, or as it ended."""
        return SessionRecord(
            self.session_id,
            self.principal,
            self.executor,
            self.language,
            self.created_at,
            ended_at,
            reason,
            self.steps,
            self.resets,
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "name": self.name,
            "executor": self.executor,
            "language": self.language,
            "created_at": self.created_at,
            "idle_timeout_s": self.idle_timeout_s,
            "idle_s": round(max(0.0, trio.current_time() - self.last_used), 3)
            if not self.lock.locked()
            else 0.0,
            "running": self.lock.locked(),
            "steps": self.steps,
            "resets": self.resets,
            "memory_mb": self.limits.memory_mb,
        }


@dataclass(eq=False)
class NamedSessions:
    """The sessions one connection's MCP tool calls named (`execute_*`'s `session`):
    session id by name. `lock` is held while a name is looked up or opened, so two
    calls naming one new session open one; `closing` says the connection will end
    them when it closes."""

    ids: dict[str, str] = field(default_factory=dict)
    lock: trio.Lock = field(default_factory=trio.Lock)
    closing: bool = False


class Sessions:
    """The daemon's table of live sessions.

    `registry` opens sandboxes; `limits_for` turns a request's limit overrides into
    the session's limits (capped like an execution's); `events` hears of each session
    created, reset and ended.
    """

    def __init__(
        self,
        config: SessionsConfig,
        *,
        registry: ExecutorRegistry,
        events: EventBus,
        limits_for: Callable[[dict[str, int]], Limits],
        queue_timeout_s: float,
        charge: Callable[[str], None] = lambda principal: None,
    ) -> None:
        self.config = config
        # Replaced by the daemon once it has built its executors, as `Executions.registry`.
        self.registry = registry
        self._events = events
        self._limits_for = limits_for
        # Spends the principal's rate, as an execution does (`RateLimited` when spent):
        # opening a sandbox costs what starting an execution does.
        self._charge = charge
        self._queue_timeout_s = queue_timeout_s
        self._sessions: dict[str, LiveSession] = {}
        self._opening = 0  # sessions being opened: they count against the caps
        self._opening_by: dict[str, int] = {}
        self._changed = trio.Event()

    def __len__(self) -> int:
        return len(self._sessions)

    def __repr__(self) -> str:
        return f"<Sessions {len(self._sessions)} live, {self._opening} opening>"

    def reconfigure(self, config: SessionsConfig, queue_timeout_s: float) -> None:
        """Apply a reload to sessions made from now on (live ones keep their timeout)."""
        self.config = config
        self._queue_timeout_s = queue_timeout_s

    # -- the methods' side -------------------------------------------------------------

    async def create(
        self,
        principal: str,
        language: str,
        *,
        executor: str | None = None,
        limits: dict[str, int] | None = None,
        idle_timeout_s: float | None = None,
        name: str | None = None,
    ) -> tuple[LiveSession, bool]:
        """A session for `principal`, and whether it was made now: with a `name` the
        principal already has a live session by, that session (if its language and
        executor agree; `InvalidParams` otherwise).

        Raises `Overloaded` past the caps, `InvalidParams` for a timeout past the
        maximum, and whatever picking or opening the executor raises.
        """
        if name is not None:
            found = self._named(principal, name)
            if found is not None:
                return self._same_kind(found, language, executor), False
        idle = self._idle_timeout(idle_timeout_s)
        session_limits = self._limits_for(limits or {})
        self._check_caps(principal)
        self._charge(principal)
        self._opening += 1
        self._opening_by[principal] = self._opening_by.get(principal, 0) + 1
        try:
            picked = await self.registry.pick_ready(
                language, executor, within_s=self._queue_timeout_s
            )
            open_session = getattr(picked, "open_session", None)
            if open_session is None:
                raise InvalidParams(
                    f"invalid params: the {picked.name} executor keeps no sessions; name "
                    "another executor",
                    {"field": "executor", "reason": "keeps no sessions"},
                )
            session_id = ID_PREFIX + secrets.token_hex(8)
            spec = SessionSpec(session_id, language, session_limits.memory_mb, principal)
            sandbox = await open_session(spec)
        finally:
            self._opening -= 1
            self._opening_by[principal] -= 1
            if not self._opening_by[principal]:
                del self._opening_by[principal]
        session = LiveSession(
            session_id,
            principal,
            picked.name,
            language,
            session_limits,
            idle,
            sandbox,
            name=name,
            last_used=trio.current_time(),
            on_step=self._stepped,
        )
        self._sessions[session_id] = session
        self._changed.set()
        self._publish(EventType.SESSION_CREATED, session, record=session.record())
        return session, True

    def get(self, principal: str, session_id: str) -> LiveSession:
        """The principal's live session `session_id`; `NotFound` for any other id,
        whether it never existed, ended, or is someone else's."""
        session = self._sessions.get(session_id)
        if session is None or session.principal != principal or session.closed:
            raise NotFound("not found: no such session", {"session_id": session_id})
        return session

    def of(self, principal: str) -> list[LiveSession]:
        """The principal's live sessions, oldest first."""
        return [s for s in self._sessions.values() if s.principal == principal]

    def all(self) -> list[LiveSession]:
        return list(self._sessions.values())

    async def close(self, principal: str, session_id: str) -> None:
        """End the principal's session (`NotFound` as `get`); a step under way is stopped."""
        await self._end(self.get(principal, session_id), CloseReason.CLOSED)

    def _stepped(self, session: LiveSession, reset: bool) -> None:
        if reset:
            self._publish(EventType.SESSION_RESET, session)
        self._changed.set()

    # -- the daemon's side -------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """End sessions idle past their timeout, until cancelled."""
        task_status.started()
        while True:
            self._changed = trio.Event()
            now = trio.current_time()
            for session in [s for s in self._sessions.values() if s.expires_at() <= now]:
                await self._end(session, CloseReason.EXPIRED)
            soonest = min((s.expires_at() for s in self._sessions.values()), default=math.inf)
            with trio.move_on_at(min(soonest, trio.current_time() + EXPIRY_CHECK_S)):
                await self._changed.wait()

    async def close_all(self) -> None:
        """End every session (the daemon stopping)."""
        for session in list(self._sessions.values()):
            await self._end(session, CloseReason.DAEMON_STOPPED)

    # -- inside --------------------------------------------------------------------------

    async def _end(self, session: LiveSession, reason: str) -> None:
        if session.closed:
            return
        session.closed = True
        self._sessions.pop(session.session_id, None)
        with trio.CancelScope(shield=True):
            await session.sandbox.aclose()
        record = session.record(ended_at=time.time(), reason=reason)
        self._publish(EventType.SESSION_ENDED, session, record=record, reason=reason)

    def _named(self, principal: str, name: str) -> LiveSession | None:
        for session in self._sessions.values():
            if session.principal == principal and session.name == name and not session.closed:
                return session
        return None

    @staticmethod
    def _same_kind(session: LiveSession, language: str, executor: str | None) -> LiveSession:
        if session.language != language or executor not in (None, session.executor):
            raise InvalidParams(
                f"invalid params: session {session.name!r} runs {session.language} on "
                f"{session.executor}; close it or use another name",
                {"field": "name", "reason": "in use for another language or executor"},
            )
        return session

    def _idle_timeout(self, requested: float | None) -> float:
        config = self.config
        if requested is None:
            return config.idle_timeout_s
        if requested > config.max_idle_timeout_s:
            raise InvalidParams(
                f"invalid params: idle_timeout_s = {requested:g} exceeds the daemon's "
                f"maximum of {config.max_idle_timeout_s:g} (sessions.max_idle_timeout_s)",
                {"field": "idle_timeout_s", "reason": "greater than the maximum"},
            )
        return requested

    def _check_caps(self, principal: str) -> None:
        config = self.config
        mine = len(self.of(principal)) + self._opening_by.get(principal, 0)
        if mine >= config.max_per_principal:
            raise Overloaded(
                f"too many sessions: this client has {mine}, the most it may hold "
                f"(sessions.max_per_principal = {config.max_per_principal}); close one "
                "with sessions/close or let an idle one expire",
                {"limit": "sessions.max_per_principal", "value": config.max_per_principal},
            )
        total = len(self._sessions) + self._opening
        if total >= config.max_total:
            raise Overloaded(
                f"too many sessions: the daemon holds {total}, its most "
                f"(sessions.max_total = {config.max_total}); retry later",
                {"limit": "sessions.max_total", "value": config.max_total},
            )

    def _publish(
        self,
        kind: EventType,
        session: LiveSession,
        *,
        record: SessionRecord | None = None,
        **extra: Any,
    ) -> None:
        data = {
            "session_id": session.session_id,
            "principal": session.principal,
            "executor": session.executor,
            "language": session.language,
            "steps": session.steps,
            **extra,
        }
        self._events.publish(BusEvent(kind, data, session.principal, session=record))
