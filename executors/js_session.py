"""A session step's top-level declarations made global, so the next step sees them.

A session runs its steps one after another in one JavaScript isolate, each as the body
of a function (`js_syntax.prepare_module`): what a step declares at top level would be
local to that function and gone with it. `rewrite_step` turns each top-level
declaration into an assignment to a property of `globalThis`, where later steps find
it by its bare name:

    let x: number = 1, y           ->  { globalThis.x = 1; globalThis.y = undefined }
    const {a, b: c = 1, ...r} = o  ->  { ({a: globalThis.a, b: globalThis.c = 1,
                                          ...globalThis.r} = o) }
    class C {}                     ->  {globalThis.C = class C {}}
    function f() {}                ->  kept (hoisting holds), and `globalThis.f = f` at
                                       the top of the step
    import x, {a as b} from "m"    ->  kept, then `{globalThis.x = x; globalThis.b = b;}`
    enum E {A}                     ->  kept, then `{globalThis.E = E;}`

Globals rather than a copy at the end of a step: a function from one step reads the
variable itself, so it sees what a later step assigns to it. `var x` without a value
keeps the value `x` has (as redeclaring a `var` does); `let` and `const` without one
are `undefined`. A `const` becomes assignable: a session is a REPL.

What is left alone: everything nested (functions, blocks, loops), TypeScript's types,
interfaces, overload signatures, `const enum`s, `declare`d and `export default`
declarations, and `namespace`s (whose value may be erased with their types); a
declaration of a name in KEPT_LOCAL. Every rewritten statement is a block, so a step
that ends with a declaration still has no value, as a fresh run does. Line breaks stay
where they were: an error points at the line the user wrote.

A program that does not parse cleanly (or too large or slow to parse, within
`js_syntax`'s limits) is returned unchanged: the runtime then reports its own error.
The tree is walked with cursors and explicit stacks, never by recursion, so hostile
nesting costs what the parse did.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import tree_sitter

from conduit.executors.js_syntax import Dialect, children, parse

__all__ = ["KEPT_LOCAL", "rewrite_step"]

GLOBAL = b"globalThis."
# Names a declaration cannot give to a global: Deno's read-only properties of
# `globalThis`, those the Deno worker and the wasm-js guest make read-only (`tools`,
# `ToolError`, `localStorage`, wasm-js's `fs`), and `globalThis` itself, which every
# rewritten assignment goes through. A declaration of one stays local to its step.
KEPT_LOCAL = frozenset(
    b"undefined NaN Infinity Deno globalThis tools ToolError localStorage fs".split()
)

_DECLARATIONS = frozenset(("lexical_declaration", "variable_declaration"))
_FUNCTIONS = frozenset(("function_declaration", "generator_function_declaration"))
# Declarations whose binding is assigned right after them: a class expression cannot
# be abstract, and an enum has no expression form.
_ASSIGNED_AFTER = frozenset(("abstract_class_declaration", "enum_declaration"))
_LINE_BREAKS = re.compile(rb"\r\n|[\n\r]|\xe2\x80[\xa8\xa9]")


@dataclass(frozen=True, slots=True)
class _Edit:
    """Replace data[start:end] with `text` (an insertion when start == end)."""

    start: int
    end: int
    text: bytes


@dataclass(slots=True)
class _Plan:
    """The edits for one step, and the functions to assign at its top."""

    data: bytes
    edits: list[_Edit] = field(default_factory=list)
    functions: dict[bytes, None] = field(default_factory=dict)  # ordered, unique

    def insert(self, at: int, text: bytes) -> None:
        self.edits.append(_Edit(at, at, text))

    def replace(self, node: tree_sitter.Node, text: bytes) -> None:
        self.edits.append(_Edit(node.start_byte, node.end_byte, text))

    def text(self, node: tree_sitter.Node) -> bytes:
        return self.data[node.start_byte : node.end_byte]


def rewrite_step(code: str, dialect: Dialect) -> str:
    """`code` with its top-level declarations made global (see the module docstring);
    unchanged if it does not parse cleanly. Never raises."""
    syntax = parse(code, dialect)
    if syntax is None or not syntax.complete:
        return code
    plan = _Plan(syntax.data)
    first: int | None = None
    prologue = True  # "use strict" and other directives come first, untouched
    for statement in children(syntax.root):
        if statement.is_extra or statement.type == "hash_bang_line":
            continue
        prologue = prologue and _is_directive(statement)
        if first is None and not prologue:
            first = statement.start_byte
        _statement(plan, statement)
    if first is not None and plan.functions:
        plan.insert(first, _assignments(plan.functions))
    if not plan.edits:
        return code
    return _apply(plan.data, plan.edits).decode("utf-8", "surrogatepass")


def _statement(plan: _Plan, node: tree_sitter.Node) -> None:
    kind = node.type
    if kind in _DECLARATIONS:
        _declaration(plan, node)
    elif kind in _FUNCTIONS:
        _function(plan, node)
    elif kind == "class_declaration":
        _class(plan, node)
    elif kind in _ASSIGNED_AFTER and not _is_const_enum(node):
        _assigned_after(plan, node)
    elif kind == "import_statement":
        _import(plan, node)
    elif kind == "export_statement":
        _export(plan, node)


def _export(plan: _Plan, node: tree_sitter.Node) -> None:
    """`export <declaration>`: the declaration as if unexported (`prepare_module`
    drops the keyword of what is left as a declaration; a rewritten one is no longer
    a declaration, so its keyword is blanked here)."""
    declaration = node.child_by_field_name("declaration")
    if declaration is None:
        return
    if any(child.type == "default" for child in children(node)):
        if declaration.type in _FUNCTIONS:
            _function(plan, declaration)
        return
    before = len(plan.edits)
    _statement(plan, declaration)
    rewritten = declaration.type in _DECLARATIONS or declaration.type == "class_declaration"
    if rewritten and len(plan.edits) > before:
        keyword = node.child(0)
        if keyword is not None and keyword.type == "export":
            plan.replace(keyword, b" " * (keyword.end_byte - keyword.start_byte))


def _function(plan: _Plan, node: tree_sitter.Node) -> None:
    name = node.child_by_field_name("name")
    if name is not None and plan.text(name) not in KEPT_LOCAL:
        plan.functions[plan.text(name)] = None


def _class(plan: _Plan, node: tree_sitter.Node) -> None:
    """`class C {}` -> `{globalThis.C = class C {}}`; a decorated class keeps its
    declaration and is assigned after it (decorators on class expressions are newer)."""
    name = node.child_by_field_name("name")
    if name is None or plan.text(name) in KEPT_LOCAL:
        return
    if any(child.type == "decorator" for child in children(node)):
        _assigned_after(plan, node)
        return
    plan.insert(node.start_byte, b"{" + GLOBAL + plan.text(name) + b" = ")
    plan.insert(_code_end(node), b"}")


def _is_const_enum(node: tree_sitter.Node) -> bool:
    """A `const enum` has no value at run time: its uses are inlined, it is erased."""
    return node.type == "enum_declaration" and any(c.type == "const" for c in children(node))


def _assigned_after(plan: _Plan, node: tree_sitter.Node) -> None:
    name = node.child_by_field_name("name")
    if name is not None and plan.text(name) not in KEPT_LOCAL:
        plan.insert(node.end_byte, _assignments({plan.text(name): None}))


def _import(plan: _Plan, node: tree_sitter.Node) -> None:
    """Copy an import's local names to globals after it; type-only imports have none."""
    names = dict.fromkeys(_imported_names(plan, node))
    names = {name: None for name in names if name not in KEPT_LOCAL}
    if not names:
        return
    ended = plan.data[node.end_byte - 1 : node.end_byte] == b";"
    plan.insert(node.end_byte, (b"" if ended else b";") + _assignments(names))


