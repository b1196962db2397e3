"""TypeScript whose types can be erased, as the JavaScript it means.

Most TypeScript a model writes is JavaScript with types on it. `erase` replaces each
type (annotations, interfaces, type aliases, generics, `as` and `satisfies`, non-null
`!`, `import type`, optional and definite markers, modifiers, overload and abstract
signatures, `declare`d things) with spaces, keeping every line break, so every line and
column of the code that is left stays where it was: errors and stack traces point at
the program's own text. (A column counts bytes of erased text before it on its line:
only a non-ASCII character inside a type moves it.) A statement that goes entirely
starts with `;` instead of a space, so the statement before it still ends where it did.

What erasure cannot express (`enum`, `namespace`, parameter properties, decorators,
`<T>x` casts, `import x = require()`, `this` parameters, `export =`) is refused with
what it was and where: such a program needs a TypeScript compiler (`deno`).

Every result is checked before it is trusted: the erased text is parsed again as
JavaScript, and its tree must be the TypeScript tree with the types taken out, node for
node at the same offsets. A type that hid code (`/* */` and template literals in types,
unicode escapes, a line break the erasure exposed to automatic semicolon insertion)
fails that check and the program is refused, never run with another meaning.

A `declare`d statement goes whole, as TypeScript emits nothing for it, whatever its
body holds.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass

import tree_sitter

from conduit.executors import js_syntax
from conduit.executors.js_syntax import Syntax

__all__ = ["Erased", "NotErasable", "erase"]


@dataclass(frozen=True, slots=True)
class Erased:
    """The program as JavaScript, and that JavaScript's parse."""

    code: str
    syntax: Syntax


@dataclass(frozen=True, slots=True)
class NotErasable:
    """Why the program's types cannot simply be erased (what, and its line)."""

    reason: str


# Type syntax that goes with everything in it.
_TYPES = frozenset(
    {
        "type_annotation",
        "asserts_annotation",
        "type_predicate_annotation",
        "opting_type_annotation",
        "omitting_type_annotation",
        "adding_type_annotation",
        "type_parameters",
        "type_arguments",
        "implements_clause",
    }
)
# Statements and class members that are types alone: they go whole, as a `;`.
_TYPE_STATEMENTS = frozenset(
    {
        "interface_declaration",
        "type_alias_declaration",
        "ambient_declaration",
        "function_signature",
        "abstract_method_signature",
        "index_signature",
        "method_signature",
    }
)
# Keywords and markers that are types alone, wherever they stand.
_TYPE_TOKENS = frozenset({"accessibility_modifier", "override_modifier"})
# Tokens that are types inside these nodes (an optional or definite member, `readonly`).
_MARKED = frozenset({"public_field_definition", "method_definition", "variable_declarator"})
_MARKERS = frozenset({"?", "!", "readonly", "abstract"})
# What needs a compiler, by node type: the reason given.
_NEEDS_COMPILER = {
    "enum_declaration": "an enum",
    "internal_module": "a namespace",
    "module": "a module declaration",
    "decorator": "a decorator",
    "type_assertion": "a <T> cast",
    "import_alias": "an import alias",
    "import_require_clause": "import = require()",
}
# TypeScript's tree where JavaScript's has another node of the same code.
_AS_JAVASCRIPT = {
    "public_field_definition": "field_definition",
    "abstract_class_declaration": "class_declaration",
}
# Nodes JavaScript's tree does not have around their children.
_TRANSPARENT = frozenset(
    {
        "as_expression",
        "satisfies_expression",
        "non_null_expression",
        "instantiation_expression",
        "required_parameter",
        "optional_parameter",
        "extends_clause",
    }
)
# Class names are type identifiers to TypeScript's grammar.
_NAMED = frozenset({"class_declaration", "abstract_class_declaration", "class"})
# The next token after an offset: the space and comments before it, and its first bytes.
_NEXT_TOKEN = re.compile(rb"((?:\s|//[^\n\r]*|/\*(?:[^*]|\*(?!/))*\*/)*)(\?\.|[^\s])?")
# A line of a type that starts with `[`.
_BRACKET_LINE = re.compile(rb"[\n\r][ \t]*\[")
_KEEP_LINE_BREAKS = re.compile(rb"\xe2\x80[\xa8\xa9]|[^\n\r]")


