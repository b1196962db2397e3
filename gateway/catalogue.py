"""The tool catalogue: every tool Conduit can call, found by id or SDK path, and the calls.

The catalogue owns the upstream objects (anything implementing `upstream.Upstream`),
runs each one's `serve()` in its own task, keeps the tool list each one reports, and
answers lookups, allowlist-filtered listings, validation and calls. It knows nothing of
transports, sockets, tokens or JSON-RPC: the daemon's methods translate its
`GatewayError`s into wire errors (see "Errors" below).

## What a tool call returns, in every guest language

`tools.<namespace>.<tool>(args)` resolves to the *value* of the MCP `CallToolResult`,
computed by `value_of()`. This is the one definition; the daemon computes the value and
every guest shim passes it through unchanged, so all languages return the same thing:

1. `structuredContent`, when present and not null: that object, as is.
2. Otherwise, no content (missing or empty): `null` (`None` in Python).
3. Otherwise, when every content item is text: the texts joined with "\\n". If that
   string is strict JSON (no NaN or Infinity), the parsed value; else the string.
   So `'{"a": 1}'` gives `{"a": 1}`, `'42'` gives `42`, `'hello'` gives `"hello"`.
4. Otherwise (images, audio, resources, or a mix): the content list, as is.

A result with `isError: true` has no value: the call throws/raises `ToolError`, whose
message is `error_of()`: the texts joined with "\\n"; else the `structuredContent` as
JSON; else "the tool reported an error without a message".

## Built-in tools

`LocalUpstream` serves Python callables (`LocalTool`) as if they were an MCP upstream:
`LocalUpstream("fetch", [LocalTool.from_raw(FETCH_TOOL, fetcher.fetch)])` gives tool id
`fetch__fetch`, SDK `tools.fetch.fetch`. A handler is called as
`await handler(arguments, timeout_s=...)` and returns any JSON value; a `GatewayError`
it raises (`ToolFailed`, or its own, like fetch's refusals) is a tool-level failure: an
`isError` result the guest sees as `ToolError`.

## Schema TTL

The catalogue never asks an upstream to re-list: it takes whatever list the upstream
reports through `on_tools`. Each MCP upstream's own task re-lists on
`notifications/tools/list_changed` and, for servers that never send it, every
`schema_ttl_s` (`gateway/keeper.py`, `_refresh_on_change`).

## Errors

`ToolNotFound` (-> NotFound), `ToolForbidden` (-> Forbidden), `UpstreamRefused`
(-> InvalidParams), `schemas.ArgumentsInvalid` (-> InvalidParams), `SchemaInvalid` and
`UpstreamUnreachable` (-> UpstreamError). All are `GatewayError`s.
"""

from __future__ import annotations

import difflib
import enum
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol

import trio

from conduit.core import jsontext
from conduit.core.errors import GatewayError, SchemaInvalid, UpstreamUnreachable
from conduit.gateway.allowlist import Allowlist, permits
from conduit.gateway.model import UpstreamState, UpstreamStatus, UpstreamTool
from conduit.gateway.naming import assign_names, namespace_for
from conduit.gateway.schemas import SchemaCache
from conduit.gateway.upstream import (
    CallObserver,
    RawTool,
    ReportsState,
    StateListener,
    Upstream,
)

__all__ = [
    "Catalogue",
    "CatalogueState",
    "LocalHandler",
    "LocalTool",
    "LocalUpstream",
    "Package",
    "ToolFailed",
    "ToolForbidden",
    "ToolNotFound",
    "UpstreamRefused",
    "error_of",
    "value_of",
]

log = logging.getLogger("conduit.gateway")

# Upstreams enforce `timeout_s` themselves; this backstop only catches one that does not
# (an upstream whose `enforces_timeout` is true is trusted to, and spared the scope).
CALL_GRACE_S = 1.0
# Enough to catch a typo, few enough to read in one error line.
MAX_SUGGESTIONS = 3


