"""Allowlist patterns: segment boundaries, exact paths and ids, clear refusals."""

from __future__ import annotations

import pytest

from conduit.gateway.allowlist import Allowlist, intersect, permits
from conduit.gateway.model import UpstreamTool


def _tool(
    upstream: str, name: str, namespace: str | None = None, sdk: str | None = None
) -> UpstreamTool:
    return UpstreamTool(
        id=f"{upstream}__{name}",
        upstream=upstream,
        name=name,
        namespace=namespace or upstream,
        sdk_name=sdk or name,
    )


GIT_STATUS = _tool("git", "status")
GITHUB_ISSUE = _tool("github", "create_issue")
TIME_NOW = _tool("my-time", "get-now", "my_time", "get_now")
TOOLS = [GIT_STATUS, GITHUB_ISSUE, TIME_NOW]


@pytest.mark.parametrize(
    ("patterns", "allowed"),
    [
        (["*"], {"git.status", "github.create_issue", "my_time.get_now"}),
        (["git.*"], {"git.status"}),  # a segment boundary: not github
        (["github.*"], {"github.create_issue"}),
        (["git.status"], {"git.status"}),
        (["git.stat"], set()),
        (["github.create_issue", "my_time.*"], {"github.create_issue", "my_time.get_now"}),
        (["my-time__get-now"], {"my_time.get_now"}),  # a tool id
        (["github__create_issue"], {"github.create_issue"}),
        (["Git.*"], set()),  # case-sensitive
        ([], set()),
    ],
)
def test_matching(patterns: list[str], allowed: set[str]) -> None:
    allowlist = Allowlist(patterns)
    assert {tool.path for tool in TOOLS if allowlist.allows(tool)} == allowed


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("", "it is empty"),
        ("  ", "it is empty"),
        (" git.*", "surrounding whitespace"),
        ("gi*", "'*' stands alone"),
        ("*.x", "'*' stands alone"),
        ("git.st*", "'*' stands alone"),
        ("**", "'*' stands alone"),
        ("git", "did you mean 'git.*'?"),
        ("a.b.c", "exactly two segments"),
        (".x", "segments are SDK identifiers"),
        ("git.", "segments are SDK identifiers"),
        ("my-git.*", "did you mean 'my_git.*'?"),
        ("my-git.status", "did you mean 'my_git.status'?"),
    ],
)
def test_invalid_patterns_are_refused_clearly(pattern: str, message: str) -> None:
    with pytest.raises(ValueError, match="invalid allowlist pattern") as caught:
        Allowlist(["git.*", pattern])
    assert message in str(caught.value)
    assert "'namespace.*'" in str(caught.value)  # says what would be valid


def test_intersection_needs_every_allowlist() -> None:
    caller = Allowlist(["github.*", "git.status"])
    request = Allowlist(["*"])
    both = intersect(caller, request)
    assert both == [caller, request]
    assert [t.path for t in TOOLS if permits(both, t)] == ["git.status", "github.create_issue"]
    narrower = intersect(both, Allowlist(["git.*"]))
    assert [t.path for t in TOOLS if permits(narrower, t)] == ["git.status"]


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        ((None, None), None),
        ((), None),
        (([],), None),  # never an empty list: that would read as "no restriction" by accident
        ((None, Allowlist(["git.*"])), [Allowlist(["git.*"])]),
    ],
)
def test_intersect_shapes(parts: tuple[object, ...], expected: object) -> None:
    assert intersect(*parts) == expected  # type: ignore[arg-type]


def test_permits_none_is_unrestricted_and_empty_allowlist_allows_nothing() -> None:
    assert all(permits(None, tool) for tool in TOOLS)
    assert not any(permits([Allowlist([])], tool) for tool in TOOLS)


def test_repr_and_patterns() -> None:
    allowlist = Allowlist(["git.*", "x__y"])
    assert allowlist.patterns == ("git.*", "x__y")
    assert repr(allowlist) == "Allowlist(['git.*', 'x__y'])"
    assert Allowlist.everything().allows(GIT_STATUS)
