"""Schema checks, argument validation with field paths, strict vs permissive, the cache."""

from __future__ import annotations

from typing import Any

import pytest

from conduit.core.errors import SchemaInvalid
from conduit.gateway.model import UpstreamTool
from conduit.gateway.schemas import (
    MAX_ARGUMENT_DEPTH,
    ArgumentsInvalid,
    SchemaCache,
    check_schema,
    field_path,
    has_schema,
    schema_digest,
)

REPO_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "repo": {
            "type": "object",
            "properties": {"owner": {"type": "integer"}, "name": {"type": "string"}},
            "required": ["name"],
        },
        "labels": {"type": "array", "items": {"type": "string"}},
        "a b": {"type": "boolean"},
    },
    "required": ["repo"],
    "additionalProperties": False,
}


def _tool(schema: dict[str, Any], name: str = "t") -> UpstreamTool:
    return UpstreamTool(
        id=f"up__{name}",
        upstream="up",
        name=name,
        namespace="up",
        sdk_name=name,
        input_schema=schema,
    )


@pytest.mark.parametrize(
    "schema",
    [
        {},
        {"type": "object"},
        REPO_SCHEMA,
        {"type": ["object", "null"]},
        {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"},
        {"$schema": "http://json-schema.org/draft-04/schema", "properties": {}},
        {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"},
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "$defs": {"A": {}}},
    ],
)
def test_valid_schemas(schema: dict[str, Any]) -> None:
    assert check_schema(schema) == []


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ([], "inputSchema: must be a JSON object"),
        ({"type": "strin"}, "inputSchema.type: 'strin' is not valid"),
        (
            {"type": "object", "properties": {"a": {"type": 5}}},
            "inputSchema.properties.a.type: 5 is not valid",
        ),
        ({"type": "object", "required": "a"}, "inputSchema.required: 'a' is not of type 'array'"),
        ({"type": "object", "properties": {"a": {"pattern": "("}}}, "is not a 'regex'"),
        ({"type": "string"}, "inputSchema.type: must be 'object'"),
        ({"$schema": "https://example.com/my-schema"}, "unknown metaschema"),
        ({"$schema": 7}, "unknown metaschema"),
        # Draft 4 spells exclusiveMaximum as a boolean; 2020-12 as a number.
        (
            {"$schema": "http://json-schema.org/draft-04/schema#", "exclusiveMaximum": 3},
            "inputSchema.exclusiveMaximum: 3 is not of type 'boolean'",
        ),
    ],
)
def test_invalid_schemas_say_where(schema: Any, problem: str) -> None:
    problems = check_schema(schema)
    assert problems, schema
    assert problem in problems[0]


@pytest.mark.parametrize(
    ("arguments", "errors"),
    [
        ({"repo": {"name": "x"}}, []),
        ({"repo": {"name": "x", "owner": 3}, "labels": ["a"], "a b": True}, []),
        (
            {"repo": {"name": "x", "owner": "x"}},
            ["arguments.repo.owner: 'x' is not of type 'integer'"],
        ),
        ({}, ["arguments: 'repo' is a required property"]),
        ({"repo": {}}, ["arguments.repo: 'name' is a required property"]),
        (
            {"repo": {"name": "x"}, "labels": ["a", 2]},
            ["arguments.labels[1]: 2 is not of type 'string'"],
        ),
        ({"repo": {"name": "x"}, "a b": 1}, ["arguments[\"a b\"]: 1 is not of type 'boolean'"]),
        (
            {"repo": {"name": 1, "owner": "o"}, "zzz": 1},
            [
                "arguments: Additional properties are not allowed ('zzz' was unexpected)",
                "arguments.repo.name: 1 is not of type 'string'",
                "arguments.repo.owner: 'o' is not of type 'integer'",
            ],
        ),
        ([1], ["arguments: expected a JSON object, got array"]),
        ("x", ["arguments: expected a JSON object, got string"]),
    ],
)
def test_validation_names_the_field(arguments: Any, errors: list[str]) -> None:
    assert SchemaCache().validate(_tool(REPO_SCHEMA), arguments) == errors


