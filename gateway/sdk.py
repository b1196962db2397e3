"""SDK text for guests and prompts: TypeScript declarations and Python stubs of `tools.*`.

Both are generated from the same reading of each tool's JSON Schema into a small type
model, so they agree. The reading covers what MCP servers actually publish:

- `string`, `number`, `integer`, `boolean`, `null`, and lists of them;
- objects: `properties`, `required` (optional otherwise), `additionalProperties`
  (a schema gives an index signature; `true`, or nothing declared at all, gives
  `unknown` values; absent beside declared properties gives none, so the declared
  shape reads cleanly); `patternProperties` counts as open;
- arrays: `items`, and tuples from `prefixItems` (or draft-7 list `items`);
- `enum` and `const` as literal unions; `anyOf`/`oneOf` as unions; `allOf` as an
  intersection; OpenAPI's `nullable: true`;
- `$ref` to the schema's own `$defs`/`definitions` as named types (recursion works);
- `description` and `default` as doc comments. Anything else reads as `unknown`/`Any`,
  as does a schema `schemas.check_schema` rejects, and anything nested deeper than
  `MAX_DEPTH`.

A tool's return type is its `outputSchema` when it has one (the value is then its
`structuredContent`, see `catalogue.value_of`), else `unknown`/`Any`.

TypeScript: `declare const tools: {...}` with one method per tool taking one `args`
object, `declare class ToolError`, `tools.$discover()`, and named `$defs` types in
`declare namespace ToolTypes.<ns>.<tool>`. Python: `class tools:` with a nested class per
namespace and a static method per tool taking keyword arguments (names that are not
Python identifiers go through `**kwargs`), nested objects as module-level `TypedDict`s
named `<ns>__<tool>__<what>`, and `tools._discover()`. Output is sorted and
deterministic. Names come from `naming`; this module never renames a tool.
"""

from __future__ import annotations

import json
import keyword
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from conduit.gateway.model import UpstreamTool
from conduit.gateway.naming import identifier
from conduit.gateway.schemas import check_schema

__all__ = ["python_stubs", "typescript_declarations"]

# Real schemas nest a handful of levels; past this a type helps nobody reading it.
MAX_DEPTH = 12
# Type names TypeScript refuses as the name of a type alias.
_TS_TYPE_NAMES = frozenset(
    {"any", "unknown", "never", "string", "number", "boolean", "bigint", "symbol"}
    | {"object", "undefined", "null", "void", "this"}
)
_JS_IDENTIFIER = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_DEF_REF = re.compile(r"#/(\$defs|definitions)/([^/]+)")
_NO_DEFAULT = object()


# -- the type model --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Prim:
    name: str  # string number integer boolean null unknown never


@dataclass(frozen=True, slots=True)
class _Lit:
    value: str | int | float | bool | None


@dataclass(frozen=True, slots=True)
class _Array:
    items: _Type


@dataclass(frozen=True, slots=True)
class _Tuple:
    items: tuple[_Type, ...]
    rest: _Type | None  # None: no more items allowed


@dataclass(frozen=True, slots=True)
class _Prop:
    name: str
    type: _Type
    required: bool
    description: str
    default: Any = _NO_DEFAULT


@dataclass(frozen=True, slots=True)
class _Object:
    props: tuple[_Prop, ...]
    extra: _Type | None  # type of undeclared keys; None: none expected
    description: str = ""


@dataclass(frozen=True, slots=True)
class _Union:
    members: tuple[_Type, ...]


@dataclass(frozen=True, slots=True)
class _All:
    members: tuple[_Type, ...]


@dataclass(frozen=True, slots=True)
class _Ref:
    name: str  # a named type of the same tool


_Type = _Prim | _Lit | _Array | _Tuple | _Object | _Union | _All | _Ref
_UNKNOWN = _Prim("unknown")


