"""Generated SDK text: exact types for common schemas, real Deno type-checks, valid Python."""

from __future__ import annotations

import ast
import os
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conduit.executors.deno import find_deno
from conduit.gateway.model import UpstreamTool
from conduit.gateway.naming import assign_names
from conduit.gateway.sdk import python_stubs, typescript_declarations

DENO_CHECK_TIMEOUT_S = 120  # a cold type-check on a loaded CI machine

USER_DEFS = {
    "User": {
        "type": "object",
        "description": "A GitHub user",
        "properties": {
            "login": {"type": "string"},
            "manager": {"$ref": "#/$defs/User"},
            "team": {"$ref": "#/$defs/string"},
        },
        "required": ["login"],
    },
    "string": {"enum": ["core", "docs"]},  # a def named like a TS builtin type
    # Aliases of themselves, which TypeScript refuses: read as unknown.
    "Loop": {"$ref": "#/$defs/Loop"},
    "A": {"anyOf": [{"$ref": "#/$defs/B"}, {"type": "string"}]},
    "B": {"allOf": [{"$ref": "#/$defs/A"}, {"type": "object"}]},
    # Recursion behind an array is fine.
    "Tree": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"$ref": "#/$defs/Tree"}}]},
}
ISSUE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "owner": {"type": "string", "description": "Repository owner */ not the end"},
        "repo": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "id": {"type": "integer"}},
            "required": ["name"],
        },
        "labels": {"type": "array", "items": {"type": "string"}, "default": []},
        "state": {"enum": ["open", "closed"]},
        "assignee": {"$ref": "#/$defs/User"},
        "from": {"type": ["string", "null"]},
        "meta": {"type": "object", "additionalProperties": {"type": "number"}},
        "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]},
        "choice": {
            "oneOf": [{"type": "string"}, {"type": "object", "properties": {"x": {"const": -1}}}]
        },
        'weird key\n"*/': {"type": "boolean"},
        "__proto__": {"type": "string"},
        "loops": {
            "type": "array",
            "prefixItems": [{"$ref": "#/$defs/Loop"}, {"$ref": "#/$defs/A"}],
        },
        "tree": {"$ref": "#/$defs/Tree"},
    },
    "required": ["owner", "repo"],
    "$defs": USER_DEFS,
}
ISSUE_OUTPUT = {
    "type": "object",
    "properties": {"number": {"type": "integer"}, "author": {"$ref": "#/$defs/User"}},
    "required": ["number"],
    "$defs": {"User": {"type": "object", "properties": {"login": {"type": "string"}}}},
}


def _catalogue_tools() -> list[UpstreamTool]:
    """A spread of real-world and awkward tools across awkward namespaces."""
    github = assign_names(
        "github",
        [
            {
                "name": "create_issue",
                "description": "Create an issue.\n\nReturns the new issue.",
                "inputSchema": ISSUE_SCHEMA,
                "outputSchema": ISSUE_OUTPUT,
            },
            {"name": "then", "inputSchema": {"type": "object"}},
            {"name": "delete", "inputSchema": {}},
            {"name": "get-time", "inputSchema": {"type": "object", "properties": {}}},
            {"name": "get_time", "inputSchema": {"type": "strin"}},  # invalid: loose types
            {
                "name": "closed",
                "inputSchema": {"type": "object", "properties": {}, "additionalProperties": False},
            },
        ],
    )
    odd = assign_names(
        "ToolTypes",  # a namespace that shadows the types' own namespace
        [
            {
                "name": "type",
                "inputSchema": {
                    "$schema": "http://json-schema.org/draft-07/schema#",
                    "type": "object",
                    "properties": {
                        "node": {"$ref": "#/definitions/Node"},
                        "tuple": {"type": "array", "items": [{"type": "string"}, {"type": "null"}]},
                        "both": {
                            "allOf": [
                                {"$ref": "#/definitions/Node"},
                                {"type": "object", "properties": {"extra": {"type": "boolean"}}},
                            ]
                        },
                        "maybe": {"type": "integer", "nullable": True},
                        "mixed": {"enum": ["a", 1, True, None, 2.5]},
                        "deep": {
                            "type": "array",
                            "items": {
                                "type": "array",
                                "items": {"anyOf": [{"type": "string"}, {"type": "number"}]},
                            },
                        },
                        "never": False,
                        "any": True,
                    },
                    "required": ["node"],
                    "definitions": {
                        "Node": {
                            "type": "object",
                            "properties": {
                                "value": {"type": "number"},
                                "children": {
                                    "type": "array",
                                    "items": {"$ref": "#/definitions/Node"},
                                },
                            },
                            "required": ["value"],
                        }
                    },
                },
            },
        ],
    )
    string_ns = assign_names("string", [{"name": "async", "inputSchema": {"type": "object"}}])
    return [*github, *odd, *string_ns]


