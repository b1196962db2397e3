"""The catalogue over small in-process upstreams that implement the Upstream protocol."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing

from conduit.core.errors import GatewayError, SchemaInvalid, UpstreamUnreachable
from conduit.gateway.allowlist import Allowlist
from conduit.gateway.catalogue import (
    CALL_GRACE_S,
    Catalogue,
    CatalogueState,
    LocalTool,
    LocalUpstream,
    Package,
    ToolFailed,
    ToolForbidden,
    ToolNotFound,
    UpstreamRefused,
    error_of,
    value_of,
)
from conduit.gateway.model import UpstreamState, UpstreamStatus
from conduit.gateway.schemas import ArgumentsInvalid
from conduit.gateway.upstream import RawTool

WAIT_S = 10
ISSUE_SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}},
    "required": ["title"],
}


def _raw(name: str, schema: dict[str, Any] | None = None, description: str = "") -> RawTool:
    raw: RawTool = {"name": name, "description": description}
    if schema is not None:
        raw["inputSchema"] = schema
    return raw


class FakeUpstream:
    """An upstream in the test's process: lists `raw`, echoes calls, can fail on cue."""

    def __init__(
        self,
        name: str,
        raw: list[RawTool],
        *,
        fail_at_start: bool = False,
        start_delay_s: float = 0,
        server_info: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.raw = raw
        self.fail_at_start = fail_at_start
        self.start_delay_s = start_delay_s
        self.server_info = server_info
        self.crash = trio.Event()
        self.hang = False
        self.calls: list[tuple[str, dict[str, Any], float]] = []
        self.on_tools: Callable[[list[RawTool]], None] | None = None
        self.state = UpstreamState.STARTING

    async def serve(
        self,
        on_tools: Callable[[list[RawTool]], None],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        self.on_tools = on_tools
        await trio.sleep(self.start_delay_s)
        if self.fail_at_start:
            raise RuntimeError("cannot start")
        on_tools(self.raw)
        self.state = UpstreamState.READY
        task_status.started()
        await self.crash.wait()
        raise RuntimeError("crashed")

    async def call_tool(
        self, name: str, arguments: dict[str, Any], *, timeout_s: float
    ) -> dict[str, Any]:
        self.calls.append((name, arguments, timeout_s))
        if self.hang:
            await trio.sleep_forever()
        return {"content": [{"type": "text", "text": json.dumps({"echo": arguments})}]}

    def status(self) -> UpstreamStatus:
        return UpstreamStatus(
            self.name, "stdio", self.state, len(self.raw), server_info=self.server_info
        )


def _github() -> FakeUpstream:
    return FakeUpstream(
        "github",
        [
            _raw("create_issue", ISSUE_SCHEMA, "Create an issue.\nMore detail."),
            _raw("list-repos", {"type": "object"}, "List repositories"),
        ],
        server_info={"name": "github-mcp", "version": "1.2.0"},
    )


def _git() -> FakeUpstream:
    return FakeUpstream("git", [_raw("status", {"type": "object"}), _raw("raw")])


async def _serving(nursery: trio.Nursery, *upstreams: Any, **options: Any) -> Catalogue:
    catalogue = Catalogue(upstreams, **options)
    with trio.fail_after(WAIT_S):
        await nursery.start(catalogue.serve)
    return catalogue


async def test_lists_resolves_and_filters(nursery: trio.Nursery) -> None:
    catalogue = await _serving(nursery, _github(), _git())
    assert catalogue.state is CatalogueState.SERVING
    assert [t.path for t in catalogue.tools()] == [
        "git.raw",
        "git.status",
        "github.create_issue",
        "github.list_repos",
    ]
    by_id = catalogue.resolve("github__list-repos")
    assert by_id is catalogue.resolve("github.list_repos")
    assert by_id.name == "list-repos"
    only_git = [Allowlist(["git.*"])]
    assert [t.path for t in catalogue.tools(only_git)] == ["git.raw", "git.status"]
    assert catalogue.resolve("git.status", allow=only_git).id == "git__status"
    assert repr(catalogue) == "<Catalogue serving: 2 upstreams, 4 tools>"


@pytest.mark.parametrize(
    ("name", "allow", "suggestions"),
    [
        ("github.create_isue", None, ["github.create_issue"]),
        ("github__create-issue", None, ["github.create_issue"]),
        ("git.stats", None, ["git.status", "git.raw"]),
        ("github", None, ["github.create_issue", "github.list_repos"]),
        ("nothing.like.it", None, []),
        # suggestions never reveal tools the caller may not see
        ("github.create_isue", ["git.*"], []),
    ],
)
async def test_not_found_suggests_close_matches(
    nursery: trio.Nursery, name: str, allow: list[str] | None, suggestions: list[str]
) -> None:
    catalogue = await _serving(nursery, _github(), _git())
    with pytest.raises(ToolNotFound) as caught:
        catalogue.resolve(name, allow=None if allow is None else [Allowlist(allow)])
    assert caught.value.suggestions == suggestions
    assert isinstance(caught.value, GatewayError)
    assert "tools/list" in str(caught.value)


async def test_forbidden_when_the_tool_exists_outside_the_allowlist(
    nursery: trio.Nursery,
) -> None:
    catalogue = await _serving(nursery, _github(), _git())
    allow = [Allowlist(["*"]), Allowlist(["git.*"])]  # the request's and the caller's
    with pytest.raises(ToolForbidden, match=r"github\.create_issue is not allowed"):
        catalogue.resolve("github__create_issue", allow=allow)


async def test_an_upstream_failing_never_kills_the_catalogue(nursery: trio.Nursery) -> None:
    github, broken = _github(), FakeUpstream("broken", [], fail_at_start=True)
    catalogue = await _serving(nursery, github, broken)
    assert {t.upstream for t in catalogue.tools()} == {"github"}
    failed = catalogue.statuses()[0]
    assert failed.name == "broken"
    assert failed.state is UpstreamState.FAILED
    assert failed.last_error == "RuntimeError: cannot start"

    github.crash.set()  # dies after it was ready: its tools go with it
    with trio.fail_after(WAIT_S):
        await trio.testing.wait_all_tasks_blocked()
    assert catalogue.tools() == []
    assert [s.state for s in catalogue.statuses()] == [UpstreamState.FAILED] * 2
    assert catalogue.state is CatalogueState.SERVING


class ReportingUpstream(FakeUpstream):
    """A fake that tells of its state changes, as the MCP keepers do."""

    def __init__(self, name: str, raw: list[RawTool]) -> None:
        super().__init__(name, raw)
        self.listeners: list[Callable[[UpstreamStatus], None]] = []

    def watch_state(self, listener: Callable[[UpstreamStatus], None]) -> None:
        self.listeners.append(listener)

    def become(self, state: UpstreamState) -> None:
        self.state = state
        for listener in self.listeners:
            listener(self.status())


async def test_watchers_hear_of_state_changes_and_of_failed_tasks(
    nursery: trio.Nursery,
) -> None:
    reporting, broken = ReportingUpstream("git", [_raw("t")]), _github()
    broken.fail_at_start = True
    catalogue = Catalogue([reporting, broken])
    heard: list[tuple[str, UpstreamState]] = []
    catalogue.watch_state(lambda status: heard.append((status.name, status.state)))

    def faulty(status: UpstreamStatus) -> None:
        raise RuntimeError("a broken watcher")  # logged; the others still hear

    catalogue.watch_state(faulty)
    with trio.fail_after(WAIT_S):
        await nursery.start(catalogue.serve)
    assert heard == [("github", UpstreamState.FAILED)]  # a task that died
    reporting.become(UpstreamState.READY)
    reporting.become(UpstreamState.BACKING_OFF)
    assert heard[1:] == [("git", UpstreamState.READY), ("git", UpstreamState.BACKING_OFF)]
    # One that joins later is watched too.
    late = ReportingUpstream("late", [_raw("t")])
    await catalogue.register(late)
    late.become(UpstreamState.READY)
    assert heard[-1] == ("late", UpstreamState.READY)


async def test_upstreams_start_concurrently(nursery: trio.Nursery, autojump_clock: Any) -> None:
    slow = [FakeUpstream(f"up{i}", [_raw("t")], start_delay_s=5) for i in range(4)]
    start = trio.current_time()
    catalogue = await _serving(nursery, *slow)
    assert trio.current_time() - start == pytest.approx(5)
    assert len(catalogue.tools()) == 4


async def test_a_new_tool_list_replaces_the_old(nursery: trio.Nursery) -> None:
    github = _github()
    catalogue = await _serving(nursery, github)
    assert github.on_tools is not None
    github.on_tools([_raw("close_issue", {"type": "object"})])
    assert [t.path for t in catalogue.tools()] == ["github.close_issue"]
    with pytest.raises(ToolNotFound):
        catalogue.resolve("github.create_issue")


async def test_call_forwards_the_raw_name_and_returns_the_result(nursery: trio.Nursery) -> None:
    github = _github()
    catalogue = await _serving(nursery, github)
    tool = catalogue.resolve("github.list_repos")
    result = await catalogue.call(tool, {"page": 2}, timeout_s=5)
    assert value_of(result) == {"echo": {"page": 2}}
    assert github.calls == [("list-repos", {"page": 2}, 5)]


async def test_permissive_passes_bad_arguments_strict_refuses_them(
    nursery: trio.Nursery,
) -> None:
    loose, tight = _github(), FakeUpstream("tight", [_raw("make", ISSUE_SCHEMA), _raw("bare")])
    catalogue = await _serving(nursery, loose, tight, strict_upstreams={"tight": True})
    await catalogue.call(catalogue.resolve("github.create_issue"), {"title": 1}, timeout_s=5)
    assert len(loose.calls) == 1
    with pytest.raises(ArgumentsInvalid) as caught:
        await catalogue.call(catalogue.resolve("tight.make"), {"title": 1}, timeout_s=5)
    assert caught.value.errors == ["arguments.title: 1 is not of type 'string'"]
    with pytest.raises(SchemaInvalid, match="no input schema"):
        await catalogue.call(catalogue.resolve("tight.bare"), {}, timeout_s=5)
    assert tight.calls == []
    assert catalogue.is_strict(catalogue.resolve("tight.make"))
    assert not catalogue.is_strict(catalogue.resolve("github.create_issue"))


async def test_global_strict_with_a_permissive_upstream(nursery: trio.Nursery) -> None:
    catalogue = await _serving(
        nursery, _github(), _git(), strict=True, strict_upstreams={"git": False}
    )
    with pytest.raises(ArgumentsInvalid):
        await catalogue.call(catalogue.resolve("github.create_issue"), {}, timeout_s=5)
    await catalogue.call(catalogue.resolve("git.raw"), {"x": 1}, timeout_s=5)


async def test_validate_reports_whatever_the_mode(nursery: trio.Nursery) -> None:
    bad = FakeUpstream("bad", [_raw("broken", {"type": "strin"})])
    catalogue = await _serving(nursery, _github(), bad)
    issue = catalogue.resolve("github.create_issue")
    assert catalogue.validate(issue, {"title": "x"}) == []
    assert catalogue.validate(issue, {}) == ["arguments: 'title' is a required property"]
    broken = catalogue.resolve("bad.broken")
    assert catalogue.schema_problems(broken)[0].startswith("inputSchema.type:")
    [problem] = catalogue.validate(broken, {})
    assert "bad.broken has an invalid input schema" in problem


async def test_a_tool_that_left_cannot_be_called(nursery: trio.Nursery) -> None:
    github = _github()
    catalogue = await _serving(nursery, github)
    tool = catalogue.resolve("github.create_issue")
    assert github.on_tools is not None
    github.on_tools([])
    with pytest.raises(ToolNotFound):
        await catalogue.call(tool, {"title": "x"}, timeout_s=5)


async def test_a_hanging_upstream_times_out(nursery: trio.Nursery, autojump_clock: Any) -> None:
    github = _github()
    github.hang = True
    catalogue = await _serving(nursery, github)
    start = trio.current_time()
    with pytest.raises(UpstreamUnreachable, match="did not answer within 2 s"):
        await catalogue.call(catalogue.resolve("github.list_repos"), {}, timeout_s=2)
    assert trio.current_time() - start == pytest.approx(2 + CALL_GRACE_S)


async def test_register_at_runtime(nursery: trio.Nursery) -> None:
    catalogue = await _serving(nursery, _github())
    with trio.fail_after(WAIT_S):
        await catalogue.register(_git(), strict=True)
    assert catalogue.resolve("git.status").upstream == "git"
    assert catalogue.is_strict(catalogue.resolve("git.status"))
    assert [s.name for s in catalogue.statuses()] == ["git", "github"]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("github", "an upstream named 'github' already exists"),
        ("git-hub", "would share the SDK namespace 'git_hub'"),
        ("a__b", "must not contain '__'"),
        ("", "must be non-empty"),
    ],
)
async def test_register_refuses_clashing_names(
    nursery: trio.Nursery, name: str, message: str
) -> None:
    catalogue = await _serving(nursery, _github(), FakeUpstream("git_hub", []))
    with pytest.raises(UpstreamRefused, match=message):
        await catalogue.register(FakeUpstream(name, []))