class _Names:
    """Unique type names within one tool (input and output schemas share it)."""

    def __init__(self) -> None:
        self._taken: set[str] = set()

    def claim(self, wanted: str) -> str:
        base = identifier(wanted, fallback="Def")
        if base in _TS_TYPE_NAMES:
            base += "_"
        name, counter = base, 2
        while name in self._taken:
            name, counter = f"{base.rstrip('_')}_{counter}", counter + 1
        self._taken.add(name)
        return name


class _Reader:
    """Reads one schema (and the `$defs` it references) into the type model."""

    def __init__(self, root: dict[str, Any], names: _Names) -> None:
        self._defs = {
            **(root.get("definitions") if isinstance(root.get("definitions"), dict) else {}),
            **(root.get("$defs") if isinstance(root.get("$defs"), dict) else {}),
        }
        self._names = names
        self._def_names: dict[str, str] = {}  # $defs key -> type name
        self.named: dict[str, _Type] = {}  # type name -> type, once read

    def read_all(self, schema: Any) -> _Type:
        """The type of `schema`, after which `named` holds every def it reaches."""
        top = self.read(schema, 0)
        while pending := [key for key, name in self._def_names.items() if name not in self.named]:
            for key in pending:
                self.named[self._def_names[key]] = _UNKNOWN  # stops re-reading on cycles
                self.named[self._def_names[key]] = self.read(self._defs[key], 0)
        _break_alias_cycles(self.named)
        return top

    def read(self, schema: Any, depth: int) -> _Type:
        if schema is True or schema == {}:
            return _UNKNOWN
        if schema is False:
            return _Prim("never")
        if not isinstance(schema, dict) or depth > MAX_DEPTH:
            return _UNKNOWN
        kind = self._read_kind(schema, depth)
        if schema.get("nullable") is True:
            return _union([kind, _Prim("null")])
        return kind

    def _read_kind(self, schema: dict[str, Any], depth: int) -> _Type:
        if "$ref" in schema:
            return self._ref(schema["$ref"])
        if "const" in schema:
            return _literal(schema["const"])
        if "enum" in schema:
            values = schema["enum"]
            return _union([_literal(v) for v in values]) if isinstance(values, list) else _UNKNOWN
        shaped = "type" in schema or "properties" in schema
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list) and not shaped:
                return _union([self.read(member, depth + 1) for member in schema[key]])
        if isinstance(schema.get("allOf"), list):
            parts = [self.read(member, depth + 1) for member in schema["allOf"]]
            base = {k: v for k, v in schema.items() if k != "allOf"}
            if shaped:
                parts.insert(0, self.read(base, depth))
            return parts[0] if len(parts) == 1 else _All(tuple(parts))
        return self._read_typed(schema, depth)

    def _read_typed(self, schema: dict[str, Any], depth: int) -> _Type:
        kind = schema.get("type")
        if isinstance(kind, list):
            return _union([self._read_single(schema, str(k), depth) for k in kind])
        if kind is None:
            if "properties" in schema or "additionalProperties" in schema:
                kind = "object"
            elif "items" in schema or "prefixItems" in schema:
                kind = "array"
        return self._read_single(schema, kind, depth)

    def _read_single(self, schema: dict[str, Any], kind: Any, depth: int) -> _Type:
        if kind in ("string", "number", "integer", "boolean", "null"):
            return _Prim(kind)
        if kind == "array":
            return self._read_array(schema, depth)
        if kind == "object":
            return self._read_object(schema, depth)
        return _UNKNOWN

    def _read_array(self, schema: dict[str, Any], depth: int) -> _Type:
        prefix, items = schema.get("prefixItems"), schema.get("items")
        if isinstance(items, list):  # draft 7 and earlier spell tuples this way
            prefix, items = items, schema.get("additionalItems", True)
        if isinstance(prefix, list):
            rest = (
                None
                if items is False
                else self.read(items if items is not None else True, depth + 1)
            )
            return _Tuple(tuple(self.read(item, depth + 1) for item in prefix), rest)
        return _Array(self.read(items if items is not None else True, depth + 1))

    def _read_object(self, schema: dict[str, Any], depth: int) -> _Object:
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        required = schema.get("required") if isinstance(schema.get("required"), list) else []
        names = list(props) + [
            name for name in required if isinstance(name, str) and name not in props
        ]
        extra = schema.get("additionalProperties", None if props else True)
        if "patternProperties" in schema and extra is None:
            extra = True
        return _Object(
            tuple(
                self._prop(name, props.get(name, True), name in required, depth) for name in names
            ),
            None if extra is None or extra is False else self.read(extra, depth + 1),
            _text(schema.get("description")),
        )

    def _prop(self, name: str, schema: Any, required: bool, depth: int) -> _Prop:
        described = schema if isinstance(schema, dict) else {}
        return _Prop(
            name,
            self.read(schema, depth + 1),
            required,
            _text(described.get("description")),
            described.get("default", _NO_DEFAULT),
        )

    def _ref(self, ref: Any) -> _Type:
        match = _DEF_REF.fullmatch(ref) if isinstance(ref, str) else None
        if match is None:
            return _UNKNOWN  # '#', deep pointers, other documents: not worth a name
        key = unquote(match.group(2)).replace("~1", "/").replace("~0", "~")
        if key not in self._defs:
            return _UNKNOWN
        if key not in self._def_names:
            self._def_names[key] = self._names.claim(key)
        return _Ref(self._def_names[key])


