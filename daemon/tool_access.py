"""Who may see and call which tool, and the one place gateway errors become wire errors.

Every tool call, from a client or from a sandbox, comes through `ToolAccess.call`: the
tool is resolved within the caller's allowlists, a sandbox's call is counted against
its execution's limit, and gateway failures are translated (most specific first) into
the RPC errors the caller sees. Tool calls never take an execution slot and never
count against the rate limit: a program holding the only slot must finish.

A caller whose allowlists hold back some tools (a sandbox, or a client token with
`allowed_tools`) may not learn which tools exist beyond those it may call. A tool that
does not exist and one its allowlists exclude get one answer (`unavailable`): the same
code, message and data, after the same work (`hides_catalogue`). A caller that may
call every tool is never refused one, so it is told what is missing, with close
matches.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol

import trio

from conduit.core.errors import (
    Forbidden,
    GatewayError,
    InvalidParams,
    NotFound,
    RpcError,
    Unauthenticated,
    UpstreamError,
)
from conduit.daemon.events import BusEvent, EventType
from conduit.daemon.records import ToolCallRecord
from conduit.gateway.allowlist import Allowlist
from conduit.gateway.catalogue import (
    Catalogue,
    ToolForbidden,
    ToolNotFound,
    UpstreamRefused,
    error_of,
    value_of,
)
from conduit.gateway.model import UpstreamState, UpstreamStatus, UpstreamTool
from conduit.gateway.schemas import ArgumentsInvalid
from conduit.gateway.upstream import CallObserver

if TYPE_CHECKING:
    from conduit.daemon.auth import Principal
    from conduit.daemon.events import EventBus

__all__ = [
    "ToolAccess",
    "ToolLedger",
    "allowlists_for",
    "gateway_errors",
    "hides_catalogue",
    "requested_allowlist",
    "shaped",
    "unavailable",
    "wire_error",
]


def allowlists_for(principal: Principal) -> list[Allowlist]:
    """The allowlists that must all allow a tool for `principal` to use it (a new list)."""
    return list(_allowlists(principal.tool_patterns))


# Parsing patterns (checked against the SDK's naming rules) costs more than matching a
# tool; a sandbox asks once per tool call with the same patterns. Allowlists depend
# on nothing but their patterns, so entries never go stale; the bound covers the
# distinct allowed_tools of the executions running at once, and then some.
@functools.lru_cache(maxsize=1024)
def _allowlists(tool_patterns: tuple[tuple[str, ...], ...]) -> tuple[Allowlist, ...]:
    return tuple(Allowlist(patterns) for patterns in tool_patterns)


def hides_catalogue(principal: Principal) -> bool:
    """Whether `principal` must not learn which tools exist beyond those it may call.

    True for a sandbox, and for any caller one of whose allowlists lacks `*`: told
    "not found" for one name and "forbidden" for another, it would learn that the
    second exists. A caller whose allowlists are all `*` may call every tool there is,
    so nothing is hidden from it.
    """
    return principal.kind == "session" or any("*" not in p for p in principal.tool_patterns)


def requested_allowlist(patterns: Sequence[str]) -> Allowlist:
    """A request's `allowed_tools` as an allowlist; `InvalidParams` if one is malformed."""
    try:
        return Allowlist(patterns)
    except ValueError as exc:
        raise InvalidParams(
            f"invalid params: allowed_tools: {exc}",
            {"field": "allowed_tools", "reason": str(exc)},
        ) from None


@contextmanager
def gateway_errors(tool: str | None = None) -> Iterator[None]:
    """Translate gateway failures into wire errors (`wire_error`)."""
    try:
        yield
    except GatewayError as exc:
        raise wire_error(exc, tool) from exc


def wire_error(exc: GatewayError, tool: str | None = None) -> RpcError:
    """The wire error for a gateway failure, most specific first."""
    data = {"tool": tool}
    if isinstance(exc, ToolNotFound):
        return NotFound(f"not found: {exc}", data)  # which says where to look
    if isinstance(exc, ToolForbidden):
        return Forbidden(f"forbidden: {exc}", data)
    if isinstance(exc, ArgumentsInvalid):
        return InvalidParams(
            f"invalid arguments for {tool}: {'; '.join(exc.errors)}",
            {**data, "field": "arguments", "errors": exc.errors},
        )
    if isinstance(exc, UpstreamRefused):
        return InvalidParams(f"invalid params: {exc}", data)
    # SchemaInvalid, UpstreamUnreachable, and any other
    return UpstreamError(f"upstream error: {exc}", data)


def unavailable(name: str) -> Forbidden:
    """What a caller that `hides_catalogue` is told of any tool it may not call,
    existing or not.

    It depends on nothing but `name` as the program spelled it: no canonical path, no
    suggestions, so no answer says which names the catalogue holds.
    """
    return Forbidden(
        f"forbidden: tool {name} is not allowed here; add it to allowed_tools, "
        "within what your token allows",
        {"tool": name},
    )


def shaped(tool: UpstreamTool, result: dict[str, Any]) -> dict[str, Any]:
    """A tool result as sandboxes' SDKs take it: `{value}` or `{error}` (one shape)."""
    if result.get("isError"):
        return {"error": {"message": error_of(result), "tool": tool.id}}
    return {"value": value_of(result)}


class ToolLedger(Protocol):
    """Where a sandbox's tool calls are counted and kept (the daemon's `Executions`)."""

    def count_tool_call(self, execution_id: str | None) -> None:
        """Count one call; raises once the execution's limit is spent or it has ended."""
        ...

    def running_call(self, execution_id: str | None) -> AbstractContextManager[trio.CancelScope]:
        """The scope a call of the execution's runs in: cancelled if the execution ends
        other than answering (failed, or stopped), as its sandbox's own calls are."""
        ...

    def note_tool_call(self, execution_id: str | None, call: ToolCallRecord) -> str | None:
        """Keep a call in its execution's record; returns who owns the execution."""
        ...


