"""Running executions: from a validated request to a result, and the table of those running.

`Executions.execute` is the one path every way of running code takes (the `execute`
method, the built-in `execute_*` tools, the seed aliases): it normalises the code, picks
the executor, spends the caller's rate, checks the code against the policy, waits for a
slot, mints the session token, runs the job in a cancel scope of its own, and shapes the
result. A failing program is a result with a non-ok status, and so is one the policy
refuses (`refused`, never run); only faults of the request itself are raised. The
registry, the policy and the executor share one parse of a JavaScript or TypeScript
program (`SyntaxMemo`), let go before the request waits for a slot. A request
with `on_output` also gets the program's output while it runs, as `execution/output`
notification params (`LiveOutput`), all of them before `execute` returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from conduit.core import jsontext
from conduit.core.errors import (
    Forbidden,
    InvalidParams,
    NotFound,
    Overloaded,
    ToolLimitReached,
    Unauthenticated,
)
from conduit.core.files import FileData, ReturnedFile, returned_files
from conduit.core.results import ExecutionResult, ProgramError, Truncated
from conduit.daemon.events import BusEvent, EventType
from conduit.daemon.records import (
    RUNNING,
    SNIPPET_CHARS,
    ExecutionRecord,
    FileRecord,
    ToolCallRecord,
    code_digest,
    head,
)
from conduit.daemon.tool_access import requested_allowlist
from conduit.executors import outcomes
from conduit.executors.base import ErrorInfo, Job, Limits, Outcome, Status, ToolBridge
from conduit.executors.output import StreamName
from conduit.executors.readings import Readings
from conduit.executors.source import unwrap_fence
from conduit.executors.syntax_memo import SyntaxMemo

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from conduit.daemon.auth import Principal
    from conduit.daemon.config import LimitsConfig
    from conduit.daemon.events import EventBus
    from conduit.daemon.limits import Admission, RateLimiter
    from conduit.daemon.policy import Policy, Violation
    from conduit.daemon.sessions import LiveSession
    from conduit.executors.registry import ExecutorRegistry

__all__ = ["ExecutionRequest", "Executions", "LiveOutput", "OpenBridge", "OutputSink"]

log = logging.getLogger("conduit.executions")

# Receives the params of each `execution/output` notification of a streamed execution.
OutputSink = Callable[[dict[str, Any]], Awaitable[None]]
# Opens an execution's bridge (its way back in for tool calls), given its id, the tool
# patterns that must all allow a tool, and who started it; the bridge's token ends when
# the block exits.
OpenBridge = Callable[[str, tuple[tuple[str, ...], ...], str], "AbstractContextManager[ToolBridge]"]
# Runs one job: an executor's `run`, or a session's sandbox's.
RunJob = Callable[[Job, ToolBridge], Awaitable[Outcome]]

# How long one piece of live output may wait for the client to take it. A client that
# takes nothing for this long is not reading: streaming stops for that execution (its
# whole output is still in the result), so the program is slowed by at most this much
# and its timeout still holds.
OUTPUT_STALL_S = 1.0


@dataclass(frozen=True, slots=True)
class ExecutionRequest:
    language: str
    code: str
    executor: str | None = None
    limits: dict[str, int] = dataclasses.field(default_factory=dict)
    allowed_tools: tuple[str, ...] | None = None
    inputs: Any = None
    # (connection, request id) of the call that started it, so it can be cancelled by
    # request id before its execution id is known.
    origin: tuple[int, Any] | None = None
    # Where `execution/output` notifications go while the program runs (None: nowhere).
    on_output: OutputSink | None = None
    # The session to run in, as the caller's own (`Sessions.get`); None: a fresh sandbox.
    session: LiveSession | None = None
    # Files to place in the working directory first (paths checked).
    files: tuple[FileData, ...] = ()


@dataclass(frozen=True, slots=True)
class _Target:
    """Where a job runs: an executor's fresh sandbox, or a session's."""

    executor: str
    language: str
    run: RunJob
    session: LiveSession | None = None
    # Where the job moves if it computes for long, and after how much CPU time
    # (`ExecutorRegistry.successor`): a program the daemon chose the executor for.
    successor: _Target | None = None
    move_after_cpu_s: float | None = None

    @property
    def session_id(self) -> str | None:
        return None if self.session is None else self.session.session_id


@dataclass(slots=True)
class _Running:
    job: Job
    principal: str
    executor: str
    started: float
    scope: trio.CancelScope
    origin: tuple[int, Any] | None = None
    tool_calls: int = 0
    tool_log: list[ToolCallRecord] = dataclasses.field(default_factory=list)
    # Why the daemon stopped it early (cancelled, tool limit), if it did.
    stopped_as: Status | None = None
    # Tool calls read from its sandbox, and the event of the next; whether its program
    # has answered (calls read since are within its limit or refused, never a stop).
    arrived: int = 0
    arrival: trio.Event = dataclasses.field(default_factory=trio.Event)
    answered: bool = False
    # The scopes of its tool calls running now (`Executions.running_call`).
    calls: set[trio.CancelScope] = dataclasses.field(default_factory=set)
    # Its record as it started, naming the executor it runs on now (None: not kept).
    record: ExecutionRecord | None = None

    @property
    def execution_id(self) -> str:
        return self.job.execution_id

    def stop(self, status: Status) -> None:
        """Ask the executor to stop the program now, keeping its output so far.

        An executor that does not stop within `_STOP_GRACE_S` is cancelled outright.
        """
        if self.stopped_as is None:
            self.stopped_as = status
        self.job.stop.set()
        self.scope.deadline = min(self.scope.deadline, trio.current_time() + _STOP_GRACE_S)


# How long an executor may take to stop a program it was asked to stop, before its
# task is cancelled (and the output so far lost).
_STOP_GRACE_S = 2.0
# How long an answered execution's session stays open for the tool calls its sandbox
# wrote before answering: they are in the daemon's socket already.
_CALLS_READ_S = 1.0
MIB = 1024 * 1024
# Files an execution's record names, and how much of each path.
RECORDED_FILES = 20
RECORDED_PATH_CHARS = 200


# Programs up to this size are checked against the policy on the event loop (parsing
# ~4 KiB of Python takes about a millisecond); larger ones in a worker thread, since a
# 1 MiB program takes a few hundred milliseconds to parse.
_INLINE_CHECK_CHARS = 4096
# Checking holds the GIL (parsing): a second thread would only take turns
# with the first, and both with the event loop.
_POLICY_THREADS = 1


def _new_execution_id() -> str:
    return "ex_" + secrets.token_hex(8)


class LiveOutput:
    """An execution's output hook: each piece becomes an `execution/output` notification.

    Pieces are numbered (`seq`, from 0) and sent one at a time, in the order the
    executor hands them over. A piece the client does not take within OUTPUT_STALL_S
    stops the streaming: later pieces are dropped here (they are in the result), so a
    client that stops reading never holds the program up for long.
    """

    def __init__(self, execution_id: str, sink: OutputSink) -> None:
        self._execution_id = execution_id
        self._sink = sink
        self._seq = 0
        self._lock = trio.StrictFIFOLock()
        self.stalled = False

    @property
    def sent(self) -> bool:
        """Whether a piece went to the client (or was on its way)."""
        return self._seq > 0

    async def __call__(self, stream: StreamName, text: str) -> None:
        async with self._lock:
            if self.stalled:
                return
            params = {
                "execution_id": self._execution_id,
                "stream": stream,
                "text": text,
                "seq": self._seq,
            }
            self._seq += 1
            with trio.move_on_after(OUTPUT_STALL_S) as waited:
                await self._sink(params)
            if waited.cancelled_caught:
                self.stalled = True
                log.info(
                    "live output stopped: the client is not reading",
                    extra={"execution_id": self._execution_id},
                )


class Executions:
    """Starts executions and keeps the table of running ones.

    `registry` is the executors programs run on (the daemon builds its own once it
    knows where sandboxes call back); `limits` and `policy` change on a reload
    (`reconfigure`). Each execution's tool calls come back through `open_bridge`.
    """

    def __init__(
        self,
        limits: LimitsConfig,
        policy: Policy,
        *,
        registry: ExecutorRegistry,
        admission: Admission,
        rate_limiter: RateLimiter,
        events: EventBus,
        open_bridge: OpenBridge,
        wait_recorded: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.limits = limits
        self.policy = policy
        self.registry = registry
        self._admission = admission
        self._rate_limiter = rate_limiter
        self._events = events
        # What reading a program decided, for its principal's next run of it.
        self._readings = Readings()
        self._open_bridge = open_bridge
        # What an answer waits for: the audit store's commit of the records published
        # before it (`AuditStore.wait_recorded`).
        self._wait_recorded = wait_recorded or _nothing_to_wait_for
        self._running: dict[str, _Running] = {}
        self._policy_limiter = trio.CapacityLimiter(_POLICY_THREADS)
        self._idle = trio.Event()
        self._idle.set()
        self.draining = False

    def __len__(self) -> int:
        return len(self._running)

    def reconfigure(self, limits: LimitsConfig, policy: Policy) -> None:
        """Apply a reloaded configuration to the executions that start from now on."""
        self.limits = limits
        self.policy = policy

    async def execute(self, request: ExecutionRequest, principal: Principal) -> ExecutionResult:
        """Run one program for `principal` and return its result.

        A failing program is a result with a non-ok status; a program the policy
        refuses is a `refused` result, and never takes a slot. Raises `Overloaded` while
        draining or when the queue is full, `Forbidden` for a sandbox's session,
        `InvalidParams` for bad code, limits, `allowed_tools` or executor, `RateLimited`,
        and `ExecutorUnavailable` when the chosen executor cannot run now.

        Every execution that starts publishes that it started and how it ended, for the
        audit store and subscribers: even one cancelled from outside (its caller gone,
        the daemon stopping), as `cancelled`, before the cancellation goes on. The
        result is returned once the audit store has committed its record
        (`wait_recorded`).
        """
        if self.draining:
            raise Overloaded("the daemon is shutting down; retry on its next start")
        if principal.kind == "session":
            raise Forbidden("forbidden: a sandbox cannot start executions")
        code = self._checked_code(request.code)
        # Owned by kind and name: a client may be named as the master is.
        syntax = SyntaxMemo(self._readings, f"{principal.kind}:{principal.name}")
        requested = _checked_patterns(request.allowed_tools)
        session = request.session
        getting_ready = trio.current_time()
        target, limits = await self._target(request, code, syntax)
        _check_files_fit(request.files, limits)
        ready_wait_s = trio.current_time() - getting_ready
        self._rate_limiter.check(principal.name)
        checked = trio.current_time()
        violation = await self._violation(target.language, target.executor, code, syntax)
        if violation is not None:
            job = Job(
                _new_execution_id(),
                target.language,
                code,
                limits,
                request.inputs,
                principal=principal.name,
            )
            check_s = trio.current_time() - checked
            return await self._once_recorded(
                self._refuse(job, target, principal, requested, violation, check_s)
            )
        if not self._admission.has_free_slot() or (session is not None and session.lock.locked()):
            syntax.forget()  # not held through the wait (see `SyntaxMemo`)
        async with self._turn(session) as turn_wait_s, self._admission.slot() as slot_wait_s:
            queue_wait_s = turn_wait_s + slot_wait_s
            execution_id = _new_execution_id()
            live = LiveOutput(execution_id, request.on_output) if request.on_output else None
            job = Job(
                execution_id,
                target.language,
                code,
                limits,
                request.inputs,
                on_output=live,
                principal=principal.name,
                # Whatever the queue has not used up bounds the executor's own queueing.
                queue_timeout_s=max(0.0, self.limits.queue_timeout_s - queue_wait_s),
                files=request.files,
                syntax=syntax,
                move_after_cpu_s=target.move_after_cpu_s,
            )
            allowed = (requested, *principal.tool_patterns)
            running = _running_record(
                job, target, principal.name, requested, code_digest(code), time.time(), queue_wait_s
            )
            self._events.publish(_started_event(running))
            started = trio.current_time()
            tool_log: list[ToolCallRecord] = []

            def end(outcome: Outcome, target: _Target) -> ExecutionResult:
                """Log and publish how the execution ended; returns the result."""
                # What the executor spent waiting for a CPU slot or a sandbox is queueing.
                duration_s = trio.current_time() - started - outcome.queue_s
                # Debug, not info: the audit store and the events already record every
                # execution, and one formatted line each cost the event loop as much as
                # the rest of the bookkeeping together.
                log.debug(
                    "execution finished",
                    extra={
                        "execution_id": execution_id,
                        "principal": principal.name,
                        "executor": target.executor,
                        "status": str(outcome.status),
                        "duration_ms": round(duration_s * 1000, 2),
                    },
                )
                if session is not None:
                    session.step_ended(reset=outcome.session_reset)
                waited_s = ready_wait_s + queue_wait_s + outcome.queue_s
                result = _result(execution_id, target, outcome, duration_s, waited_s, limits)
                record = _record(
                    result,
                    job,
                    principal.name,
                    requested,
                    running.code_sha256,
                    running.started_at,
                    tuple(tool_log),
                )
                self._events.publish(_ended_event(record))
                return result

            # Where it runs: `target`, then the successor it moved to, if it moved.
            ran_on = [target]
            try:
                outcome = await self._run(
                    job, ran_on, allowed, principal, request, tool_log, running
                )
            except BaseException as exc:
                # The caller is gone, the daemon stopped waiting, or the executor broke:
                # the execution ended all the same, and is accounted for before the
                # exception goes on, as where it was running.
                interrupted = _interrupted(exc, len(tool_log))
                # A session's sandbox in an unknown state is not trusted with its next step.
                interrupted.session_reset = session is not None
                end(interrupted, ran_on[-1])
                raise
        return await self._once_recorded(end(outcome, ran_on[-1]))

    async def _once_recorded(self, result: ExecutionResult) -> ExecutionResult:
        """`result`, once its record is committed: a client that has its result finds
        it on record, even if the daemon is killed the moment after."""
        await self._wait_recorded()
        return result

    async def _target(
        self, request: ExecutionRequest, code: str, syntax: SyntaxMemo
    ) -> tuple[_Target, Limits]:
        """Where the request runs, and its limits: the session's sandbox it names, or
        a fresh one of the executor picked for it (waited for while it starts)."""
        session = request.session
        if session is not None:
            limits = self.step_limits(session, request.limits)
            return _Target(session.executor, session.language, session.sandbox.run, session), limits
        limits = self.limits_for(request.limits)
        # A wait for an executor still starting is queueing: bounded like the queue's.
        within_s = min(limits.timeout_ms / 1000, self.limits.queue_timeout_s)
        executor = await self.registry.pick_ready(
            request.language, request.executor, within_s=within_s, code=code, syntax=syntax
        )
        target = _Target(executor.name, request.language, executor.run)
        moving = self.registry.successor(request.language, request.executor, executor, code, syntax)
        if moving is None:
            return target, limits
        successor, after_s = moving
        then = _Target(successor.name, request.language, successor.run)
        return dataclasses.replace(target, successor=then, move_after_cpu_s=after_s), limits

    @asynccontextmanager
    async def _turn(self, session: LiveSession | None) -> AsyncIterator[float]:
        """`session`'s turn for the block (see `LiveSession.turn`); a no-op without one."""
        if session is None:
            yield 0.0
            return
        async with session.turn(self.limits.queue_timeout_s) as waited_s:
            yield waited_s

    async def _violation(
        self, language: str, executor: str, code: str, syntax: SyntaxMemo
    ) -> Violation | None:
        """The policy's verdict on `code`: inline for small programs, in a worker
        thread for those whose parsing could hold the event loop up."""
        policy = self.policy
        if len(code) <= _INLINE_CHECK_CHARS or not policy.reads(language, executor):
            return policy.check(language, executor, code, syntax)
        return await trio.to_thread.run_sync(
            policy.check, language, executor, code, syntax, limiter=self._policy_limiter
        )

    def _refuse(
        self,
        job: Job,
        target: _Target,
        principal: Principal,
        requested: tuple[str, ...],
        violation: Violation,
        check_s: float,
    ) -> ExecutionResult:
        """The result, events and record of a program the policy refused: it never ran.

        Publishes `policy.violation` (the rule and place) and then the execution's end
        event carrying its record, so the audit trail holds every refused request.
        """
        started_at = time.time()
        refused = _result(job.execution_id, target, Outcome(Status.REFUSED), check_s, 0.0)
        error = _cleaned(ErrorInfo("PolicyViolation", violation.describe()))
        result = dataclasses.replace(
            refused, error=dataclasses.replace(error, **violation.to_wire())
        )
        digest = code_digest(job.code)
        record = _record(result, job, principal.name, requested, digest, started_at, ())
        log.info(
            "execution refused by policy",
            extra={
                "execution_id": job.execution_id,
                "principal": principal.name,
                "executor": target.executor,
                "rule": violation.rule,
                "line": violation.line,
            },
        )
        self._events.publish(
            BusEvent(
                EventType.POLICY_VIOLATION,
                {
                    "execution_id": job.execution_id,
                    "principal": principal.name,
                    "executor": target.executor,
                    "language": job.language,
                    "code_sha256": digest,
                    "message": violation.message,
                    **violation.to_wire(),
                },
                principal.name,
                started_at,
            )
        )
        self._events.publish(_ended_event(record))
        return result

    async def _run(
        self,
        job: Job,
        ran_on: list[_Target],
        allowed: tuple[tuple[str, ...], ...],
        principal: Principal,
        request: ExecutionRequest,
        tool_log: list[ToolCallRecord],
        running: ExecutionRecord,
    ) -> Outcome:
        """Run the job on `ran_on`'s target; the tool calls it makes are appended to
        `tool_log`, and the successor it moves to, if it does, to `ran_on` (as it starts
        there, so that an exception is told where it ran). `running` is its record as
        it started."""
        target = ran_on[0]
        entry = _Running(
            job,
            principal.name,
            target.executor,
            trio.current_time(),
            trio.CancelScope(),
            request.origin,
            tool_log=tool_log,
            record=running,
        )
        self._running[job.execution_id] = entry
        self._idle = trio.Event() if self._idle.is_set() else self._idle
        outcome = Outcome(Status.CANCELLED, error=_stopped_error(Status.CANCELLED))
        try:
            bridge_for = self._open_bridge(job.execution_id, allowed, principal.name)
            with bridge_for as bridge, entry.scope:
                outcome = await target.run(job, bridge)
                if outcome.moved:
                    outcome = await self._run_moved(job, ran_on, outcome, bridge, entry)
                entry.answered = True
                if outcome.status is Status.OK and entry.stopped_as is None:
                    await _calls_read(entry, outcome.calls_written)
        finally:
            del self._running[job.execution_id]
            if not self._running:
                self._idle.set()
            if outcome.status is not Status.OK or entry.stopped_as is not None:
                for scope in entry.calls:  # a failed or stopped program's calls end
                    scope.cancel()
        return _settle(outcome, entry)

    async def _run_moved(
        self,
        job: Job,
        ran_on: list[_Target],
        moved: Outcome,
        bridge: ToolBridge,
        entry: _Running,
    ) -> Outcome:
        """Run `job` again from the start, given back unseen (`moved`) by its target's
        executor (`ran_on[0]`), on its successor, with the time it has left; where the
        policy refuses it there, on the target again, never to move. Returns how it
        ended; where is the last of `ran_on`."""
        target = ran_on[0]
        successor = target.successor
        assert successor is not None  # only a job with one is given back
        refused = await self._violation(job.language, successor.executor, job.code, job.syntax)
        if refused is not None or not await self._successor_ready(job, successor, moved, entry):
            successor = target
        if job.stop.is_set():  # stopped meanwhile (a long check is a thread's): `_settle` says why
            return moved
        outcome = await self._run_again(job, ran_on, successor, moved.queue_s, bridge, entry)
        if successor is not target and _overflowed_unseen(outcome, entry):
            # Deno's stack holds about a quarter of the calls wasm-js's does (13,000
            # against 51,000): a recursion that outgrew it, unseen, would have answered
            # where it began, and runs there again, never to move.
            outcome = await self._run_again(job, ran_on, target, outcome.queue_s, bridge, entry)
        return outcome

    async def _successor_ready(
        self, job: Job, successor: _Target, moved: Outcome, entry: _Running
    ) -> bool:
        """Whether `successor` can take the moved job: one still starting (the first
        requests after a start) is waited for as a request waits for its executor,
        within what is left of the job's time and of its queueing time, which the wait
        is counted in (`moved.queue_s`), and until the job is stopped. The parse is let
        go of first, as before any wait (`SyntaxMemo`)."""
        if self.registry.ready(successor.executor):
            return True
        if job.syntax is not None:
            job.syntax.forget()
        spent_s = trio.current_time() - entry.started - moved.queue_s
        within_s = min(job.limits.timeout_ms / 1000 - spent_s, job.queue_timeout_s - moved.queue_s)
        began = trio.current_time()
        try:
            with trio.CancelScope() as waiting, job.stop.calling(waiting.cancel):
                return await self.registry.wait_for(successor.executor, max(0.0, within_s))
            return False  # stopped meanwhile
        finally:
            moved.queue_s += trio.current_time() - began

    async def _run_again(
        self,
        job: Job,
        ran_on: list[_Target],
        on: _Target,
        queue_s: float,
        bridge: ToolBridge,
        entry: _Running,
    ) -> Outcome:
        """Run `job` from the start on `on` (appended to `ran_on`), never to move, with
        the time it has left after its runs so far (less their `queue_s` of queueing,
        which the outcome's counts too)."""
        spent_s = trio.current_time() - entry.started - queue_s
        limits = dataclasses.replace(
            job.limits, timeout_ms=max(1, job.limits.timeout_ms - round(spent_s * 1000))
        )
        again = dataclasses.replace(
            job,
            limits=limits,
            move_after_cpu_s=None,
            queue_timeout_s=max(0.0, job.queue_timeout_s - queue_s),
        )
        if entry.record is not None and on.executor != entry.executor:
            entry.record = dataclasses.replace(entry.record, executor=on.executor)
            self._events.publish(_moved_event(entry.record, entry.executor))
        entry.executor = on.executor
        ran_on.append(on)
        outcome = await on.run(again, bridge)
        outcome.queue_s += queue_s
        if outcome.error == outcomes.timed_out(Outcome(Status.OK), limits).error:
            outcomes.timed_out(outcome, job.limits)  # the program's limit, not what was left
        return outcome

    def cancel(
        self,
        principal: Principal,
        *,
        execution_id: str | None = None,
        origin: tuple[int, Any] | None = None,
    ) -> str:
        """Cancel a running execution the principal owns (the master owns all).

        Named by its execution id, or by the (connection, request id) that started it.
        Returns the execution id; raises `NotFound` if no such execution is running.
        """
        entry = next(
            (
                e
                for e in self._running.values()
                if e.execution_id == execution_id or (origin is not None and e.origin == origin)
            ),
            None,
        )
        if entry is None or not (principal.is_admin or entry.principal == principal.name):
            raise NotFound(
                "not found: no such running execution of yours; it may have finished already",
                {"execution_id": execution_id},
            )
        entry.stop(Status.CANCELLED)
        return entry.execution_id

    def cancel_all(self) -> None:
        """Ask every running execution to stop (draining); each reports `cancelled`."""
        for entry in self._running.values():
            entry.stop(Status.CANCELLED)

    def count_tool_call(self, execution_id: str | None) -> None:
        """Count one tool call against its execution's limit.

        Raises `Forbidden` once the limit is spent, and stops the program: it ends
        with status `tool_limit` and its output so far. Raises `Unauthenticated` when
        the execution is no longer running (its session token is dead).
        """
        entry = self._running.get(execution_id or "")
        if entry is None:
            raise Unauthenticated("unauthenticated: this execution has ended")
        limit = entry.job.limits.tool_calls
        if entry.tool_calls >= limit:
            if not entry.answered:  # one sent as the program answered is only refused
                entry.stop(Status.TOOL_LIMIT)
            raise ToolLimitReached(
                f"forbidden: this execution may make {limit} tool calls and has made them; "
                "raise limits.tool_calls to allow more",
                {"limit": limit},
            )
        entry.tool_calls += 1

    def call_arrived(self, execution_id: str | None) -> None:
        """A tool call of `execution_id`'s has been read from its sandbox."""
        entry = self._running.get(execution_id or "")
        if entry is not None:
            entry.arrived += 1
            entry.arrival.set()

    @contextlib.contextmanager
    def running_call(self, execution_id: str | None) -> Iterator[trio.CancelScope]:
        """The scope a tool call of `execution_id`'s runs in: cancelled should the
        execution end other than answering (`_run`), its sandbox gone or not."""
        entry = self._running.get(execution_id or "")
        with trio.CancelScope() as scope:
            if entry is None:
                scope.cancel()
                yield scope
                return
            entry.calls.add(scope)
            try:
                yield scope
            finally:
                entry.calls.discard(scope)

    def owner(self, execution_id: str | None) -> str | None:
        """Who started the running execution `execution_id` (None if none is running)."""
        entry = self._running.get(execution_id or "")
        return None if entry is None else entry.principal

    def note_tool_call(self, execution_id: str | None, call: ToolCallRecord) -> str | None:
        """Remember a tool call an execution made; returns who owns the execution."""
        entry = self._running.get(execution_id or "")
        if entry is None:
            return None
        entry.tool_log.append(call)
        return entry.principal

    async def wait_idle(self) -> None:
        """Return once no execution is running."""
        await self._idle.wait()

    def running(self) -> list[dict[str, Any]]:
        """A snapshot of the running executions for `daemon/status`: id, owner, age."""
        now = trio.current_time()
        return [
            {
                "execution_id": e.execution_id,
                "principal": e.principal,
                "executor": e.executor,
                "running_ms": round((now - e.started) * 1000, 1),
            }
            for e in self._running.values()
        ]

    def _checked_code(self, code: str) -> str:
        # Every front decodes with `jsontext`, which replaces lone surrogates; this holds
        # for callers inside the process too, whose text is hashed and stored.
        code = unwrap_fence(jsontext.clean_text(code))
        if not code.strip():
            raise InvalidParams(
                "invalid params: code is empty; send the program's source in code",
                {"field": "code", "reason": "is empty"},
            )
        size = len(code.encode())
        limit = self.limits.max_code_bytes
        if size > limit:
            raise InvalidParams(
                f"invalid params: code is {size} bytes; the limit is {limit} "
                "(limits.max_code_bytes)",
                {"field": "code", "reason": f"larger than {limit} bytes"},
            )
        return code

    def limits_for(self, requested: dict[str, int]) -> Limits:
        """The daemon's default limits with `requested` over them; `InvalidParams` for
        a value past its maximum."""
        return self._capped(self.limits.defaults.model_dump(), requested)

    def step_limits(self, session: LiveSession, requested: dict[str, int]) -> Limits:
        """A session step's limits: the session's, with `requested` over them. Its
        memory is the session's, set when it was made: a step asking another is refused."""
        memory_mb = requested.get("memory_mb", session.limits.memory_mb)
        if memory_mb != session.limits.memory_mb:
            raise InvalidParams(
                f"invalid params: limits.memory_mb = {memory_mb}, but this session's memory "
                f"is {session.limits.memory_mb} MB, set by sessions/create for all its steps",
                {"field": "limits.memory_mb", "reason": "fixed for the session"},
            )
        # The session's own limits, within today's maxima (a reload may have lowered
        # them since it was made); its memory is its sandbox's, fixed.
        maxima = self.limits.maxima
        values = {
            name: value if name == "memory_mb" else min(value, getattr(maxima, name))
            for name, value in dataclasses.asdict(session.limits).items()
        }
        return self._capped(values, requested)

    def _capped(self, values: dict[str, int], requested: dict[str, int]) -> Limits:
        config = self.limits
        for name, value in requested.items():
            maximum = getattr(config.maxima, name)
            if value > maximum:
                raise InvalidParams(
                    f"invalid params: limits.{name} = {value} exceeds the daemon's "
                    f"maximum of {maximum}",
                    {"field": f"limits.{name}", "reason": f"greater than {maximum}"},
                )
            values[name] = value
        return Limits(**values)