def _direct_refs(t: _Type) -> set[str]:
    """Named types `t` is an alias of, not counting those behind an object or array."""
    if isinstance(t, _Ref):
        return {t.name}
    if isinstance(t, _Union | _All):
        return set().union(*(_direct_refs(member) for member in t.members))
    return set()


def _reaches(named: dict[str, _Type], start: str, target: str) -> bool:
    stack, seen = list(_direct_refs(named[start])), set()
    while stack:
        name = stack.pop()
        if name == target:
            return True
        if name not in seen and name in named:
            seen.add(name)
            stack.extend(_direct_refs(named[name]))
    return False


def _break_alias_cycles(named: dict[str, _Type]) -> None:
    """Make `unknown` of defs that alias themselves (`A = A | string`): TS refuses them."""
    for name in named:
        if _reaches(named, name, name):
            named[name] = _UNKNOWN


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def _literal(value: Any) -> _Type:
    if value is None or isinstance(value, str | int | float | bool):
        return _Lit(value)
    return _UNKNOWN


def _identity(t: _Type) -> object:
    # True == 1 in Python, but `true` and `1` are different JSON literals.
    if not isinstance(t, _Lit):
        return t
    if isinstance(t.value, int | float) and not isinstance(t.value, bool):
        return (float, float(t.value))  # 1 and 1.0 are one JSON number
    return (type(t.value), t.value)


def _union(members: Iterable[_Type]) -> _Type:
    flat: dict[object, _Type] = {}
    for member in members:
        for part in member.members if isinstance(member, _Union) else (member,):
            if part != _Prim("never"):
                flat.setdefault(_identity(part), part)
    if _UNKNOWN in flat.values():
        return _UNKNOWN  # unknown absorbs everything
    if not flat:
        return _Prim("never")
    return next(iter(flat.values())) if len(flat) == 1 else _Union(tuple(flat.values()))


@dataclass(frozen=True, slots=True)
class _Shape:
    """One tool read for the SDK: argument and result types and its named types."""

    tool: UpstreamTool
    args: _Type
    result: _Type
    named: dict[str, _Type]


def _shape(tool: UpstreamTool) -> _Shape:
    names = _Names()
    named: dict[str, _Type] = {}
    args: _Type = _Object((), _UNKNOWN)
    if tool.input_schema and not check_schema(tool.input_schema):
        reader = _Reader(tool.input_schema, names)
        args = reader.read_all(tool.input_schema)
        named |= reader.named
    result: _Type = _UNKNOWN
    if tool.output_schema is not None and not check_schema(tool.output_schema):
        reader = _Reader(tool.output_schema, names)
        result = reader.read_all(tool.output_schema)
        named |= reader.named
    return _Shape(tool, args, result, dict(sorted(named.items())))