def test_long_values_are_not_echoed_whole() -> None:
    [error] = SchemaCache().validate(
        _tool(REPO_SCHEMA), {"repo": {"name": "x", "owner": "y" * 10_000}}
    )
    assert error.startswith("arguments.repo.owner: 'yyy")
    assert len(error) <= 300


def test_a_tool_without_schema_accepts_any_object() -> None:
    tool = _tool({})
    assert not has_schema(tool)
    assert SchemaCache().validate(tool, {"anything": [1, 2]}) == []
    assert SchemaCache().validate(tool, 3) == ["arguments: expected a JSON object, got number"]


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "strin"}, "has an invalid input schema"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "cannot resolve"),
        (
            {"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}},
            "cannot resolve",
        ),
        ({"$ref": "#"}, "recurses"),
    ],
)
def test_unusable_schemas_raise_schema_invalid(schema: dict[str, Any], message: str) -> None:
    with pytest.raises(SchemaInvalid, match=message):
        SchemaCache().validate(_tool(schema), {"a": 1})


def test_permissive_passes_everything_through() -> None:
    cache = SchemaCache()
    for schema in ({}, {"type": "strin"}, REPO_SCHEMA):
        cache.enforce(_tool(schema), {"repo": 5}, strict=False)


def test_strict_refuses_bad_arguments_missing_and_invalid_schemas() -> None:
    cache = SchemaCache()
    cache.enforce(_tool(REPO_SCHEMA), {"repo": {"name": "x"}}, strict=True)
    with pytest.raises(ArgumentsInvalid) as caught:
        cache.enforce(_tool(REPO_SCHEMA), {"repo": {"owner": "x"}}, strict=True)
    assert caught.value.errors == [
        "arguments.repo: 'name' is a required property",
        "arguments.repo.owner: 'x' is not of type 'integer'",
    ]
    assert str(caught.value).startswith(
        "arguments for up.t do not match its input schema: arguments.repo: 'name' is a "
        "required property (and 1 more)"
    )
    with pytest.raises(SchemaInvalid, match="has no input schema and this upstream is strict"):
        cache.enforce(_tool({}), {}, strict=True)
    with pytest.raises(SchemaInvalid, match="invalid input schema"):
        cache.enforce(_tool({"type": "strin"}), {}, strict=True)


def test_cache_recompiles_when_the_schema_changes_and_forgets_departed_tools() -> None:
    cache = SchemaCache()
    old = _tool({"type": "object", "properties": {"a": {"type": "string"}}})
    new = _tool({"type": "object", "properties": {"a": {"type": "integer"}}})
    assert cache.validate(old, {"a": "x"}) == []
    assert cache.validate(new, {"a": "x"}) == ["arguments.a: 'x' is not of type 'integer'"]
    assert cache.problems(_tool({"type": "strin"}, name="u"))
    assert len(cache) == 2
    cache.retain(["up__t"])
    assert len(cache) == 1


def test_digest_ignores_key_order_and_paths_read_like_code() -> None:
    assert schema_digest({"a": 1, "b": [1, 2]}) == schema_digest({"b": [1, 2], "a": 1})
    assert schema_digest({"a": 1}) != schema_digest({"a": 2})
    assert field_path("arguments", ["a", 0, "b c", "d"]) == 'arguments.a[0]["b c"].d'


def test_either_mode_refuses_arguments_nested_past_what_a_request_can_carry() -> None:
    """Deeper than any schema, and than an upstream request's encoder writes: refused
    as invalid arguments, not failed as the request is written (logged as a crash)."""
    cache = SchemaCache()
    deep: Any = "leaf"
    for _ in range(MAX_ARGUMENT_DEPTH - 1):
        deep = [deep]
    for strict in (False, True):
        cache.enforce(_tool({"type": "object"}), {"deep": deep}, strict=strict)
        with pytest.raises(ArgumentsInvalid) as caught:
            cache.enforce(_tool({"type": "object"}), {"deep": [deep]}, strict=strict)
        assert caught.value.errors == [f"arguments: nested deeper than {MAX_ARGUMENT_DEPTH} levels"]
    # tools/validate says the same of them
    assert cache.validate(_tool({"type": "object"}), {"deep": [deep]}) == caught.value.errors