def _check_files_fit(files: tuple[FileData, ...], limits: Limits) -> None:
    """`InvalidParams` if the input files alone take more than `limits.disk_mb`."""
    total = sum(len(file.data) for file in files)
    if total > limits.disk_mb * MIB:
        raise InvalidParams(
            f"invalid params: the files take {total} bytes, more than limits.disk_mb "
            f"({limits.disk_mb} MB)",
            {"field": "files", "reason": "larger than limits.disk_mb"},
        )


def _checked_patterns(patterns: tuple[str, ...] | None) -> tuple[str, ...]:
    """The request's tool patterns (all tools if it names none), or `InvalidParams`."""
    if patterns is None:
        return ("*",)
    requested_allowlist(patterns)
    return patterns


def _stopped_error(status: Status) -> ErrorInfo:
    if status is Status.TOOL_LIMIT:
        return ErrorInfo(
            "ToolLimit",
            "the program made more tool calls than limits.tool_calls allows and was stopped",
        )
    return ErrorInfo("Cancelled", "the execution was cancelled before it finished")


def _interrupted(exc: BaseException, tool_calls: int) -> Outcome:
    """How an execution ended whose run raised `exc` instead of returning: cancelled
    when it was cancelled (Trio may wrap that in an exception group), else crashed."""
    if isinstance(exc, BaseExceptionGroup):
        cancelled = exc.split(trio.Cancelled)[1] is None
    else:
        cancelled = isinstance(exc, trio.Cancelled)
    if cancelled:
        outcome = Outcome(Status.CANCELLED, error=_stopped_error(Status.CANCELLED))
    else:
        outcome = Outcome(
            Status.CRASHED,
            error=ErrorInfo(
                type(exc).__name__,
                "the executor failed rather than the program; the daemon's log has the details",
            ),
        )
    outcome.tool_calls = tool_calls
    return outcome