def _imported_names(plan: _Plan, node: tree_sitter.Node) -> Iterator[bytes]:
    if any(child.type == "type" for child in children(node)):
        return  # `import type …`
    clause = next((c for c in children(node) if c.type == "import_clause"), None)
    if clause is None:
        return  # `import "m"`, or TypeScript's `import x = require(…)`
    for part in children(clause):
        if part.type == "identifier":
            yield plan.text(part)
        elif part.type == "namespace_import":
            yield from (plan.text(c) for c in children(part) if c.type == "identifier")
        elif part.type == "named_imports":
            for specifier in children(part):
                if specifier.type != "import_specifier":
                    continue
                if any(child.type == "type" for child in children(specifier)):
                    continue  # `import {type T}`
                local = specifier.child_by_field_name("alias") or specifier.child_by_field_name(
                    "name"
                )
                if local is not None and local.type == "identifier":
                    yield plan.text(local)


def _declaration(plan: _Plan, node: tree_sitter.Node) -> None:
    """`let|const|var a = 1, {b} = o` -> `{ globalThis.a = 1; ({b: globalThis.b} = o)}`.

    Left alone (local to the step) if a name is one of KEPT_LOCAL or a binding has a
    shape not known here."""
    keyword = node.child(0)
    if keyword is None or keyword.type not in ("let", "const", "var"):
        return
    is_var = keyword.type == "var"
    edits: list[_Edit] = [_Edit(keyword.start_byte, keyword.end_byte, b"{")]
    for child in children(node):
        if child.type == ",":
            edits.append(_Edit(child.start_byte, child.end_byte, b";"))
        elif child.type == "variable_declarator":
            declarator = _declarator(plan, child, is_var)
            if declarator is None:
                return
            edits += declarator
    end = _code_end(node)
    edits.append(_Edit(end, end, b"}"))
    plan.edits += edits