def erase(syntax: Syntax | None) -> Erased | NotErasable:
    """`syntax`'s program (parsed as TypeScript) with its types erased, or why not."""
    if syntax is None:
        return NotErasable("more text than is read (see js_syntax.parse)")
    if not syntax.complete:
        return NotErasable(f"a syntax error (line {_first_error_line(syntax.root)})")
    eraser = _Eraser(syntax.data)
    try:
        edits = eraser.run(syntax.root)
    except _Refused as refused:
        return NotErasable(str(refused))
    erased = js_syntax.parse(js_syntax._decode(_apply(syntax.data, edits)), "javascript")
    if erased is None or not erased.complete:
        return NotErasable("types whose erasure leaves no JavaScript")
    reference, edits = _reference(syntax, edits, eraser.calls)
    if reference is None or not _same_tree(reference, erased.root, edits):
        return NotErasable("types whose erasure would change how the code around them reads")
    return Erased(erased.code, erased)


def _first_error_line(root: tree_sitter.Node) -> int:
    """The line of the first syntax error under `root` (which has one)."""
    node = root
    while True:
        inner = next((c for c in js_syntax.children(node) if c.has_error), None)
        if inner is None or node.is_error or node.is_missing:
            return node.start_point.row + 1
        node = inner


def _reference(
    syntax: Syntax, edits: list[_Edit], calls: list[_Edit]
) -> tuple[tree_sitter.Node | None, list[_Edit]]:
    """The TypeScript tree the erased program's is compared with, and the edits it
    still has to lose.

    The grammar reads a call with type arguments as binding looser than any operator
    before it (`a + f<T>(x)` as `(a + f)<T>(x)`, `await f<T>()` as `(await f)<T>()`),
    where TypeScript binds the call first. Blanking those type arguments alone cannot
    change the reading (a call binds tighter than any operator either way), and the
    program parsed again without them has the calls where TypeScript has them.
    """
    if not calls:
        return syntax.root, edits
    again = js_syntax.parse(js_syntax._decode(_apply(syntax.data, calls)), "typescript")
    if again is None or not again.complete:
        return None, edits
    blanked = set(calls)
    return again.root, [edit for edit in edits if edit not in blanked]


class _Refused(Exception):
    """A node that erasure cannot express; its message says what and where."""


# An erased range: [start, end) of the program's bytes, and whether it becomes `;`.
_Edit = tuple[int, int, bool]