async def _calls_read(entry: _Running, written: int) -> None:
    """Return once the daemon has read the `written` tool calls a subprocess sandbox
    wrote before it answered (a call it never awaited, started last, may still be in
    the socket), or after `_CALLS_READ_S`: its session ends as this returns."""
    with trio.move_on_after(_CALLS_READ_S):
        while entry.arrived < written:
            entry.arrival = trio.Event()
            await entry.arrival.wait()


# How V8 (deno) says a program's recursion outgrew its stack.
_STACK_OVERFLOW = ErrorInfo("RangeError", "Maximum call stack size exceeded")


def _overflowed_unseen(outcome: Outcome, entry: _Running) -> bool:
    """Whether a run failed as its stack overflowed with nothing of it seen outside its
    sandbox: no output streamed, no tool call made or sent, not stopped by the daemon."""
    error = outcome.error
    live = entry.job.on_output
    return (
        outcome.status is Status.ERROR
        and error is not None
        and (error.type, error.message) == (_STACK_OVERFLOW.type, _STACK_OVERFLOW.message)
        and (live is None or (isinstance(live, LiveOutput) and not live.sent))
        and entry.tool_calls == 0
        and outcome.calls_written == 0
        and not entry.job.stop.is_set()
    )


def _settle(outcome: Outcome, entry: _Running) -> Outcome:
    """Fold in what the daemon knows: tool calls made, and why it stopped the program."""
    outcome.tool_calls = entry.tool_calls
    if entry.stopped_as is not None and outcome.status in _OVERRIDDEN_BY[entry.stopped_as]:
        outcome.status = entry.stopped_as
        outcome.error = _stopped_error(entry.stopped_as)
        # A stopped program has no result, whatever it reached before the stop landed.
        outcome.result = None
    return outcome