def _by_namespace(tools: Iterable[UpstreamTool]) -> dict[str, list[UpstreamTool]]:
    grouped: dict[str, list[UpstreamTool]] = {}
    for tool in sorted(tools, key=lambda tool: (tool.namespace, tool.sdk_name)):
        grouped.setdefault(tool.namespace, []).append(tool)
    return grouped


def _doc_lines(tool: UpstreamTool) -> list[str]:
    lines = tool.description.strip().splitlines() if tool.description.strip() else []
    return [*lines, *([""] if lines else []), f"Tool id: {tool.id}"]


# -- TypeScript ------------------------------------------------------------------------

_TS_PRIMS = {"integer": "number"}

_TS_HEADER = """\
// Conduit tools SDK: generated from the tool catalogue; do not edit.
// tools.<namespace>.<tool>(args) resolves to the tool's value (its structuredContent,
// else its text parsed as JSON, else the text) and rejects with a ToolError on failure.

/** Why a tool call failed. */
declare class ToolError extends Error {
  /** JSON-RPC error code of the failure. */
  code: number;
  /** Id of the tool that failed, e.g. "github__create_issue". */
  tool: string;
}

/** One tool, as tools.$discover() describes it. */
interface ToolDescription {
  /** Wire id, e.g. "github__create_issue". */
  id: string;
  /** SDK path, e.g. "github.create_issue": call it as tools.github.create_issue(args). */
  path: string;
  description: string;
  /** JSON Schema of the arguments. */
  inputSchema: unknown;
  /** JSON Schema of the value, when the tool declares one. */
  outputSchema?: unknown;
}
"""


def _jsdoc(lines: list[str], indent: str) -> list[str]:
    safe = [line.replace("*/", "*\\/").rstrip() for line in lines]
    if not safe:
        return []
    if len(safe) == 1:
        return [f"{indent}/** {safe[0]} */"]
    return [f"{indent}/**", *(f"{indent} * {line}".rstrip() for line in safe), f"{indent} */"]


def _prop_doc(prop: _Prop, default_tag: str) -> list[str]:
    """A property's description, and its default after `default_tag` when it has one."""
    lines = prop.description.splitlines()
    if prop.default is not _NO_DEFAULT:
        default = json.dumps(prop.default, ensure_ascii=False, default=repr)
        lines.append(f"{default_tag} {default}")
    return lines


def _ts_key(name: str) -> str:
    return name if _JS_IDENTIFIER.fullmatch(name) else json.dumps(name, ensure_ascii=False)


