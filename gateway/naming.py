"""SDK names: how an upstream's tools become `tools.<namespace>.<sdk_name>` in every guest.

A tool has two names besides the one its upstream gave it:

- its **id**, `<upstream>__<name>`, built from the configured upstream name and the raw
  tool name unchanged (the wire id; nothing ever splits it, it is only looked up);
- its **SDK path**, `<namespace>.<sdk_name>`, where both parts are identifiers that are
  valid, and mean the same thing, in TypeScript, JavaScript and Python.

Rules for an SDK identifier (`identifier()`), in order:

1. Unicode is folded towards ASCII (NFKD, accents dropped: `café` -> `cafe`); a
   character with no ASCII form becomes `u<hex>` (`日` -> `u65e5`), so distinct
   non-Latin names stay distinct instead of all collapsing to `_`.
2. Every other character outside `[A-Za-z0-9_]` becomes `_`; runs of `_` collapse to
   one and leading/trailing `_` are stripped (`get-current-time` -> `get_current_time`,
   `__proto__` -> `proto`). Case is kept: `createIssue` stays `createIssue`, because the
   model knows the tool by that spelling, and identifiers are case-sensitive everywhere.
3. Empty after that -> the fallback (`tool`, or `ns` for namespaces).
4. A leading digit gets a `_` prefix (`1password` -> `_1password`).
5. Reserved words get a `_` suffix (`delete` -> `delete_`, `from` -> `from_`): JS/TS
   reserved and strict-mode words, Python hard keywords, and the names that would break
   a namespace object in JS (`then` would make it a thenable that `await` unwraps;
   `constructor`, `toString`, ... shadow `Object.prototype`). Python *soft* keywords
   (`match`, `case`, `type`) are valid attribute names and are kept.

So SDK names never start with `$`, and never start with `_` followed by a letter:
those prefixes belong to SDK internals (`tools.$discover()` in JS/TS,
`tools._discover()` in Python). SDK names also never contain `__`.

Two tools of one upstream that end up with the same name are told apart
deterministically: tools whose raw name already *is* its SDK name claim it first, then
the rest in order of raw name; a name already taken gets `_2`, `_3`, ... So the same
tool set always gets the same names, and adding `get-time` beside an existing
`get_time` never renames `get_time`.

This module knows nothing of schemas, allowlists or upstream connections.
"""

from __future__ import annotations

import keyword
import logging
import re
import unicodedata
from typing import Any

from conduit.gateway.model import UpstreamTool

__all__ = ["RESERVED", "assign_names", "identifier", "namespace_for", "tool_id"]

log = logging.getLogger("conduit.gateway")

# ECMAScript reserved words, strict-mode reserved words and the literals; TypeScript
# adds nothing that is invalid as a property or namespace name beyond these.
_JS_RESERVED = frozenset(
    """
    await break case catch class const continue debugger default delete do else enum
    export extends false finally for function if import in instanceof new null return
    super switch this throw true try typeof var void while with yield implements
    interface let package private protected public static arguments eval undefined NaN
    Infinity
    """.split()  # noqa: SIM905 (a word list reads better than 50 quoted strings)
)
# Own properties with these names change how JS treats the namespace object itself.
_SDK_RESERVED = frozenset(
    """
    then constructor prototype toString toLocaleString valueOf toJSON hasOwnProperty
    isPrototypeOf propertyIsEnumerable
    """.split()  # noqa: SIM905 (a word list reads better than 50 quoted strings)
)
RESERVED: frozenset[str] = _JS_RESERVED | frozenset(keyword.kwlist) | _SDK_RESERVED

_UNDERSCORES = re.compile(r"_+")


def _fold(raw: str) -> str:
    """Rules 1-2: ASCII identifier characters only, `_` runs collapsed and trimmed."""
    out: list[str] = []
    for char in unicodedata.normalize("NFKD", raw):
        if unicodedata.combining(char):
            continue  # the accent of a decomposed letter
        if char.isascii():
            out.append(char if char.isalnum() or char == "_" else "_")
        else:
            out.append(f"_u{ord(char):04x}_")
    return _UNDERSCORES.sub("_", "".join(out)).strip("_")


def identifier(raw: str, fallback: str = "tool") -> str:
    """The SDK identifier for `raw` (see the module docstring for the rules)."""
    name = _fold(raw) or fallback
    if name[0].isdigit():
        name = "_" + name
    if name in RESERVED:
        name += "_"
    return name


def namespace_for(upstream: str) -> str:
    """The SDK namespace of an upstream (by its configured name)."""
    return identifier(upstream, fallback="ns")


def tool_id(upstream: str, name: str) -> str:
    """The wire id of tool `name` of `upstream`: `<upstream>__<name>`."""
    return f"{upstream}__{name}"


def _valid_raw_tools(upstream: str, raw_tools: list[Any]) -> list[dict[str, Any]]:
    """Entries with a usable name, first of each name only; the rest logged and dropped."""
    seen: set[str] = set()
    kept: list[dict[str, Any]] = []
    for raw in raw_tools:
        name = raw.get("name") if isinstance(raw, dict) else None
        if not isinstance(name, str) or not name:
            log.warning("upstream %r listed a tool without a name; ignored", upstream)
        elif name in seen:
            log.warning("upstream %r listed tool %r twice; kept the first", upstream, name)
        else:
            seen.add(name)
            kept.append(raw)
    return kept


def _unique_names(names: list[str]) -> dict[str, str]:
    """Map each raw name to a unique SDK name (the collision rule in the docstring)."""
    natural = {name: identifier(name) for name in names}
    order = sorted(names, key=lambda name: (natural[name] != name, name))
    taken: set[str] = set()
    assigned: dict[str, str] = {}
    for name in order:
        candidate, counter = natural[name], 2
        while candidate in taken:
            candidate, counter = f"{natural[name].rstrip('_')}_{counter}", counter + 1
        taken.add(candidate)
        assigned[name] = candidate
    return assigned


def _dict_or_none(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def assign_names(
    upstream: str, raw_tools: list[dict[str, Any]], *, bare: bool = False
) -> list[UpstreamTool]:
    """Turn an upstream's raw MCP tool list into `Tool`s with ids and SDK names; with
    `bare`, a tool's id is its raw name rather than `<upstream>__<name>`.

    Entries without a string name and repeated names are dropped (logged). A missing or
    non-object `inputSchema` becomes `{}`, which is how the rest of the gateway knows a
    tool has no schema. Returns the tools sorted by SDK name. Never raises for bad input.
    """
    kept = _valid_raw_tools(upstream, raw_tools)
    names = _unique_names([raw["name"] for raw in kept])
    namespace = namespace_for(upstream)
    tools = [
        UpstreamTool(
            id=raw["name"] if bare else tool_id(upstream, raw["name"]),
            upstream=upstream,
            name=raw["name"],
            namespace=namespace,
            sdk_name=names[raw["name"]],
            description=raw.get("description") if isinstance(raw.get("description"), str) else "",
            input_schema=_dict_or_none(raw.get("inputSchema")) or {},
            output_schema=_dict_or_none(raw.get("outputSchema")),
            annotations=_dict_or_none(raw.get("annotations")),
        )
        for raw in kept
    ]
    return sorted(tools, key=lambda tool: tool.sdk_name)