# What the program's own ending says matters less than why the daemon stopped it: a
# program refused its next tool call may fail on that refusal before the kill lands,
# and that is still a tool limit. A program that finished before a cancel arrived did
# finish, and one that hit a limit of its own reports that.
_OVERRIDDEN_BY = {
    Status.TOOL_LIMIT: frozenset({Status.OK, Status.ERROR, Status.CANCELLED, Status.CRASHED}),
    Status.CANCELLED: frozenset({Status.CANCELLED, Status.CRASHED}),
}


# Which limit each limit status means, as the audit store and metrics name it.
_LIMIT_OF = {
    Status.TIMEOUT: "timeout",
    Status.MEMORY_LIMIT: "memory",
    Status.DISK_LIMIT: "disk",
    Status.OUTPUT_LIMIT: "output",
    Status.TOOL_LIMIT: "tool_calls",
}
_ENDED_AS = {
    Status.OK: EventType.EXECUTION_FINISHED,
    Status.TIMEOUT: EventType.EXECUTION_TIMED_OUT,
    Status.MEMORY_LIMIT: EventType.LIMIT_EXCEEDED,
    Status.DISK_LIMIT: EventType.LIMIT_EXCEEDED,
    Status.OUTPUT_LIMIT: EventType.LIMIT_EXCEEDED,
    Status.TOOL_LIMIT: EventType.LIMIT_EXCEEDED,
    # Refused by the policy: it never ran, and `policy.violation` said why first.
    Status.REFUSED: EventType.EXECUTION_FAILED,
}