class ToolAccess:
    """The daemon's view of the catalogue, per principal.

    It also reports upstreams coming and going on the event bus: `upstream.up` when
    one becomes ready, `upstream.down` (with the error) when one that was up, or had
    not come up yet, fails or starts backing off. Retries of an upstream that stays
    down are not repeated; a daemon closing its upstreams reports nothing.
    """

    def __init__(
        self,
        catalogue: Catalogue,
        *,
        events: EventBus,
        ledger: ToolLedger,
        call_timeout_s: float,
    ) -> None:
        self.catalogue = catalogue
        self._events = events
        self._ledger = ledger
        # How long one upstream call may take (`gateway.call_timeout_s`; reloadable).
        self.call_timeout_s = call_timeout_s
        # Whether each upstream was last reported up (absent: not reported yet).
        self._reported_up: dict[str, bool] = {}
        catalogue.watch_state(self._on_upstream_state)

    def _on_upstream_state(self, status: UpstreamStatus) -> None:
        if status.state is UpstreamState.READY:
            up = True
        elif status.state in (UpstreamState.BACKING_OFF, UpstreamState.FAILED):
            up = False
        else:  # starting (a retry under way) or closed (the daemon is stopping)
            return
        if self._reported_up.get(status.name) is up:
            return
        self._reported_up[status.name] = up
        data = {
            "upstream": status.name,
            "transport": status.transport,
            "state": str(status.state),
            "tools": status.tools,
            "restarts": status.restarts,
            "error": status.last_error,
        }
        kind = EventType.UPSTREAM_UP if up else EventType.UPSTREAM_DOWN
        self._events.publish(BusEvent(kind, data))

    def visible(self, principal: Principal) -> list[UpstreamTool]:
        """The catalogue's tools this principal may call, by SDK path."""
        return self.catalogue.tools(allowlists_for(principal))

    def resolve(self, principal: Principal, name: str) -> UpstreamTool:
        """The tool `name` names (id or SDK path), if this principal may call it.

        Raises `unavailable(name)`, whether the tool is missing or not allowed, when
        the catalogue is hidden from this principal (`hides_catalogue`); otherwise
        `NotFound` with close matches.
        """
        hidden = hides_catalogue(principal)
        allow = _allowlists(principal.tool_patterns)
        try:  # on every tool call: plain try, no context manager
            return self.catalogue.resolve(name, allow=allow, suggest=not hidden)
        except GatewayError as exc:
            raise _refusal(principal, exc, name) from exc

    async def call(
        self,
        principal: Principal,
        name: str,
        arguments: dict[str, Any],
        *,
        observer: CallObserver | None = None,
    ) -> tuple[UpstreamTool, dict[str, Any]]:
        """Call a tool for `principal`; returns it and its MCP `CallToolResult` JSON.

        Every call, refused or not, is reported as a `tool.called` event and, for a
        sandbox, kept in its execution's record: a program reaching for a tool outside
        its allowlist is something an operator wants to see.
        """
        started = time.perf_counter()
        called = name
        upstream = None
        outcome = "error"
        try:
            tool = self.resolve(principal, name)
            called, upstream = tool.id, tool.upstream
            if principal.kind == "session":
                self._ledger.count_tool_call(principal.execution_id)
            try:
                result = await self._call(principal, tool, arguments, observer)
            except ToolNotFound as exc:  # it left since `resolve`: as if never there
                raise _refusal(principal, exc, name) from exc
            except GatewayError as exc:
                raise wire_error(exc, tool.id) from exc
            outcome = "error" if result.get("isError") else "ok"
        except RpcError as exc:
            outcome = _outcome_name(exc)
            raise
        finally:
            call = ToolCallRecord(called, round((time.perf_counter() - started) * 1000, 3), outcome)
            self._report(principal, call, upstream)
        return tool, result

    async def _call(
        self,
        principal: Principal,
        tool: UpstreamTool,
        arguments: dict[str, Any],
        observer: CallObserver | None,
    ) -> dict[str, Any]:
        """`catalogue.call`; a sandbox's within its execution's `running_call` scope."""
        sandbox = principal.kind == "session"
        with self._ledger.running_call(principal.execution_id) if sandbox else nullcontext():
            return await self.catalogue.call(
                tool, arguments, timeout_s=self.call_timeout_s, observer=observer
            )
        # Only a sandbox's scope swallows a cancellation: its execution ended.
        raise Unauthenticated(f"unauthenticated: execution {principal.execution_id} has ended")

    def _report(self, principal: Principal, call: ToolCallRecord, upstream: str | None) -> None:
        owner = principal.name
        if principal.kind == "session":
            # A call a program left going on may end after its execution: its owner then
            # comes with the session.
            recorded = self._ledger.note_tool_call(principal.execution_id, call)
            owner = recorded or principal.owner or owner
        data = {
            "tool": call.tool,
            "upstream": upstream,
            "duration_ms": call.duration_ms,
            "outcome": call.outcome,
            "execution_id": principal.execution_id,
        }
        self._events.publish(BusEvent(EventType.TOOL_CALLED, data, owner))


def _refusal(principal: Principal, exc: GatewayError, name: str) -> RpcError:
    """The wire error for a failed lookup of `name`: `unavailable` if it must not tell."""
    if isinstance(exc, ToolNotFound | ToolForbidden) and hides_catalogue(principal):
        return unavailable(name)
    return wire_error(exc, name)


def _outcome_name(error: RpcError) -> str:
    """`Forbidden` → `forbidden`, `NotFound` → `not_found`: how a refused call ended."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(error).__name__).lower()