class _TypeScript:
    """Renders the type model as TypeScript; `prefix` qualifies named types."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix

    def type(self, t: _Type, indent: str) -> str:
        if isinstance(t, _Prim):
            return _TS_PRIMS.get(t.name, t.name)
        if isinstance(t, _Lit):
            return json.dumps(t.value, ensure_ascii=False)
        if isinstance(t, _Array):
            return f"{self._operand(t.items, indent)}[]"
        if isinstance(t, _Tuple):
            parts = [self.type(item, indent) for item in t.items]
            if t.rest is not None:
                parts.append(f"...{self._operand(t.rest, indent)}[]")
            return f"[{', '.join(parts)}]"
        if isinstance(t, _Object):
            return self._object(t, indent)
        if isinstance(t, _Union):
            return " | ".join(self._operand(member, indent) for member in t.members)
        if isinstance(t, _All):
            return " & ".join(self._operand(member, indent) for member in t.members)
        return f"{self._prefix}{t.name}"

    def _operand(self, t: _Type, indent: str) -> str:
        """`t` where it binds tighter than `|`, `&` and `[]`."""
        text = self.type(t, indent)
        needs = isinstance(t, _Union | _All) or (isinstance(t, _Lit) and text.startswith("-"))
        return f"({text})" if needs else text

    def _object(self, t: _Object, indent: str) -> str:
        if not t.props:
            return (
                "Record<string, never>"
                if t.extra is None
                else f"{{ [key: string]: {self.type(t.extra, indent)} }}"
            )
        inner = indent + "  "
        lines = ["{"]
        for prop in t.props:
            lines += _jsdoc(_prop_doc(prop, "@default"), inner)
            mark = "" if prop.required else "?"
            lines.append(f"{inner}{_ts_key(prop.name)}{mark}: {self.type(prop.type, inner)};")
        if t.extra is not None:
            # Declared properties must fit the index type, so it cannot be narrower.
            lines.append(f"{inner}[key: string]: unknown;")
        lines.append(f"{indent}}}")
        return "\n".join(lines)


def _ts_optional(args: _Type) -> bool:
    return isinstance(args, _Object) and not any(prop.required for prop in args.props)


def _ts_method(shape: _Shape, indent: str) -> list[str]:
    tool = shape.tool
    render = _TypeScript(f"ToolTypes.{tool.namespace}.{tool.sdk_name}." if shape.named else "")
    mark = "?" if _ts_optional(shape.args) else ""
    args = render.type(shape.args, indent)
    result = render.type(shape.result, indent)
    return [
        *_jsdoc(_doc_lines(tool), indent),
        f"{indent}{tool.sdk_name}(args{mark}: {args}): Promise<{result}>;",
    ]


def _ts_named(shape: _Shape) -> list[str]:
    if not shape.named:
        return []
    tool = shape.tool
    # Bare names inside: a namespace called ToolTypes would shadow the qualified path.
    render = _TypeScript("")
    lines = [f"declare namespace ToolTypes.{tool.namespace}.{tool.sdk_name} {{"]
    for name, t in shape.named.items():
        lines.append(f"  export type {name} = {render.type(t, '  ')};")
    return [*lines, "}", ""]


def typescript_declarations(
    tools: Iterable[UpstreamTool], *, descriptions: Mapping[str, str] | None = None
) -> str:
    """TypeScript declarations of `tools.*` for `tools` (see the module docstring).

    `descriptions` maps a namespace to its package description (JSDoc on the
    namespace). The text type-checks as a script or module with no imports.
    """
    grouped = _by_namespace(tools)
    shapes = {ns: [_shape(tool) for tool in members] for ns, members in grouped.items()}
    out = [_TS_HEADER]
    for members in shapes.values():
        for shape in members:
            out += _ts_named(shape)
    out.append("declare const tools: {")
    for namespace, members in shapes.items():
        out += _jsdoc(_text((descriptions or {}).get(namespace)).splitlines(), "  ")
        out.append(f"  {namespace}: {{")
        for shape in members:
            out += _ts_method(shape, "    ")
        out.append("  };")
    out += [
        "  /** Every tool this program may call, with its schemas. */",
        "  $discover(): Promise<ToolDescription[]>;",
        "};",
        "",
    ]
    return "\n".join(out)


# -- Python ----------------------------------------------------------------------------

_PY_PRIMS = {
    "string": "str",
    "number": "float",
    "integer": "int",
    "boolean": "bool",
    "null": "None",
    "unknown": "Any",
    "never": "Never",
}


_PY_DEFAULT = "Default:"
# Past this a signature reads better one parameter per line.
_PY_LINE_CHARS = 88


def _py_literal(value: str | int | bool | None) -> str:
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else repr(value)


def _py_identifier(name: str) -> bool:
    # A parameter named __x would be name-mangled inside the class body.
    return name.isidentifier() and not keyword.iskeyword(name) and not name.startswith("__")


def _py_doc(lines: list[str], indent: str) -> list[str]:
    safe = [line.replace("\\", "\\\\").replace('"""', '\\"\\"\\"').rstrip() for line in lines]
    while safe and not safe[-1]:
        safe.pop()
    if not safe:
        return []
    if len(safe) == 1:
        return [f'{indent}"""{safe[0]}"""']
    body = [f"{indent}{line}".rstrip() for line in safe[1:]]
    return [f'{indent}"""{safe[0]}', *body, f'{indent}"""']