def _record(
    result: ExecutionResult,
    job: Job,
    principal: str,
    allowed: tuple[str, ...],
    digest: str,
    started_at: float,
    tool_log: tuple[ToolCallRecord, ...],
) -> ExecutionRecord:
    """What the audit store and events keep of an ended execution."""
    error = result.error
    value = "" if result.result is None else jsontext.dumps(result.result)
    status = Status(result.status)
    return ExecutionRecord(
        **_from_the_start(job, principal, allowed, digest, started_at),
        executor=result.executor,
        status=result.status,
        queue_ms=result.queue_ms,
        duration_ms=result.duration_ms,
        exit_code=result.exit_code,
        error_type=error.type if error else None,
        error_message=error.message if error else None,
        limit_hit=_LIMIT_OF.get(status),
        policy_rule=error.rule if error and status is Status.REFUSED else None,
        result_bytes=len(value.encode()),
        result_head=head(value),
        stdout_bytes=len(result.stdout.encode()),
        stdout_head=head(result.stdout),
        stderr_bytes=len(result.stderr.encode()),
        stderr_head=head(result.stderr),
        memory_peak_bytes=result.memory_peak_bytes,
        tool_calls=tool_log,
        session_id=result.session_id,
        files_out=_file_records((file.path, file.size) for file in result.files),
    )


