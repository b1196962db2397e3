"""Tool input schemas: are they valid JSON Schema, and do arguments match them.

Policy, decided once here:

- **Schema check.** An upstream's `inputSchema` is checked against its metaschema:
  Draft 2020-12 unless it names another draft in `$schema` (3, 4, 6, 7, 2019-09 and
  2020-12 are known; an unknown `$schema` is a problem). It must also describe an
  object (`type` absent, `"object"`, or a list holding `"object"`), since MCP arguments
  are always an object. A tool with problems is still listed (`problems()` says why,
  for `tools/schema` and the like) but strict mode refuses to call it.
- **No schema.** A tool whose `inputSchema` was missing is stored with `{}` (see
  `naming.assign_names`). Permissive mode calls it; strict mode refuses it.
- **Permissive (the default)** passes arguments through unchecked: the upstream is the
  judge of its own arguments, and an imperfect schema must not block a working tool.
  The arguments are already a JSON object by then (the wire params say so).
- **Strict** validates arguments before the call and refuses with `ArgumentsInvalid`,
  whose messages name the failing field: `arguments.repo.owner: 'x' is not of type
  'integer'`. Unknown tools are refused in both modes (see `catalogue.resolve`).
- **Either mode** refuses arguments nested deeper than `MAX_ARGUMENT_DEPTH` levels:
  no tool's schema goes near it, and the request made of them could not be written.
- `formats` are annotations (the 2020-12 default), not assertions. `$ref` resolves
  only within the schema itself: nothing is ever fetched.

Compiled validators are cached per (tool id, schema digest) in `SchemaCache`; a tool
whose schema changes is recompiled on next use, and only the latest schema of a tool is
kept. This module knows nothing of upstreams, transports or the catalogue's TTL.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for
from referencing.exceptions import Unresolvable

from conduit.core import jsontext
from conduit.core.errors import GatewayError, SchemaInvalid
from conduit.gateway.model import UpstreamTool

__all__ = [
    "ArgumentsInvalid",
    "SchemaCache",
    "check_schema",
    "field_path",
    "has_schema",
    "schema_digest",
    "validate_arguments",
]

# A call with hundreds of errors reads best as its first few; the rest add nothing.
MAX_ERRORS = 20
# jsonschema quotes offending values in messages; a 1 MB string must not come back.
MAX_MESSAGE_CHARS = 300
# How deeply a call's arguments may nest: past any schema, and within what the JSON
# encoders of a request to an upstream take (about 250 levels, the request's own
# included).
MAX_ARGUMENT_DEPTH = 128


def _too_deep(arguments: Any) -> list[str]:
    """The error of arguments nested deeper than `MAX_ARGUMENT_DEPTH`, or `[]`."""
    if jsontext.depth(arguments, MAX_ARGUMENT_DEPTH) > MAX_ARGUMENT_DEPTH:
        return [f"arguments: nested deeper than {MAX_ARGUMENT_DEPTH} levels"]
    return []


class ArgumentsInvalid(GatewayError):
    """Strict mode refused a call: the arguments do not match the tool's input schema.

    `errors` lists every problem (up to `MAX_ERRORS`), each naming its field.
    """

    def __init__(self, tool: UpstreamTool, errors: Sequence[str]) -> None:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        super().__init__(
            f"arguments for {tool.path} do not match its input schema: {errors[0]}{more}; "
            "fix them (tools/schema shows the schema)"
        )
        self.tool = tool
        self.errors = list(errors)


def has_schema(tool: UpstreamTool) -> bool:
    """Whether the upstream gave the tool an input schema at all."""
    return bool(tool.input_schema)


def schema_digest(schema: Any) -> str:
    """A stable hash of a schema's JSON (key order does not matter)."""
    canonical = json.dumps(schema, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(canonical.encode()).hexdigest()


def field_path(root: str, path: Iterable[str | int]) -> str:
    """`root` plus a JSON path as code would write it: `arguments.items[0]["a b"]`."""
    out = root
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}"
        else:
            out += f"[{json.dumps(part, ensure_ascii=False)}]"
    return out


def _short(message: str) -> str:
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return message[: MAX_MESSAGE_CHARS - 1] + "…"


def _validator_class(schema: dict[str, Any]) -> type[Validator] | None:
    """The draft `schema` asks for, Draft 2020-12 by default; `None` if unknown."""
    if "$schema" not in schema:
        return Draft202012Validator
    if not isinstance(schema["$schema"], str):
        return None
    return validator_for(schema, default=None)  # type: ignore[arg-type]  # None: unknown


def _describes_object(schema: dict[str, Any]) -> bool:
    kind = schema.get("type", "object")
    return kind == "object" or (isinstance(kind, list) and "object" in kind)