class ToolNotFound(GatewayError):
    """No tool has this id or SDK path (among those the caller may see)."""

    def __init__(self, name: str, suggestions: Sequence[str] = ()) -> None:
        hint = f"; did you mean {', '.join(map(repr, suggestions))}?" if suggestions else ""
        super().__init__(f"no tool {name!r}{hint}; tools/list shows the tools you may call")
        self.name = name
        self.suggestions = list(suggestions)


class ToolForbidden(GatewayError):
    """The tool exists but an allowlist in force does not allow it."""

    def __init__(self, tool: UpstreamTool) -> None:
        super().__init__(
            f"tool {tool.path} is not allowed here; add it to allowed_tools, "
            "within what your token allows"
        )
        self.tool = tool


class UpstreamRefused(GatewayError):
    """An upstream cannot join: its name is unusable or taken, or its namespace clashes."""


class ToolFailed(GatewayError):
    """Raised by a `LocalTool` handler: the tool failed; the guest sees a `ToolError`."""


class LocalHandler(Protocol):
    """What a `LocalTool` runs: the tool's value for `arguments`, within `timeout_s`."""

    async def __call__(self, arguments: dict[str, Any], *, timeout_s: float) -> Any: ...


def _texts(result: Mapping[str, Any]) -> list[str] | None:
    """The texts of an all-text content list; `None` if any item is not text."""
    content = result.get("content") or []
    texts = [
        item["text"]
        for item in content
        if isinstance(item, dict)
        and item.get("type") == "text"
        and isinstance(item.get("text"), str)
    ]
    return texts if len(texts) == len(content) else None


# How a JSON text may begin, after the whitespace JSON allows (RFC 8259).
_JSON_SPACE = " \t\n\r"
_JSON_STARTS = ("{", "[", '"', "-", *"0123456789", "t", "f", "n")


def value_of(result: Mapping[str, Any]) -> Any:
    """The value `tools.ns.tool()` returns for a successful result (module docstring)."""
    if result.get("structuredContent") is not None:
        return result["structuredContent"]
    if not result.get("content"):
        return None
    texts = _texts(result)
    if texts is None:
        return result["content"]
    text = "\n".join(texts)
    if not text.lstrip(_JSON_SPACE).startswith(_JSON_STARTS):
        return text  # prose: what json.loads would refuse, without raising to say so
    try:
        # Lenient numbers: NaN or 1e400 from an upstream reads as null, as the daemon
        # would send it; lone surrogates read as U+FFFD.
        return jsontext.loads(text, lenient_numbers=True)
    except jsontext.JsonTextError:
        return text


def error_of(result: Mapping[str, Any]) -> str | None:
    """The `ToolError` message for an `isError` result; `None` if it is not an error."""
    if not result.get("isError"):
        return None
    texts = [
        item["text"]
        for item in result.get("content") or []
        if isinstance(item, dict) and isinstance(item.get("text"), str)
    ]
    if "".join(texts).strip():
        return "\n".join(texts)
    if result.get("structuredContent") is not None:
        return json.dumps(result["structuredContent"], ensure_ascii=False)
    return "the tool reported an error without a message"


@dataclass(frozen=True, slots=True)
class LocalTool:
    """A tool served in-process: `handler(arguments, timeout_s=...)` returns a JSON value.

    The handler raises a `GatewayError` (such as `ToolFailed`) for a failure the
    program should see as a `ToolError`; anything else it raises is a bug and reaches
    the daemon as one.
    """

    name: str
    description: str
    input_schema: dict[str, Any]
    handler: LocalHandler
    output_schema: dict[str, Any] | None = None
    annotations: dict[str, Any] | None = None

    @classmethod
    def from_raw(cls, raw: RawTool, handler: LocalHandler) -> LocalTool:
        """A local tool described by an MCP `Tool` object (`name`, `inputSchema`, ...)."""
        return cls(
            name=raw["name"],
            description=raw.get("description", ""),
            input_schema=raw.get("inputSchema", {}),
            handler=handler,
            output_schema=raw.get("outputSchema"),
            annotations=raw.get("annotations"),
        )

    def raw(self) -> RawTool:
        """This tool as an MCP `Tool` object."""
        raw: RawTool = {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.input_schema,
        }
        if self.output_schema is not None:
            raw["outputSchema"] = self.output_schema
        if self.annotations is not None:
            raw["annotations"] = self.annotations
        return raw