async def test_register_before_serve_and_after_close() -> None:
    catalogue = Catalogue()
    await catalogue.register(_git())  # joins when serving starts
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            with trio.fail_after(WAIT_S):
                await nursery.start(catalogue.serve)
            assert [t.path for t in catalogue.tools()] == ["git.raw", "git.status"]
            scope.cancel()
    assert catalogue.state is CatalogueState.CLOSED
    with pytest.raises(RuntimeError, match="closed"):
        await catalogue.register(_github())
    with pytest.raises(RuntimeError, match="serves once"):
        await catalogue.serve()


def test_constructor_refuses_duplicates() -> None:
    with pytest.raises(UpstreamRefused):
        Catalogue([_git(), _git()])


async def test_statuses_and_packages(nursery: trio.Nursery) -> None:
    catalogue = await _serving(nursery, _github(), _git())
    assert [(s.name, s.state) for s in catalogue.statuses()] == [
        ("git", UpstreamState.READY),
        ("github", UpstreamState.READY),
    ]
    assert catalogue.packages() == [
        Package("git", "git", "Tools of upstream 'git'", {"raw": "", "status": ""}),
        Package(
            "github",
            "github",
            "github-mcp 1.2.0",
            {"create_issue": "Create an issue.", "list_repos": "List repositories"},
        ),
    ]
    [only] = catalogue.packages([Allowlist(["github.list_repos"])])
    assert only.count == 1