def _running_record(
    job: Job,
    target: _Target,
    principal: str,
    allowed: tuple[str, ...],
    digest: str,
    started_at: float,
    queue_wait_s: float,
) -> ExecutionRecord:
    """What the audit store keeps of an execution from its start until it ends."""
    return ExecutionRecord(
        **_from_the_start(job, principal, allowed, digest, started_at),
        executor=target.executor,
        status=RUNNING,
        queue_ms=round(queue_wait_s * 1000, 3),
        duration_ms=0.0,
        session_id=target.session.session_id if target.session is not None else None,
    )


def _from_the_start(
    job: Job, principal: str, allowed: tuple[str, ...], digest: str, started_at: float
) -> dict[str, Any]:
    """An execution record's fields known from its start: who ran what, and when."""
    return {
        "execution_id": job.execution_id,
        "principal": principal,
        "language": job.language,
        "code_sha256": digest,
        "code_bytes": len(job.code.encode()),
        "code_snippet": head(job.code, SNIPPET_CHARS),
        "allowed_tools": allowed,
        "started_at": started_at,
        "files_in": _file_records((file.path, len(file.data)) for file in job.files),
    }


def _started_event(running: ExecutionRecord) -> BusEvent:
    data = {
        "execution_id": running.execution_id,
        "principal": running.principal,
        "executor": running.executor,
        "language": running.language,
        "code_sha256": running.code_sha256,
    }
    if running.session_id is not None:
        data["session_id"] = running.session_id
    return BusEvent(
        EventType.EXECUTION_STARTED,
        data,
        running.principal,
        running.started_at,
        started=running,
    )