class _Python:
    """Renders the type model as Python annotations, collecting `TypedDict`s it needs."""

    def __init__(self, prefix: str, classes: list[str]) -> None:
        self._prefix = prefix  # "<ns>__<tool>__"
        self._classes = classes
        self._names = _Names()

    def claim(self, wanted: str) -> str:
        return self._names.claim(wanted)

    def type(self, t: _Type, hint: str) -> str:
        if isinstance(t, _Prim):
            return _PY_PRIMS[t.name]
        if isinstance(t, _Lit):
            return "float" if isinstance(t.value, float) else f"Literal[{_py_literal(t.value)}]"
        if isinstance(t, _Array):
            return f"list[{self.type(t.items, hint + '__item')}]"
        if isinstance(t, _Tuple):
            parts = [self.type(item, f"{hint}__{i}") for i, item in enumerate(t.items)]
            if t.rest is not None:
                parts.append(f"*tuple[{self.type(t.rest, hint + '__item')}, ...]")
            return f"tuple[{', '.join(parts)}]" if parts else "tuple[()]"
        if isinstance(t, _Object):
            return self._object(t, hint)
        if isinstance(t, _Union):
            return self._union(t, hint)
        if isinstance(t, _All):
            return "dict[str, Any]"  # Python typing has no intersection
        return f"{self._prefix}{t.name}"

    def _union(self, t: _Union, hint: str) -> str:
        literals = [
            m.value for m in t.members if isinstance(m, _Lit) and not isinstance(m.value, float)
        ]
        rest = [
            m for m in t.members if not (isinstance(m, _Lit) and not isinstance(m.value, float))
        ]
        parts = [f"Literal[{', '.join(map(_py_literal, literals))}]"] if literals else []
        parts += [self.type(member, f"{hint}__{i}") for i, member in enumerate(rest)]
        return " | ".join(dict.fromkeys(parts))

    def _object(self, t: _Object, hint: str) -> str:
        if not t.props:
            return (
                "dict[str, Any]"
                if t.extra is None
                else f"dict[str, {self.type(t.extra, hint + '__value')}]"
            )
        name = self._prefix + self.claim(hint)
        self.typed_dict(name, t)
        return name

    def typed_dict(self, name: str, t: _Object) -> None:
        """Append `class name(TypedDict)` (or its functional form) to the classes."""
        fields = []
        for prop in t.props:
            annotation = self.type(
                prop.type, f"{name.removeprefix(self._prefix)}__{identifier(prop.name)}"
            )
            fields.append((prop, annotation if prop.required else f"NotRequired[{annotation}]"))
        if all(_py_identifier(prop.name) for prop, _ in fields):
            doc = _py_doc(t.description.splitlines(), "    ")
            lines = [f"class {name}(TypedDict):", *doc, *([""] if doc else [])]
            for prop, annotation in fields:
                lines.append(f"    {prop.name}: {annotation}")
                lines += _py_doc(_prop_doc(prop, _PY_DEFAULT), "    ")
        else:  # keys that are not identifiers need the functional syntax
            lines = [f"# {line}" for line in t.description.splitlines()]
            lines.append(f"{name} = TypedDict(")
            lines.append(f"    {name!r},")
            lines.append("    {")
            for prop, annotation in fields:
                lines += [f"        # {line}" for line in _prop_doc(prop, _PY_DEFAULT)]
                lines.append(f"        {json.dumps(prop.name, ensure_ascii=False)}: {annotation},")
            lines += ["    },", ")"]
        self._classes.append("\n".join(lines))


def _py_params(shape: _Shape, render: _Python) -> tuple[list[str], list[str]]:
    """The parameters and the `Args:` doc lines of one tool's method."""
    args = shape.args
    if not isinstance(args, _Object):
        return ["**kwargs: Any"], []
    params: list[str] = []
    docs: list[str] = []
    awkward = []
    for prop in sorted(args.props, key=lambda prop: not prop.required):  # required first
        annotation = render.type(prop.type, identifier(prop.name))
        if not _py_identifier(prop.name):
            awkward.append(f"{json.dumps(prop.name, ensure_ascii=False)}: {annotation}")
            continue
        params.append(f"{prop.name}: {annotation}" + ("" if prop.required else " = ..."))
        described = " ".join(_prop_doc(prop, _PY_DEFAULT))
        if described:
            docs.append(f"    {prop.name}: {described}")
    if awkward or args.extra is not None:
        params.append("**kwargs: Any")
    if awkward:
        example = awkward[0].split(": ", 1)[0]
        docs.append(
            f"    **kwargs: also {', '.join(awkward)} (not Python names: pass them as "
            f"**{{{example}: value}})"
        )
    keyword_only = ["*", *params] if params and not params[0].startswith("**") else params
    return keyword_only, (["Args:", *docs] if docs else [])