def check_schema(schema: Any) -> list[str]:
    """Problems that make `schema` unusable as a tool's input schema; `[]` if none."""
    if not isinstance(schema, dict):
        return ["inputSchema: must be a JSON object"]
    cls = _validator_class(schema)
    if cls is None:
        return [
            f"inputSchema.$schema: unknown metaschema {schema['$schema']!r}; "
            "use Draft 2020-12 (https://json-schema.org/draft/2020-12/schema) or omit it"
        ]
    meta = cls(cls.META_SCHEMA, format_checker=cls.FORMAT_CHECKER)
    try:
        problems = [
            _short(f"{field_path('inputSchema', error.absolute_path)}: {error.message}")
            for error in meta.iter_errors(schema)
        ]
    except RecursionError:
        return ["inputSchema: nested too deeply to check"]
    if not problems and not _describes_object(schema):
        problems.append("inputSchema.type: must be 'object' (MCP arguments are an object)")
    return problems[:MAX_ERRORS]


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)


def validate_arguments(validator: Validator, arguments: Any) -> list[str]:
    """Every way `arguments` fails `validator`, each naming its field; `[]` if valid.

    Raises `SchemaInvalid` when the schema itself cannot be applied (a `$ref` that
    does not resolve, or one that recurses forever).
    """
    if not isinstance(arguments, dict):
        return [f"arguments: expected a JSON object, got {_json_type(arguments)}"]
    try:
        errors = list(validator.iter_errors(arguments))
    except Unresolvable as exc:
        raise SchemaInvalid(f"inputSchema: cannot resolve a $ref ({exc})") from exc
    except RecursionError as exc:
        raise SchemaInvalid("inputSchema: a $ref recurses without end") from exc
    errors.sort(key=lambda error: ([str(part) for part in error.absolute_path], error.message))
    return [
        _short(f"{field_path('arguments', error.absolute_path)}: {error.message}")
        for error in errors[:MAX_ERRORS]
    ]


@dataclass(frozen=True, slots=True)
class _Compiled:
    digest: str
    problems: tuple[str, ...]
    validator: Validator | None  # None when the schema has problems


def _compile(schema: dict[str, Any]) -> _Compiled:
    problems = tuple(check_schema(schema))
    cls = None if problems else _validator_class(schema)
    validator = cls(schema) if cls is not None else None
    return _Compiled(schema_digest(schema), problems, validator)


class SchemaCache:
    """Compiled validators and schema problems, per (tool id, schema digest).

    Not thread-safe; used from the daemon's Trio thread only.
    """

    def __init__(self) -> None:
        self._by_tool: dict[str, _Compiled] = {}

    def _compiled(self, tool: UpstreamTool) -> _Compiled:
        cached = self._by_tool.get(tool.id)
        if cached is None or cached.digest != schema_digest(tool.input_schema):
            cached = self._by_tool[tool.id] = _compile(tool.input_schema)
        return cached

    def problems(self, tool: UpstreamTool) -> tuple[str, ...]:
        """Why the tool's input schema is unusable; `()` if it is fine (or absent)."""
        return self._compiled(tool).problems

    def validate(self, tool: UpstreamTool, arguments: Any) -> list[str]:
        """Every way `arguments` fails the tool's schema; `[]` if they match.

        A tool without a schema accepts any object; no tool accepts arguments nested
        deeper than `MAX_ARGUMENT_DEPTH`. Raises `SchemaInvalid` if the schema has
        problems, naming the first.
        """
        too_deep = _too_deep(arguments)
        if too_deep:
            return too_deep
        compiled = self._compiled(tool)
        if compiled.problems:
            raise SchemaInvalid(f"{tool.path} has an invalid input schema: {compiled.problems[0]}")
        assert compiled.validator is not None  # compiled whenever there are no problems
        return validate_arguments(compiled.validator, arguments)

    def enforce(self, tool: UpstreamTool, arguments: Any, *, strict: bool) -> None:
        """Raise unless this call may go to the upstream (the policy in the docstring).

        Either mode raises `ArgumentsInvalid` for arguments nested deeper than
        `MAX_ARGUMENT_DEPTH`. Permissive checks nothing more. Strict raises
        `SchemaInvalid` for a tool without a schema or with an invalid one,
        `ArgumentsInvalid` for arguments that do not match.
        """
        too_deep = _too_deep(arguments)
        if too_deep:
            raise ArgumentsInvalid(tool, too_deep)
        if not strict:
            return
        if not has_schema(tool):
            raise SchemaInvalid(
                f"{tool.path} has no input schema and this upstream is strict; "
                "the upstream must publish one, or make it permissive"
            )
        errors = self.validate(tool, arguments)
        if errors:
            raise ArgumentsInvalid(tool, errors)

    def retain(self, tool_ids: Iterable[str]) -> None:
        """Forget tools not in `tool_ids` (they left the catalogue)."""
        keep = set(tool_ids)
        self._by_tool = {key: value for key, value in self._by_tool.items() if key in keep}

    def __len__(self) -> int:
        return len(self._by_tool)