USAGE = """
const issue = await tools.github.create_issue({ owner: "o", repo: { name: "r" } });
const number: number = issue.number;
const login: string | undefined = issue.author?.login;
await tools.github.create_issue({
  owner: "o",
  repo: { name: "r", id: 3 },
  labels: ["bug"],
  state: "open",
  assignee: { login: "ann", manager: { login: "bob", team: "docs" } },
  from: null,
  meta: { score: 1.5 },
  pair: ["a", 1, "anything after"],
  choice: { x: -1 },
  tree: ["a", ["b", ["c"]]],
  "weird key\\n\\"*/": true,
});
// @ts-expect-error owner is a string
await tools.github.create_issue({ owner: 1, repo: { name: "r" } });
// @ts-expect-error a tree holds strings
await tools.github.create_issue({ owner: "o", repo: { name: "r" }, tree: [1] });
// @ts-expect-error repo is required
await tools.github.create_issue({ owner: "o" });
// @ts-expect-error state is one of two values
await tools.github.create_issue({ owner: "o", repo: { name: "r" }, state: "merged" });
await tools.github.create_issue({
  owner: "o",
  repo: { name: "r" },
  // @ts-expect-error team is an enum def
  assignee: { login: "a", team: "x" },
});
await tools.github.then_();
await tools.github.delete_({ anything: 1 });
await tools.github.get_time();
await tools.github.get_time_2({ whatever: true });
await tools.github.closed();
// @ts-expect-error no arguments allowed
await tools.github.closed({ a: 1 });
await tools.ToolTypes.type({
  node: { value: 1, children: [{ value: 2 }] },
  tuple: ["s", null],
  both: { value: 1, extra: true },
  maybe: null,
  mixed: 2.5,
  deep: [["a", 1]],
});
// @ts-expect-error mixed is a literal union
await tools.ToolTypes.type({ node: { value: 1 }, mixed: "b" });
await tools.ToolTypes.type({ node: { value: 1 }, mixed: true });
await tools.string.async_();
const described: ToolDescription[] = await tools.$discover();
const first: string = described[0].path;
try {
  await tools.github.get_time();
} catch (error) {
  if (error instanceof ToolError) {
    const code: number = error.code;
    const tool: string = error.tool;
    console.log(code, tool, error.message, number, login, first);
  }
}
export {};
"""