def _value_result(value: Any) -> dict[str, Any]:
    """A `CallToolResult` whose `value_of` is `value` again."""
    result: dict[str, Any] = {
        "content": [{"type": "text", "text": json.dumps(value, ensure_ascii=False)}],
        "isError": False,
    }
    if isinstance(value, dict):
        result["structuredContent"] = value
    return result


def _error_result(message: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": message}], "isError": True}


class LocalUpstream:
    """Built-in tools (Python callables) presented to the catalogue as one upstream.

    Implements `Upstream` with transport `"local"`: `serve` reports the tools and waits
    until cancelled; `call_tool` runs the handler under `timeout_s`, raising
    `UpstreamUnreachable` if it takes longer.
    """

    enforces_timeout = True  # see `Upstream`

    def __init__(self, name: str, tools: Sequence[LocalTool], *, description: str = "") -> None:
        self.name = name
        self.description = description
        self._tools = {tool.name: tool for tool in tools}
        self._state = UpstreamState.STARTING

    async def serve(
        self,
        on_tools: Callable[[list[RawTool]], None],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        on_tools([tool.raw() for tool in self._tools.values()])
        self._state = UpstreamState.READY
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            self._state = UpstreamState.CLOSED

    async def call_tool(
        self, name: str, arguments: dict[str, Any], *, timeout_s: float
    ) -> dict[str, Any]:
        tool = self._tools.get(name)
        if tool is None:
            return _error_result(f"no tool {name!r} in {self.name!r}")
        with trio.move_on_after(timeout_s):
            try:
                return _value_result(await tool.handler(arguments, timeout_s=timeout_s))
            except GatewayError as exc:  # the tool's own refusal or failure
                return _error_result(str(exc))
        raise UpstreamUnreachable(f"{self.name}.{name} did not finish within {timeout_s} s")

    def status(self) -> UpstreamStatus:
        info = {"name": f"conduit-{self.name}", "title": self.description}
        return UpstreamStatus(self.name, "local", self._state, len(self._tools), server_info=info)

    def __repr__(self) -> str:
        return f"<LocalUpstream {self.name!r} {sorted(self._tools)} ({self._state})>"


@dataclass(frozen=True, slots=True)
class Package:
    """One namespace for `tools/packages`: what it is and its tools' one-line summaries."""

    namespace: str
    upstream: str
    description: str
    tools: dict[str, str]  # SDK name -> first line of the tool's description

    @property
    def count(self) -> int:
        return len(self.tools)


class CatalogueState(enum.StrEnum):
    """A catalogue's lifecycle: built, serving its upstreams, or done (it serves once)."""

    NEW = "new"
    SERVING = "serving"
    CLOSED = "closed"


@dataclass(eq=False, slots=True)
class _Entry:
    """One upstream as the catalogue keeps it."""

    upstream: Upstream
    namespace: str
    strict: bool
    tools: dict[str, UpstreamTool] = field(default_factory=dict)  # by id
    failure: str | None = None  # why its task died, if it did


class _StartedOnce:
    """A task status that tolerates being told twice, so we can always tell it last."""

    def __init__(self, inner: trio.TaskStatus[None]) -> None:
        self._inner = inner
        self._started = False

    def started(self, value: None = None) -> None:
        if not self._started:
            self._started = True
            self._inner.started()


def _describe(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]  # a nursery's group of one says less than its member
    return f"{type(exc).__name__}: {exc}"


def _summary(description: str) -> str:
    return description.strip().split("\n", 1)[0].strip()


class Catalogue:
    """Every tool of every upstream, by id (`ns__tool`) and SDK path (`ns.tool`).

    `strict` is the default validation mode; `strict_upstreams` overrides it per upstream
    name. Raises `UpstreamRefused` for an unusable or duplicate upstream. The
    constructor starts nothing: `serve()` runs the upstreams.
    """

    def __init__(
        self,
        upstreams: Iterable[Upstream] = (),
        *,
        strict: bool = False,
        strict_upstreams: Mapping[str, bool] | None = None,
    ) -> None:
        self._strict = strict
        self._schemas = SchemaCache()
        self._entries: dict[str, _Entry] = {}
        self._by_id: dict[str, UpstreamTool] = {}
        self._by_path: dict[str, UpstreamTool] = {}
        self._sorted: list[UpstreamTool] = []
        self._state = CatalogueState.NEW
        self._nursery: trio.Nursery | None = None
        self._state_listeners: list[StateListener] = []
        self._watchers: list[Callable[[], None]] = []
        overrides = strict_upstreams or {}
        for upstream in upstreams:
            self._add(upstream, overrides.get(upstream.name))

    def __repr__(self) -> str:
        return (
            f"<Catalogue {self._state}: {len(self._entries)} upstreams, {len(self._by_id)} tools>"
        )

    @property
    def state(self) -> CatalogueState:
        return self._state

    def watch(self, callback: Callable[[], None]) -> None:
        """Call `callback()` each time the set of tools, or any tool's schema, changes.

        It is called synchronously from whichever task changed the list, so it must only
        hand the news on (set a flag, queue a message), never block.
        """
        self._watchers.append(callback)

    # -- upstream lifecycle ------------------------------------------------------------

    def _add(self, upstream: Upstream, strict: bool | None) -> _Entry:
        name = upstream.name
        # Without '__' in upstream names and with distinct namespaces (which also folds
        # a trailing '_'), no two upstreams can produce the same tool id.
        if not isinstance(name, str) or not name or "__" in name:
            raise UpstreamRefused(
                f"upstream name {name!r} is unusable: it must be non-empty and must not "
                "contain '__' (the tool id separator); rename it"
            )
        if name in self._entries:
            raise UpstreamRefused(f"an upstream named {name!r} already exists; pick another name")
        namespace = namespace_for(name)
        for other in self._entries.values():
            if other.namespace == namespace:
                raise UpstreamRefused(
                    f"upstreams {other.upstream.name!r} and {name!r} would share the SDK "
                    f"namespace {namespace!r}; rename one of them"
                )
        entry = _Entry(upstream, namespace, self._strict if strict is None else strict)
        self._entries[name] = entry
        if isinstance(upstream, ReportsState):
            upstream.watch_state(self._report_state)
        return entry

    def watch_state(self, listener: StateListener) -> None:
        """Call `listener(status)` whenever an upstream's state changes, for every
        upstream, present and future, that reports its state (`ReportsState`), and
        when an upstream's task fails (its status then says `failed`).

        Listeners are called from upstream tasks, must not block, and may not raise
        (a raising one is logged and ignored).
        """
        self._state_listeners.append(listener)

    def _report_state(self, status: UpstreamStatus) -> None:
        for listener in self._state_listeners:
            try:
                listener(status)
            except Exception:  # a watcher's fault must not stop the upstream
                log.exception("upstream %r: a state listener failed", status.name)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run every upstream, each in its own task, until cancelled.

        Calls `task_status.started()` once every upstream has made its first attempt
        (they start concurrently; an unreachable one does not hold up the rest). An
        upstream whose task fails is logged, its tools withdrawn and its status shown
        as failed; the catalogue and the other upstreams carry on. Returns only when
        cancelled, cancelling every upstream task with it. Serves once.
        """
        if self._state is not CatalogueState.NEW:
            raise RuntimeError(f"a catalogue serves once; this one is {self._state}")
        try:
            async with trio.open_nursery() as nursery:
                self._nursery, self._state = nursery, CatalogueState.SERVING
                async with trio.open_nursery() as starting:
                    for entry in list(self._entries.values()):
                        starting.start_soon(nursery.start, self._keep, entry)
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery, self._state = None, CatalogueState.CLOSED

    async def register(self, upstream: Upstream, *, strict: bool | None = None) -> None:
        """Add an upstream at runtime (`upstreams/register`) and start its task.

        Returns once it has made its first attempt. `strict=None` takes the catalogue's
        default. Raises `UpstreamRefused` for a duplicate or unusable name, or a
        namespace clash; `RuntimeError` once the catalogue has closed. Before `serve()`
        the upstream is only added, and starts with the rest.
        """
        if self._state is CatalogueState.CLOSED:
            raise RuntimeError("the catalogue has closed; no upstream can join it")
        entry = self._add(upstream, strict)
        if self._nursery is not None:
            await self._nursery.start(self._keep, entry)

    async def _keep(
        self, entry: _Entry, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """One upstream's task: its `serve()`; its tools are withdrawn when it ends."""
        status = _StartedOnce(task_status)
        try:
            await entry.upstream.serve(partial(self._on_tools, entry), task_status=status)
            log.info("upstream %r stopped", entry.upstream.name)
        except Exception as exc:  # an upstream failing must never take the catalogue down
            log.exception("upstream %r failed; its tools are withdrawn", entry.upstream.name)
            entry.failure = _describe(exc)
        entry.tools = {}
        self._reindex()
        if entry.failure is not None:
            self._report_state(self._status(entry))
        status.started()

    def _on_tools(self, entry: _Entry, raw_tools: list[RawTool]) -> None:
        """`on_tools` for one upstream: name its tools and swap them in."""
        bare = bool(getattr(entry.upstream, "bare_names", False))
        named = assign_names(entry.upstream.name, raw_tools, bare=bare)
        entry.tools = {tool.id: tool for tool in named}
        self._reindex()

    def _reindex(self) -> None:
        # Rebuilt whole, never mutated: a lookup never sees half of an update.
        tools = sorted(
            (tool for entry in self._entries.values() for tool in entry.tools.values()),
            key=lambda tool: tool.path,
        )
        changed = tools != self._sorted
        self._sorted = tools
        self._by_id = {}
        for tool in tools:
            # Only an upstream with `bare_names` can give an id another tool has.
            if self._by_id.setdefault(tool.id, tool) is not tool:
                log.warning("tool id %r is taken; %s keeps only its SDK path", tool.id, tool.path)
        self._by_path = {tool.path: tool for tool in tools}
        self._schemas.retain(self._by_id)
        if changed:
            self._announce()

    def _announce(self) -> None:
        for callback in self._watchers:
            try:
                callback()
            except Exception:  # a watcher's bug must not stop the catalogue updating
                log.exception("tool list watcher failed")

    # -- lookups -----------------------------------------------------------------------

    def tools(self, allow: Sequence[Allowlist] | None = None) -> list[UpstreamTool]:
        """Every tool that every allowlist in `allow` allows (`None`: all), by SDK path."""
        return [tool for tool in self._sorted if permits(allow, tool)]

    def resolve(
        self, name: str, *, allow: Sequence[Allowlist] | None = None, suggest: bool = True
    ) -> UpstreamTool:
        """The tool with id (`ns__tool`) or SDK path (`ns.tool`) `name`.

        Raises `ToolNotFound` (with close matches among the tools `allow` permits, unless
        `suggest` is false) or, when the tool exists but `allow` excludes it,
        `ToolForbidden`. Without suggestions both take the same few lookups: a caller
        that must not tell the two apart is not given away by the time either takes.
        """
        tool = self._by_id.get(name) or self._by_path.get(name)
        if tool is None:
            raise ToolNotFound(name, self._suggest(name, self.tools(allow)) if suggest else ())
        if not permits(allow, tool):
            raise ToolForbidden(tool)
        return tool

    def _suggest(self, name: str, tools: list[UpstreamTool]) -> list[str]:
        paths = {tool.path: tool.path for tool in tools} | {tool.id: tool.path for tool in tools}
        close = difflib.get_close_matches(name, list(paths), n=MAX_SUGGESTIONS * 2)
        if not close:  # a bare namespace: offer its first tools
            close = [tool.path for tool in tools if tool.namespace == name]
        return list(dict.fromkeys(paths[match] for match in close))[:MAX_SUGGESTIONS]

    def schema_problems(self, tool: UpstreamTool) -> tuple[str, ...]:
        """Why the tool's input schema is invalid, for marking it; `()` if it is fine."""
        return self._schemas.problems(tool)

    def is_strict(self, tool: UpstreamTool) -> bool:
        """Whether calls to this tool are validated (its upstream's mode)."""
        entry = self._entries.get(tool.upstream)
        return self._strict if entry is None else entry.strict

    def validate(self, tool: UpstreamTool, arguments: Any) -> list[str]:
        """What is wrong with calling `tool` with `arguments`, whatever the mode.

        `[]` means its schema accepts them (a tool without a schema accepts any object).
        An invalid schema is reported as a problem, not raised.
        """
        try:
            return self._schemas.validate(tool, arguments)
        except SchemaInvalid as exc:
            return [str(exc)]

    # -- calls -------------------------------------------------------------------------

    async def call(
        self,
        tool: UpstreamTool,
        arguments: dict[str, Any],
        *,
        timeout_s: float,
        observer: CallObserver | None = None,
    ) -> dict[str, Any]:
        """Call `tool` and return its MCP `CallToolResult` JSON (`isError` included).

        The tool is looked up again by id, so a tool that left since `resolve` raises
        `ToolNotFound`. Strict upstreams validate first (`SchemaInvalid`,
        `ArgumentsInvalid`). Raises `UpstreamUnreachable` if the upstream cannot be
        reached or does not answer within `timeout_s`. Allowlists are the caller's
        business: check them with `resolve(..., allow=...)`.
        """
        entry = self._entries.get(tool.upstream)
        current = entry.tools.get(tool.id) if entry is not None else None
        if entry is None or current is None:
            # No suggestions: they would come from tools the caller may not see.
            raise ToolNotFound(tool.id)
        self._schemas.enforce(current, arguments, strict=entry.strict)
        call = partial(entry.upstream.call_tool, current.name, arguments, timeout_s=timeout_s)
        if observer is not None and getattr(entry.upstream, "relays_notifications", False):
            call = partial(call, observer=observer)
        if getattr(entry.upstream, "enforces_timeout", False):
            return await call()
        with trio.move_on_after(timeout_s + CALL_GRACE_S):
            return await call()
        raise UpstreamUnreachable(
            f"{current.path} did not answer within {timeout_s} s; retry, or raise the timeout"
        )

    # -- snapshots ---------------------------------------------------------------------

    def statuses(self) -> list[UpstreamStatus]:
        """Every upstream's status, by name; one whose task died shows as failed."""
        return [self._status(self._entries[name]) for name in sorted(self._entries)]

    def _status(self, entry: _Entry) -> UpstreamStatus:
        status = entry.upstream.status()
        if entry.failure is not None:
            status = replace(status, state=UpstreamState.FAILED, last_error=entry.failure, tools=0)
        return status

    def packages(self, allow: Sequence[Allowlist] | None = None) -> list[Package]:
        """The tools `allow` permits, grouped by namespace (sorted), for `tools/packages`."""
        grouped: dict[str, list[UpstreamTool]] = {}
        for tool in self.tools(allow):
            grouped.setdefault(tool.namespace, []).append(tool)
        return [self._package(tools) for _, tools in sorted(grouped.items())]

    def _package(self, tools: list[UpstreamTool]) -> Package:
        upstream = tools[0].upstream
        entry = self._entries[upstream]
        info = entry.upstream.status().server_info or {}
        about = info.get("title") or info.get("description") or info.get("name")
        version = f" {info['version']}" if info.get("version") else ""
        description = f"{about}{version}" if about else f"Tools of upstream {upstream!r}"
        summaries = {tool.sdk_name: _summary(tool.description) for tool in tools}
        return Package(tools[0].namespace, upstream, description, summaries)