def _moved_event(running: ExecutionRecord, moved_from: str) -> BusEvent:
    """The execution runs again from the start on `running.executor` (see `wasm_moves`)."""
    event = _started_event(running)
    data = {**event.data, "from": moved_from}
    return dataclasses.replace(event, type=EventType.EXECUTION_MOVED, data=data, ts=time.time())


async def _nothing_to_wait_for() -> None:
    return None


def _file_records(files: Iterable[tuple[str, int]]) -> tuple[FileRecord, ...]:
    """What the record keeps of an execution's files: the first RECORDED_FILES, each
    path's head, and when there were more, one last entry `…` with their count and
    total size, so a flood of files costs the store a few hundred bytes."""
    kept, more, more_bytes = [], 0, 0
    for path, size in files:
        if len(kept) < RECORDED_FILES:
            kept.append(FileRecord(head(path, RECORDED_PATH_CHARS), size))
        else:
            more, more_bytes = more + 1, more_bytes + size
    if more:
        kept.append(FileRecord(f"… {more} more", more_bytes))
    return tuple(kept)


def _ended_event(record: ExecutionRecord) -> BusEvent:
    kind = _ENDED_AS.get(Status(record.status), EventType.EXECUTION_FAILED)
    data = {
        "execution_id": record.execution_id,
        "principal": record.principal,
        "executor": record.executor,
        "language": record.language,
        "status": record.status,
        "duration_ms": record.duration_ms,
        "tool_calls": len(record.tool_calls),
    }
    if record.limit_hit:
        data["limit"] = record.limit_hit
    if record.policy_rule:
        data["rule"] = record.policy_rule
    if record.error_type:
        data["error"] = {"type": record.error_type, "message": record.error_message}
    return BusEvent(kind, data, record.principal, record=record)