def _declarator(plan: _Plan, node: tree_sitter.Node, is_var: bool) -> list[_Edit] | None:
    """The edits that make one declarator an assignment; None to leave it alone."""
    name = node.child_by_field_name("name")
    value = node.child_by_field_name("value")
    if name is None:
        return None
    targets = _targets(plan, name)
    if targets is None:
        return None
    edits, names = targets
    if any(bound in KEPT_LOCAL for bound in names):
        return None
    pattern = name.type != "identifier"
    if pattern:
        if value is None:
            return None  # not valid JavaScript: the parser let it through
        edits.insert(0, _Edit(name.start_byte, name.start_byte, b"("))
    if value is not None:
        # The `=`, with a TypeScript annotation or `!` before it: only its breaks stay.
        between = plan.data[name.end_byte : value.start_byte]
        edits.append(_Edit(name.end_byte, value.start_byte, b" = " + _breaks(between)))
        if pattern:
            edits.append(_Edit(node.end_byte, node.end_byte, b")"))
        return edits
    initial = GLOBAL + plan.text(name) if is_var else b"undefined"
    rest = plan.data[name.end_byte : node.end_byte]
    edits.append(_Edit(name.end_byte, node.end_byte, b" = " + initial + _breaks(rest)))
    return edits


def _targets(plan: _Plan, pattern: tree_sitter.Node) -> tuple[list[_Edit], list[bytes]] | None:
    """The edits that make a binding pattern an assignment pattern whose targets are
    globals, and the names it binds; None for a shape not known here."""
    edits: list[_Edit] = []
    names: list[bytes] = []
    stack = [pattern]
    while stack:
        node = stack.pop()
        kind = node.type
        if node.is_extra:
            continue
        if kind == "identifier":
            names.append(plan.text(node))
            edits.append(_Edit(node.start_byte, node.start_byte, GLOBAL))
        elif kind == "shorthand_property_identifier_pattern":
            name = plan.text(node)
            names.append(name)
            edits.append(_Edit(node.end_byte, node.end_byte, b": " + GLOBAL + name))
        elif kind in ("object_pattern", "array_pattern", "rest_pattern"):
            stack += (child for child in children(node) if child.is_named)
        elif kind == "pair_pattern":
            stack.append(_field(node, "value"))
        elif kind in ("assignment_pattern", "object_assignment_pattern"):
            stack.append(_field(node, "left"))
        else:
            return None
    return edits, names


def _field(node: tree_sitter.Node, name: str) -> tree_sitter.Node:
    """A field every complete node of its type has; a node of no known type otherwise
    (it then makes `_targets` give up)."""
    return node.child_by_field_name(name) or node


def _assignments(names: dict[bytes, None]) -> bytes:
    """`{globalThis.a = a; globalThis.b = b;}`: a block, so it has no value."""
    return b"{" + b" ".join(GLOBAL + name + b" = " + name + b";" for name in names) + b"}"


def _breaks(segment: bytes) -> bytes:
    """The line breaks in `segment`, which must stay for later lines to keep numbers."""
    return b"".join(_LINE_BREAKS.findall(segment))


def _is_directive(statement: tree_sitter.Node) -> bool:
    """Whether `statement` is a directive such as `"use strict";`: a string alone."""
    if statement.type != "expression_statement":
        return False
    expression = statement.named_child(0)
    return expression is not None and expression.type == "string"


def _code_end(node: tree_sitter.Node) -> int:
    """Where `node`'s code ends: before a comment the parser counted in it (a line
    comment after a declaration with no semicolon), so a brace put there is code."""
    end = node.end_byte
    for child in children(node):
        if child.type != "comment":
            end = child.end_byte
    return end


def _apply(data: bytes, edits: list[_Edit]) -> bytes:
    """`data` with `edits` applied. Insertions at one offset keep the order they were
    made in, and come before a replacement starting there; edits never overlap."""
    pieces: list[bytes] = []
    position = 0
    for edit in sorted(edits, key=lambda edit: (edit.start, edit.end)):
        pieces.append(data[position : edit.start])
        pieces.append(edit.text)
        position = max(position, edit.end)
    pieces.append(data[position:])
    return b"".join(pieces)
