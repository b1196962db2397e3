"""SDK names are identifiers in every guest language, deterministic and collision-free."""

from __future__ import annotations

import ast
import keyword
import random

import pytest

from conduit.gateway.naming import RESERVED, assign_names, identifier, namespace_for, tool_id


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("create_issue", "create_issue"),
        ("get-current-time", "get_current_time"),
        ("createIssue", "createIssue"),  # case is kept
        ("files.read", "files_read"),
        ("a  --  b", "a_b"),  # runs collapse
        ("a__b", "a_b"),  # SDK names never contain '__'
        ("__proto__", "proto"),
        ("_private", "private_"),  # stripped, then a strict-mode reserved word
        ("$discover", "discover"),  # '$' belongs to SDK internals
        ("1password", "_1password"),
        ("café-crème", "cafe_creme"),
        ("ﬁle", "file"),  # compatibility ligature folds to ASCII
        ("日本", "u65e5_u672c"),
        ("---", "tool"),
        ("", "tool"),
        ("delete", "delete_"),
        ("class", "class_"),
        ("default", "default_"),
        ("new", "new_"),
        ("from", "from_"),
        ("import", "import_"),
        ("None", "None_"),
        ("then", "then_"),
        ("constructor", "constructor_"),
        ("toString", "toString_"),
        ("match", "match"),  # Python soft keywords are valid attribute names
        ("type", "type"),
        ("case", "case_"),  # ...but 'case' is reserved in JS
    ],
)
def test_identifier(raw: str, expected: str) -> None:
    assert identifier(raw) == expected


def test_namespace_fallback_and_tool_id() -> None:
    assert namespace_for("my-git") == "my_git"
    assert namespace_for("!!!") == "ns"
    assert tool_id("my-git", "get-time") == "my-git__get-time"


@pytest.mark.parametrize("raw", ["if", "await", "yield", "1x", "a b", "then", "__init__", "λ"])
def test_identifiers_are_valid_in_python_and_never_reserved(raw: str) -> None:
    name = identifier(raw)
    assert name.isidentifier()
    assert not keyword.iskeyword(name)
    assert name not in RESERVED
    assert not name.startswith("$")
    assert "__" not in name
    ast.parse(f"tools.ns.{name}()")


def _raw(*names: str) -> list[dict[str, object]]:
    return [{"name": name, "inputSchema": {"type": "object"}} for name in names]


def test_assign_names_builds_tools() -> None:
    [tool] = assign_names(
        "git-hub",
        [
            {
                "name": "create-issue",
                "description": "Create an issue",
                "inputSchema": {"type": "object", "properties": {"a": {"type": "string"}}},
                "outputSchema": {"type": "object"},
                "annotations": {"readOnlyHint": False},
            }
        ],
    )
    assert tool.id == "git-hub__create-issue"
    assert tool.upstream == "git-hub"
    assert tool.name == "create-issue"
    assert tool.namespace == "git_hub"
    assert tool.sdk_name == "create_issue"
    assert tool.path == "git_hub.create_issue"
    assert tool.description == "Create an issue"
    assert tool.output_schema == {"type": "object"}
    assert tool.annotations == {"readOnlyHint": False}


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        # the tool already named like its SDK name keeps it, whatever the order
        (["get-time", "get_time"], {"get_time": "get_time", "get-time": "get_time_2"}),
        (["get_time", "get-time"], {"get_time": "get_time", "get-time": "get_time_2"}),
        # the rest in order of raw name
        (
            ["get.time", "get-time", "get time"],
            {"get time": "get_time", "get-time": "get_time_2", "get.time": "get_time_3"},
        ),
        # a suffix never steals a name a tool has on its own
        (
            ["a-b", "a_b", "a_b_2"],
            {"a_b": "a_b", "a_b_2": "a_b_2", "a-b": "a_b_3"},
        ),
        (["then", "then_"], {"then_": "then_", "then": "then_2"}),
    ],
)
def test_collisions_are_resolved_deterministically(
    names: list[str], expected: dict[str, str]
) -> None:
    tools = assign_names("up", _raw(*names))
    assert {tool.name: tool.sdk_name for tool in tools} == expected


def test_names_do_not_depend_on_listing_order() -> None:
    names = ["get-time", "get_time", "Get-Time", "get.time", "1st", "_1st", "then", "then_"]
    first = {tool.name: tool.sdk_name for tool in assign_names("up", _raw(*names))}
    rng = random.Random(7)
    for _ in range(20):
        rng.shuffle(names)
        assert {tool.name: tool.sdk_name for tool in assign_names("up", _raw(*names))} == first
    assert len(set(first.values())) == len(first)


def test_bad_entries_are_dropped_not_fatal() -> None:
    tools = assign_names(
        "up",
        [
            {"name": "ok"},  # no inputSchema: stored as {}
            {"name": "ok", "inputSchema": {"type": "object"}},  # repeated: first kept
            {"description": "no name"},
            {"name": ""},
            {"name": 7},
            "not an object",  # type: ignore[list-item]
            {"name": "odd", "inputSchema": [1], "outputSchema": "x", "description": 3},
        ],
    )
    assert [(t.name, t.input_schema) for t in tools] == [("odd", {}), ("ok", {})]
    odd = tools[0]
    assert odd.output_schema is None
    assert odd.description == ""