def _py_signature(head: str, params: list[str], result: str, indent: str) -> list[str]:
    line = f"{indent}{head}({', '.join(params)}) -> {result}:"
    if len(line) <= _PY_LINE_CHARS or not params:
        return [line]
    return [f"{indent}{head}(", *(f"{indent}    {p}," for p in params), f"{indent}) -> {result}:"]


def _py_method(shape: _Shape, classes: list[str], asynchronous: bool) -> list[str]:
    tool = shape.tool
    render = _Python(f"{tool.namespace}__{tool.sdk_name}__", classes)
    for name in shape.named:
        render.claim(name)  # named types keep their names: reserve them all first
    for name, t in shape.named.items():
        if isinstance(t, _Object) and t.props:
            render.typed_dict(f"{tool.namespace}__{tool.sdk_name}__{name}", t)
        else:
            classes.append(f"{tool.namespace}__{tool.sdk_name}__{name} = {render.type(t, name)}")
    params, arg_docs = _py_params(shape, render)
    result = render.type(shape.result, "Result")
    head = f"{'async def' if asynchronous else 'def'} {tool.sdk_name}"
    doc = _doc_lines(tool) + (["", *arg_docs] if arg_docs else [])
    return [
        "        @staticmethod",
        *_py_signature(head, params, result, "        "),
        *_py_doc(doc, "            "),
        "",
    ]


_PY_HEADER = '''\
"""Conduit tools SDK for Python: generated from the tool catalogue; do not edit.

tools.<namespace>.<tool>(name=value, ...) returns the tool's value (its
structuredContent, else its text parsed as JSON, else the text) and raises ToolError
when the call fails. Arguments whose names are not Python identifiers are passed as
**{"some-name": value}.
"""

from typing import Any, Literal, Never, NotRequired, TypedDict


class ToolError(Exception):
    """Why a tool call failed."""

    code: int
    """JSON-RPC error code of the failure."""
    tool: str
    """Id of the tool that failed, e.g. "github__create_issue"."""


class ToolDescription(TypedDict):
    """One tool, as tools._discover() describes it."""

    id: str
    path: str
    description: str
    inputSchema: dict[str, Any]
    outputSchema: NotRequired[dict[str, Any]]
'''


def python_stubs(
    tools: Iterable[UpstreamTool],
    *,
    descriptions: Mapping[str, str] | None = None,
    asynchronous: bool = False,
) -> str:
    """Python stubs of `tools.*` for `tools` (see the module docstring); valid syntax.

    `descriptions` maps a namespace to its package description (the class
    docstring). `asynchronous` makes every tool an `async def`, for guests whose calls
    must be awaited.
    """
    classes: list[str] = []
    body: list[str] = []
    for namespace, members in _by_namespace(tools).items():
        body.append(f"    class {namespace}:")
        body += _py_doc(_text((descriptions or {}).get(namespace)).splitlines(), "        ")
        body.append("")
        for tool in members:
            body += _py_method(_shape(tool), classes, asynchronous)
    discover = "async def" if asynchronous else "def"
    out = [_PY_HEADER, *(f"\n{text}\n" for text in classes), "", "class tools:"]
    out += [
        '    """Every tool this program may call: tools.<namespace>.<tool>(...)."""',
        "",
        "    @staticmethod",
        f"    {discover} _discover() -> list[ToolDescription]:",
        '        """Every tool this program may call, with its schemas."""',
        "",
        *body,
    ]
    return "\n".join(out).rstrip() + "\n"