async def _fetch(arguments: dict[str, Any], *, timeout_s: float) -> Any:
    if arguments.get("url") == "http://blocked":
        raise ToolFailed("host not allowed: blocked")
    if arguments.get("url") == "http://slow":
        await trio.sleep_forever()
    if arguments.get("url") == "http://refused":
        raise UpstreamUnreachable("any GatewayError is the tool failing")
    if arguments.get("url") == "http://text":
        return "plain body"
    return {"status": 200, "body": "ok"}


FETCH = LocalTool.from_raw(
    {
        "name": "fetch",
        "description": "Fetch a URL through the host",
        "inputSchema": {
            "type": "object",
            "properties": {"url": {"type": "string"}},
            "required": ["url"],
        },
    },
    _fetch,
)


async def test_local_tools_are_an_upstream(nursery: trio.Nursery, autojump_clock: Any) -> None:
    local = LocalUpstream("fetch", [FETCH], description="Host-mediated HTTP")
    catalogue = await _serving(nursery, local, strict=True)
    tool = catalogue.resolve("fetch__fetch")
    assert tool.path == "fetch.fetch"
    ok = await catalogue.call(tool, {"url": "http://x"}, timeout_s=5)
    assert value_of(ok) == {"status": 200, "body": "ok"}
    text = await catalogue.call(tool, {"url": "http://text"}, timeout_s=5)
    assert value_of(text) == "plain body"
    blocked = await catalogue.call(tool, {"url": "http://blocked"}, timeout_s=5)
    assert error_of(blocked) == "host not allowed: blocked"
    refused = await catalogue.call(tool, {"url": "http://refused"}, timeout_s=5)
    assert error_of(refused) == "any GatewayError is the tool failing"
    with pytest.raises(ArgumentsInvalid):
        await catalogue.call(tool, {}, timeout_s=5)
    with pytest.raises(UpstreamUnreachable, match="did not finish within 1 s"):
        await catalogue.call(tool, {"url": "http://slow"}, timeout_s=1)
    [status] = catalogue.statuses()
    assert (status.transport, status.state, status.tools) == ("local", UpstreamState.READY, 1)
    assert catalogue.packages()[0].description == "Host-mediated HTTP"
    with pytest.raises(UpstreamRefused):
        await catalogue.register(FakeUpstream("fetch", []))