class _Eraser:
    """Collects the ranges to erase in one walk of the TypeScript tree."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.edits: list[_Edit] = []
        # The type arguments of calls, among `edits` (see `_reference`).
        self.calls: list[_Edit] = []

    def run(self, root: tree_sitter.Node) -> list[_Edit]:
        cursor = root.walk()
        while True:
            if self._visit(cursor.node) and cursor.goto_first_child():
                continue
            while not cursor.goto_next_sibling():
                if not cursor.goto_parent():
                    return self.edits

    def _visit(self, node: tree_sitter.Node | None) -> bool:
        """Erase what `node` is of types; whether its children are still to be visited."""
        assert node is not None
        kind = node.type
        if kind in _NEEDS_COMPILER:
            raise _Refused(f"{_NEEDS_COMPILER[kind]} (line {node.start_point.row + 1})")
        if kind in _TYPES:
            self._arrow_return_type(node)
            self._array_on_new_line(node)
            self._erase(node.start_byte, node.end_byte)
            parent = node.parent
            if kind == "type_arguments" and parent is not None and parent.type == "call_expression":
                self.calls.append(self.edits[-1])
            return False
        if kind in _TYPE_STATEMENTS or _is_declared_field(node):
            self._erase(node.start_byte, node.end_byte, statement=True)
            return False
        if kind in _TYPE_TOKENS:
            self._erase(node.start_byte, node.end_byte)
            return False
        if kind in ("as_expression", "satisfies_expression"):
            keyword = node.child(1)
            assert keyword is not None
            self._erase(keyword.start_byte, node.end_byte)
            self._continued(node)
        elif kind == "non_null_expression":
            self._erase(node.end_byte - 1, node.end_byte)
        elif kind in ("required_parameter", "optional_parameter"):
            self._parameter(node)
        elif kind in ("import_statement", "export_statement"):
            return self._module_statement(node)
        elif kind in _MARKED or kind == "abstract_class_declaration":
            self._markers(node)
        return True

    def _erase(self, start: int, end: int, *, statement: bool = False) -> None:
        self.edits.append((start, end, statement))

    def _markers(self, node: tree_sitter.Node) -> None:
        for child in js_syntax.children(node):
            if not child.is_named and child.type in _MARKERS:
                self._erase(child.start_byte, child.end_byte)

    def _parameter(self, node: tree_sitter.Node) -> None:
        line = node.start_point.row + 1
        first = node.named_child(0)
        if first is not None and first.type in ("accessibility_modifier", "override_modifier"):
            raise _Refused(f"a parameter property (line {line})")
        if any(child.type == "readonly" for child in js_syntax.children(node)):
            raise _Refused(f"a parameter property (line {line})")
        if first is not None and first.type == "this":
            raise _Refused(f"a this parameter (line {line})")
        if node.type == "optional_parameter":
            if node.child_by_field_name("value") is not None:
                raise _Refused(f"an optional parameter with a default (line {line})")
            self._markers(node)

    def _module_statement(self, node: tree_sitter.Node) -> bool:
        """`import type`, `export type`, an exported type: gone whole. A type among
        names imported or exported is refused (the list would need rewriting)."""
        if any(child.type == "type" for child in js_syntax.children(node)):
            self._erase(node.start_byte, node.end_byte, statement=True)
            return False
        declaration = node.child_by_field_name("declaration")
        if declaration is not None and declaration.type in _TYPE_STATEMENTS:
            self._erase(node.start_byte, node.end_byte, statement=True)
            return False
        for child in js_syntax.children(node):
            if child.type == "=":
                raise _Refused(f"export = (line {node.start_point.row + 1})")
        if _has_type_specifier(node):
            line = node.start_point.row + 1
            raise _Refused(f"a type among imported or exported names (line {line})")
        return True

    def _continued(self, node: tree_sitter.Node) -> None:
        """TypeScript ends an `as` or `satisfies` expression at its type: what comes
        next (`(`, `` ` ``, `.`; `[` on a new line) is no call, tag or member of it,
        whatever the grammar here made of it (after erasure JavaScript would read
        one). Such a program is refused."""
        found = _NEXT_TOKEN.match(self._data, node.end_byte)
        token = found[2] if found else b""
        if token in (b"(", b"`", b".", b"?.") or (token == b"[" and b"\n" in found[1]):
            raise _Refused(f"code right after an `as` type (line {node.end_point.row + 1})")
        self._array_on_new_line(node)

    def _array_on_new_line(self, node: tree_sitter.Node) -> None:
        """TypeScript never continues a type with `[` on a new line (an array or an
        indexed type): a new line starting with `[` inside a type is code there."""
        if _BRACKET_LINE.search(self._data, node.start_byte, node.end_byte):
            raise _Refused(f"a type's line starting with [ (line {node.start_point.row + 1})")

    def _arrow_return_type(self, node: tree_sitter.Node) -> None:
        """An arrow function's return type spanning lines would leave a line break
        before its `=>`, where JavaScript allows none."""
        parent = node.parent
        if parent is None or parent.type != "arrow_function" or node.type in ("type_parameters",):
            return
        if b"\n" in self._data[node.start_byte : node.end_byte]:
            line = node.start_point.row + 1
            raise _Refused(f"an arrow function's return type over lines (line {line})")


def _is_declared_field(node: tree_sitter.Node) -> bool:
    """A class field with `declare` or `abstract`: no field at run time."""
    if node.type != "public_field_definition":
        return False
    return any(child.type in ("declare", "abstract") for child in js_syntax.children(node))


def _has_type_specifier(node: tree_sitter.Node) -> bool:
    for clause in js_syntax.children(node):
        if clause.type in ("export_clause", "import_clause"):
            lists = [clause, *clause.named_children]
            for named in lists:
                for specifier in named.named_children:
                    kinds = {child.type for child in js_syntax.children(specifier)}
                    if kinds & {"type", "typeof"}:
                        return True
    return False


def _apply(data: bytes, edits: list[_Edit]) -> bytes:
    """`data` with each edit's range blanked (line breaks kept), a statement's first
    byte made `;`."""
    out = bytearray(data)
    for start, end, statement in edits:
        out[start:end] = _KEEP_LINE_BREAKS.sub(_space, data[start:end])
        if statement:
            out[start] = ord(";")
    return bytes(out)


def _space(found: re.Match[bytes]) -> bytes:
    text = found[0]
    return text if len(text) == 3 else b" "


# --- The check --------------------------------------------------------------------------

# A node as the check compares it: its type, where it starts, how deep it is.
_Shape = tuple[str, int, int]


def _same_tree(
    typescript: tree_sitter.Node, javascript: tree_sitter.Node, edits: list[_Edit]
) -> bool:
    """Whether the JavaScript tree is the TypeScript tree without its types."""
    erased = sorted((start, end) for start, end, _ in edits)
    semicolons = {start for start, _, statement in edits if statement}
    ours = _typescript_shapes(typescript, erased)
    theirs = _javascript_shapes(javascript, semicolons)
    for mine, other in zip(ours, theirs, strict=False):
        if mine != other:
            return False
    return next(ours, None) is None and next(theirs, None) is None


def _typescript_shapes(root: tree_sitter.Node, erased: list[tuple[int, int]]) -> Iterator[_Shape]:
    """The TypeScript tree's nodes, less those erased, as JavaScript's would be."""
    starts = [start for start, _ in erased]

    def within(byte: int) -> int | None:
        """The end of the erased range holding `byte`, if one does."""
        index = bisect.bisect_right(starts, byte) - 1
        return erased[index][1] if index >= 0 and byte < erased[index][1] else None

    def gone(node: tree_sitter.Node) -> bool:
        end = within(node.start_byte)
        return end is not None and node.end_byte <= end and node.parent is not None

    def start(node: tree_sitter.Node) -> int:
        """Where what is left of `node` starts (its leading modifiers erased)."""
        if node.parent is None:
            return 0  # the program
        while within(node.start_byte) is not None:
            node = next(child for child in js_syntax.children(node) if not gone(child))
        return node.start_byte

    cursor = root.walk()
    # For the node at each level of the cursor, the depth its children have: a node
    # JavaScript's tree does not have hands its own depth on to them.
    below = [0]
    while True:
        node = cursor.node
        assert node is not None
        depth = below[-1]
        if node.is_named and not gone(node):
            if node.type in _TRANSPARENT and not _is_default_parameter(node):
                below.append(depth)
            else:
                yield _javascript_name(node), start(node), depth
                below.append(depth + 1)
            if cursor.goto_first_child():
                continue
            below.pop()
        while not cursor.goto_next_sibling():
            if not cursor.goto_parent():
                return
            below.pop()


def _javascript_shapes(root: tree_sitter.Node, semicolons: set[int]) -> Iterator[_Shape]:
    cursor = root.walk()
    depth = 0
    while True:
        node = cursor.node
        assert node is not None
        descend = True
        if not node.is_named or (node.start_byte in semicolons and node.type == "empty_statement"):
            descend = False
        else:  # (the program starts at 0, whatever space is before its code)
            yield node.type, node.start_byte if depth else 0, depth
        if descend and cursor.goto_first_child():
            depth += 1
            continue
        while not cursor.goto_next_sibling():
            if not cursor.goto_parent():
                return
            depth -= 1


def _is_default_parameter(node: tree_sitter.Node) -> bool:
    return node.type == "required_parameter" and node.child_by_field_name("value") is not None


def _javascript_name(node: tree_sitter.Node) -> str:
    kind = node.type
    if kind == "required_parameter":
        return "assignment_pattern"
    if kind == "type_identifier":
        parent = node.parent
        if parent is not None and parent.type in _NAMED:
            return "identifier"
    return _AS_JAVASCRIPT.get(kind, kind)