def _deno_check(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    deno = find_deno()
    assert deno is not None, "Deno is a dependency (pip install deno)"
    path = tmp_path / "check.ts"
    path.write_text(source)
    env = {"PATH": os.environ.get("PATH", ""), "DENO_DIR": str(tmp_path / "deno"), "NO_COLOR": "1"}
    return subprocess.run(
        [deno, "check", "--no-remote", "--no-config", "--no-lock", "--no-npm", str(path)],
        capture_output=True,
        text=True,
        timeout=DENO_CHECK_TIMEOUT_S,
        env=env,
        check=False,
    )


def test_declarations_type_check_with_deno(tmp_path: Path) -> None:
    declarations = typescript_declarations(_catalogue_tools(), descriptions={"github": "GitHub"})
    done = _deno_check(tmp_path, declarations + USAGE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_deno_check_catches_misuse(tmp_path: Path) -> None:
    """The check above means something: a wrong call fails it."""
    declarations = typescript_declarations(_catalogue_tools())
    done = _deno_check(
        tmp_path, declarations + "await tools.github.create_issue({ owner: 1 });\nexport {};\n"
    )
    assert done.returncode != 0
    assert "TS2" in done.stdout + done.stderr


def _tool(schema: dict[str, Any], output: dict[str, Any] | None = None) -> UpstreamTool:
    [tool] = assign_names("ns", [{"name": "fn", "inputSchema": schema, "outputSchema": output}])
    return tool


def _signature(declarations: str) -> str:
    """The `fn(...)` member, joined onto one line."""
    lines = declarations.split("  ns: {\n", 1)[1].split("\n  };", 1)[0].splitlines()
    body = [line.strip() for line in lines if not line.strip().startswith(("/**", "*"))]
    return " ".join(body)


@pytest.mark.parametrize(
    ("schema", "signature"),
    [
        ({}, "fn(args?: { [key: string]: unknown }): Promise<unknown>;"),
        ({"type": "object"}, "fn(args?: { [key: string]: unknown }): Promise<unknown>;"),
        (
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
            "fn(args: { a: string; }): Promise<unknown>;",
        ),
        (
            {"type": "object", "properties": {"a": {"type": "integer"}}},
            "fn(args?: { a?: number; }): Promise<unknown>;",
        ),
        (
            {"properties": {"a": {"type": "array", "items": {"type": ["string", "null"]}}}},
            "fn(args?: { a?: (string | null)[]; }): Promise<unknown>;",
        ),
        (
            {"type": "object", "properties": {"a": {}}, "additionalProperties": True},
            "fn(args?: { a?: unknown; [key: string]: unknown; }): Promise<unknown>;",
        ),
        (
            {"type": "object", "additionalProperties": {"type": "boolean"}},
            "fn(args?: { [key: string]: boolean }): Promise<unknown>;",
        ),
        (
            {"type": "object", "properties": {"k": {"enum": ["a", 1, None]}}},
            'fn(args?: { k?: "a" | 1 | null; }): Promise<unknown>;',
        ),
        (
            {"type": "object", "properties": {"k": {"enum": [1, True, 1.0, False, 0]}}},
            "fn(args?: { k?: 1 | true | false | 0; }): Promise<unknown>;",
        ),
        (
            {"type": "object", "properties": {"k": {"anyOf": [{"type": "string"}, {}]}}},
            "fn(args?: { k?: unknown; }): Promise<unknown>;",  # unknown absorbs the union
        ),
        (
            {"type": "object", "properties": {"k": {"type": "strng"}}},  # invalid: loose
            "fn(args?: { [key: string]: unknown }): Promise<unknown>;",
        ),
        (
            {"type": "object", "properties": {"k": {"format": "uri", "not": {}}}},
            "fn(args?: { k?: unknown; }): Promise<unknown>;",
        ),
    ],
)
def test_typescript_types(schema: dict[str, Any], signature: str) -> None:
    assert _signature(typescript_declarations([_tool(schema)])) == signature


def test_output_schema_types_the_promise() -> None:
    tool = _tool({"type": "object"}, {"type": "object", "properties": {"n": {"type": "number"}}})
    assert _signature(typescript_declarations([tool])).endswith("Promise<{ n?: number; }>;")


def test_jsdoc_carries_descriptions_defaults_and_the_id() -> None:
    [tool] = assign_names(
        "ns",
        [
            {
                "name": "get-x",
                "description": "Get x.\nSecond line */",
                "inputSchema": {
                    "type": "object",
                    "properties": {
                        "n": {"type": "integer", "description": "How many", "default": 3}
                    },
                },
            }
        ],
    )
    text = typescript_declarations([tool], descriptions={"ns": "The ns package"})
    assert "  /** The ns package */\n  ns: {" in text
    assert "     * Get x.\n     * Second line *\\/\n     *\n     * Tool id: ns__get-x\n" in text
    assert "      /**\n       * How many\n       * @default 3\n       */\n      n?: number;" in text


def test_output_is_deterministic() -> None:
    tools = _catalogue_tools()
    expected_ts, expected_py = typescript_declarations(tools), python_stubs(tools)
    rng = random.Random(3)
    for _ in range(5):
        rng.shuffle(tools)
        assert typescript_declarations(tools) == expected_ts
        assert python_stubs(tools) == expected_py


def test_empty_catalogue() -> None:
    text = typescript_declarations([])
    assert "declare const tools: {\n  /** Every tool" in text
    ast.parse(python_stubs([]))


def _methods(stubs: str) -> dict[str, ast.AsyncFunctionDef | ast.FunctionDef]:
    tree = ast.parse(stubs)
    [tools_class] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "tools"]
    methods = {}
    for namespace in tools_class.body:
        if isinstance(namespace, ast.ClassDef):
            for node in namespace.body:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    methods[f"{namespace.name}.{node.name}"] = node
    return methods


def test_python_stubs_parse_and_keep_sdk_names() -> None:
    tools = _catalogue_tools()
    methods = _methods(python_stubs(tools, descriptions={"github": "GitHub"}))
    assert sorted(methods) == sorted(tool.path for tool in tools)
    issue = methods["github.create_issue"]
    assert [a.arg for a in issue.args.kwonlyargs][:2] == ["owner", "repo"]  # required first
    assert issue.args.kwarg is not None  # 'from' and the weird key go through **kwargs
    assert ast.unparse(issue.returns) == "github__create_issue__Result"  # type: ignore[arg-type]
    assert not methods["github.closed"].args.kwonlyargs
    assert methods["github.closed"].args.kwarg is None


def test_python_stub_text_reads_well() -> None:
    stubs = python_stubs([_tool(ISSUE_SCHEMA, ISSUE_OUTPUT)])
    assert 'class ns__fn__User(TypedDict):\n    """A GitHub user"""\n\n    login: str\n' in stubs
    assert "    manager: NotRequired[ns__fn__User]\n" in stubs
    assert "    team: NotRequired[ns__fn__string_]\n" in stubs
    assert 'ns__fn__string_ = Literal["core", "docs"]' in stubs
    assert "class ns__fn__User_2(TypedDict):" in stubs  # the output schema's own User
    assert '            state: Literal["open", "closed"] = ...,\n' in stubs
    assert "            labels: list[str] = ...,\n" in stubs
    assert "                labels: Default: []\n" in stubs
    assert '**{"from": value}' in stubs
    ast.parse(stubs)


def test_async_python_stubs() -> None:
    stubs = python_stubs([_tool({"type": "object"})], asynchronous=True)
    assert "        async def fn(**kwargs: Any) -> Any:" in stubs
    assert "    async def _discover() -> list[ToolDescription]:" in stubs
    ast.parse(stubs)