def _result(
    execution_id: str,
    target: _Target,
    outcome: Outcome,
    duration_s: float,
    queue_wait_s: float,
    limits: Limits | None = None,
) -> ExecutionResult:
    """The execution's answer. Text a program chose is made storable and sendable here
    (lone surrogates replaced), once, for the reply, the record and the events alike;
    executors decode results with `jsontext`, which already did the same for them.
    Returned files share `limits.result_bytes` with the result's value."""
    files: tuple[ReturnedFile, ...] = ()
    if outcome.files and limits is not None:
        used = len(jsontext.dumps(outcome.result).encode()) if outcome.result is not None else 0
        files = returned_files(outcome.files, max(0, limits.result_bytes - used))
    return ExecutionResult(
        execution_id=execution_id,
        status=str(outcome.status),
        result=outcome.result,
        stdout=jsontext.clean_text(outcome.stdout),
        stderr=jsontext.clean_text(outcome.stderr),
        exit_code=outcome.exit_code,
        error=_program_error(outcome.error),
        truncated=Truncated(stdout=outcome.truncated_stdout, stderr=outcome.truncated_stderr),
        tool_calls=outcome.tool_calls,
        duration_ms=round(duration_s * 1000, 3),
        queue_ms=round(queue_wait_s * 1000, 3),
        executor=target.executor,
        memory_peak_bytes=outcome.memory_peak_bytes,
        session_id=target.session_id,
        session_reset=outcome.session_reset if target.session is not None else False,
        files=files,
    )


def _program_error(error: ErrorInfo | None) -> ProgramError | None:
    return None if error is None else _cleaned(error)


def _cleaned(error: ErrorInfo) -> ProgramError:
    clean = jsontext.clean_text
    return ProgramError(clean(error.type), clean(error.message), clean(error.traceback))