def _text(*texts: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text} for text in texts]


IMAGE = {"type": "image", "data": "AAAA", "mimeType": "image/png"}


@pytest.mark.parametrize(
    ("result", "value"),
    [
        ({"structuredContent": {"a": 1}, "content": _text("ignored")}, {"a": 1}),
        ({"structuredContent": None, "content": _text('{"b": 2}')}, {"b": 2}),
        ({"content": _text('{"a": 1}')}, {"a": 1}),
        ({"content": _text("[1, 2]")}, [1, 2]),
        ({"content": _text("42")}, 42),
        ({"content": _text("null")}, None),
        ({"content": _text("hello")}, "hello"),
        ({"content": _text("NaN")}, "NaN"),  # not JSON: stays text
        ({"content": _text("Infinity")}, "Infinity"),
        ({"content": _text("line 1", "line 2")}, "line 1\nline 2"),
        ({"content": _text('{"a":', "1}")}, {"a": 1}),  # joined, then parsed
        ({"content": []}, None),
        ({}, None),
        ({"content": [IMAGE]}, [IMAGE]),
        ({"content": [*_text("caption"), IMAGE]}, [*_text("caption"), IMAGE]),
    ],
)
def test_value_of(result: dict[str, Any], value: Any) -> None:
    assert value_of(result) == value


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ({"content": _text("ok")}, None),
        ({"content": _text("ok"), "isError": False}, None),
        ({"content": _text("bad input", "try again"), "isError": True}, "bad input\ntry again"),
        ({"structuredContent": {"code": 7}, "isError": True}, '{"code": 7}'),
        ({"content": [IMAGE], "isError": True}, "the tool reported an error without a message"),
        ({"content": _text(" "), "isError": True}, "the tool reported an error without a message"),
    ],
)
def test_error_of(result: dict[str, Any], message: str | None) -> None:
    assert error_of(result) == message
