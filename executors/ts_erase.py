"""TypeScript whose types can be erased, as the JavaScript it means.

Most TypeScript a model writes is JavaScript with types on it. `erase` replaces each
type (annotations, interfaces, type aliases, generics, `as` and `satisfies`, non-null
`!`, `import type`, optional and definite markers, modifiers, overload and abstract
signatures, `declare`d things) with spaces, keeping every line break, so every line and
column of the code that is left stays where it was: errors and stack traces point at
the program's own text (a non-ASCII character in a type becomes as many spaces as the
engines count it columns). A statement that goes entirely starts with `;` instead of a
space, so the statement before it still ends where it did.

What erasure cannot express (`enum`, `namespace`, parameter properties, decorators,
`<T>x` casts, `import x = require()`, `this` parameters, `export =`) is refused with
what it was and where: such a program needs a TypeScript compiler (`deno`).

Every result is checked before it is trusted: the erased text is parsed again as
JavaScript, and its tree must be the TypeScript tree with the types taken out, node for
node at the same offsets. A type that hid code (`/* */` and template literals in types,
unicode escapes, a line break the erasure exposed to automatic semicolon insertion)
fails that check and the program is refused, never run with another meaning.

The check trusts this grammar's reading of the TypeScript, and TypeScript's own parser
reads some texts otherwise (`a < b > c`, what follows an `as` type, a modifier ending
its line, `declare` alone on one, `c ? (x): T => y : z`): those are refused by rules of their own
(`_check_reading`, `_comparison`, `_continued`), each saying what and where. A test runs
generated programs through real Deno both ways to keep them honest
(tests/executors/test_ts_erase_deno.py).

A `declare`d statement goes whole, as TypeScript emits nothing for it, whatever its
body holds.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

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
    """Why the program's types cannot simply be erased (what, and its line); `unread`
    when a parse came to nothing (too large or too slow: `js_syntax.parse`)."""

    reason: str
    unread: bool = False


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
# JavaScript's line terminators, and its white space (Unicode's, and U+FEFF).
_LINE_BREAK = re.compile(r"[\n\r\u2028\u2029]")
_SPACE = r"[\s\ufeff]"
# The next token after an offset: the space and comments before it, and its start.
_NEXT_TOKEN = re.compile(
    rf"((?:{_SPACE}|//[^\n\r\u2028\u2029]*|/\*[\s\S]*?\*/)*)(\?\.|\*\*|\+\+|--|[^\s\ufeff])?"
)
# The space and comments that end a text.
_TRAILING_GAP = re.compile(rf"(?:{_SPACE}|/\*[\s\S]*?\*/)*\Z")
# A line of a type that starts with `[`.
_BRACKET_LINE = re.compile(rf"[\n\r\u2028\u2029]{_SPACE}*\[")
# What `_no_typed_arrow_after_parentheses` does not look into: a function with a
# return type in brackets cannot be what takes the `:` that ends the true branch.
_BRACKETED = frozenset(
    {
        "statement_block", "arguments", "array", "object", "template_string",
        "parenthesized_expression", "class_body", "subscript_expression",
    }
)  # fmt: skip
# How far after a `<` a `>` closing what could be type arguments is looked for.
_TYPE_LIST_BYTES = 4096
# How many `<` a list of types is read through; past that, it is taken for types if a
# `>` follows at all. Each `<` is read from at most this many after it: a program of
# `a < b < c …` is read in linear time.
_TYPE_LIST_ANGLES = 8
# The tokens of what may be a list of types (`_type_list_end`): what no type holds
# (`code`), what any may (`type`: strings, templates, comments, `=>`, numbers, names,
# `.`, `,`, `|`, `&`, space), what only one in brackets or a conditional type may
# (`nested`), brackets, and anything else (`code` too).
_TYPE_TOKEN = re.compile(
    rb"""(?P<code>&&|\|\||\?\?|\?\.|[=!]=)
    |(?P<type>"(?:[^"\\\n\r]|\\.)*"|'(?:[^'\\\n\r]|\\.)*'|`(?:[^`\\]|\\.)*`
        |//[^\n\r]*|/\*.*?\*/|=>|-?[0-9][\w.]*|[\w$\\\x80-\xff]+|[.,|&\s])
    |(?P<nested>[?:;+\-])
    |(?P<open>[(\[{])|(?P<close>[)\]}])|(?P<angle><)|(?P<end>>)
    |(?P<other>.)""",
    re.VERBOSE | re.DOTALL,
)
# What ends TypeScript's `as` expression but would continue JavaScript's.
_NOT_AFTER_AS = frozenset({"(", "`", ".", "?.", "**", "!", "++", "--", "<"})
# Right operands of `<` that would be types to TypeScript (`f < () => T > x`).
_TYPE_LIKE_OPERANDS = frozenset(
    {"arrow_function", "function_expression", "new_expression", "class", "object", "array"}
)
# What TypeScript's non-null `!` follows (a left-hand side expression).
_NON_NULL_OPERANDS = frozenset(
    {
        "identifier", "member_expression", "subscript_expression", "call_expression",
        "parenthesized_expression", "non_null_expression", "this", "super",
        "new_expression", "string", "number", "template_string", "array", "object",
    }
)  # fmt: skip
# How far a gap is looked through for the next token (comments longer are refused).
_GAP_BYTES = 4096
# Words that are TypeScript's statements or modifiers before what follows them; alone
# as a statement, or as a class field's name with no value, TypeScript may read them
# with what follows where JavaScript reads a name.
_KEYWORDS = frozenset(
    {
        "declare", "abstract", "type", "interface", "namespace", "module", "global",
        "enum", "export", "readonly", "public", "private", "protected", "override",
        "get", "set", "static", "async", "accessor", "in", "out",
    }
)  # fmt: skip
# Those that start a statement to TypeScript when what follows is on the next line.
_STATEMENT_WORDS = frozenset(
    {"declare", "abstract", "type", "interface", "namespace", "module", "global", "enum", "export"}
)
# The keyword child that starts these declarations.
_LEADING_KEYWORD = frozenset(
    {
        "abstract_class_declaration",
        "interface_declaration",
        "type_alias_declaration",
        "ambient_declaration",
    }
)
_KEEP_LINE_BREAKS = re.compile(rb"\xe2\x80[\xa8\xa9]|[^\n\r]")
# A character that is not a line break (erasure keeps those).
_CHARACTER = re.compile(r"[^\n\r\u2028\u2029]")
# A byte that may begin a line break erasure keeps (U+2028 and U+2029 begin 0xE2).
_LINE_BREAK_BYTES = re.compile(rb"[\n\r\xe2]")
# Every kind of node `_Eraser._visit` and `_check_reading` act on; the walk passes
# any other straight to its children.
_READ = frozenset(
    {
        *_NEEDS_COMPILER,
        *_TYPES,
        *_TYPE_STATEMENTS,
        *_TYPE_TOKENS,
        *_MARKED,
        *_LEADING_KEYWORD,
        "arrow_function", "expression_statement", "formal_parameters",
        "as_expression", "satisfies_expression", "non_null_expression",
        "required_parameter", "optional_parameter", "import_statement", "export_statement",
        "abstract_class_declaration", "binary_expression", "ternary_expression",
    }
)  # fmt: skip


_UNREAD = "more text than is read (see js_syntax.parse)"
# `_reference`'s answer when its parse came to nothing.
_UNREAD_TREE: Any = object()


def erase(syntax: Syntax | None) -> Erased | NotErasable:
    """`syntax`'s program (parsed as TypeScript) with its types erased, or why not."""
    if syntax is None:
        return NotErasable(_UNREAD, unread=True)
    if not syntax.complete:
        return NotErasable(f"a syntax error (line {_first_error_line(syntax.root)})")
    eraser = _Eraser(syntax.data)
    try:
        edits = eraser.run(syntax.root)
    except _Refused as refused:
        return NotErasable(str(refused))
    erased = js_syntax.parse(_program(_apply(syntax.data, edits)), "javascript")
    if erased is None:
        return NotErasable(_UNREAD, unread=True)
    if not erased.complete:
        return NotErasable("types whose erasure leaves no JavaScript")
    reference, left = _reference(syntax, edits, eraser.calls)
    if reference is _UNREAD_TREE:
        return NotErasable(_UNREAD, unread=True)
    if reference is None or not _same_tree(reference, erased.root, left):
        return NotErasable("types whose erasure would change how the code around them reads")
    if not all(syntax.data[start:end].isascii() for start, end, _ in edits):
        # Checked byte for byte; run with each erased character one column wide.
        erased = js_syntax.parse(_program(_in_columns(syntax.data, edits)), "javascript")
        if erased is None or not erased.complete:
            return NotErasable(_UNREAD, unread=erased is None)
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
    again = js_syntax.parse(_program(_apply(syntax.data, calls)), "typescript")
    if again is None:
        return _UNREAD_TREE, edits
    if not again.complete:
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
        # The erased types of `as` and `satisfies` expressions the walk is still in.
        self._tails: list[tuple[int, int]] = []
        # Whether a node holds a typed arrow function outside brackets, by node id (see
        # `_no_typed_arrow_after_parentheses`): each node is looked at once.
        self._typed_arrows: dict[int, bool] = {}

    def run(self, root: tree_sitter.Node) -> list[_Edit]:
        cursor = root.walk()
        while True:
            if self._visit_unerased(cursor.node) and cursor.goto_first_child():
                continue
            while not cursor.goto_next_sibling():
                if not cursor.goto_parent():
                    return self.edits

    def _visit_unerased(self, node: tree_sitter.Node | None) -> bool:
        """`_visit`, unless `node` lies in the erased type of an `as` or `satisfies`
        expression (after its keyword): that is gone with whatever it holds."""
        assert node is not None
        if self._tails:
            begins = node.start_byte
            self._tails = [tail for tail in self._tails if tail[1] > begins]
            if any(start <= begins and node.end_byte <= end for start, end in self._tails):
                return False
        return node.type not in _READ or self._visit(node)

    def _visit(self, node: tree_sitter.Node | None) -> bool:
        """Erase what `node` is of types; whether its children are still to be visited."""
        assert node is not None
        kind = node.type
        if kind in _NEEDS_COMPILER:
            raise _Refused(f"{_NEEDS_COMPILER[kind]} (line {_line(node)})")
        _check_reading(self._data, node)
        if kind == "ternary_expression":
            _no_typed_arrow_after_parentheses(self._data, node, self._typed_arrows)
        if kind in _TYPES:
            self._type(node)
            return False
        if kind in _TYPE_STATEMENTS or _is_declared_field(node):
            self._erase(node.start_byte, node.end_byte, statement=True)
            return False
        if kind in _TYPE_TOKENS:
            _alone_on_its_line(self._data, node)
            self._erase(node.start_byte, node.end_byte)
            return False
        if kind in ("as_expression", "satisfies_expression"):
            keyword = node.child(1)
            assert keyword is not None
            self._erase(keyword.start_byte, node.end_byte)
            self._tails.append((keyword.start_byte, node.end_byte))
            self._continued(node, keyword)
        elif kind == "non_null_expression":
            operand = node.named_child(0)
            if operand is None or operand.type not in _NON_NULL_OPERANDS:
                raise _Refused(f"a `!` TypeScript does not take there (line {_line(node)})")
            self._erase(node.end_byte - 1, node.end_byte)
        elif kind in ("required_parameter", "optional_parameter"):
            self._parameter(node)
        elif kind in ("import_statement", "export_statement"):
            return self._module_statement(node)
        elif kind in _MARKED or kind == "abstract_class_declaration":
            self._markers(node)
        elif kind == "binary_expression":
            self._comparison(node)
        return True

    def _type(self, node: tree_sitter.Node) -> None:
        """Erase a type (annotation, parameters, arguments, implements clause)."""
        parent = node.parent
        if node.type == "type_arguments" and parent is not None:
            arguments = parent.child_by_field_name("arguments")
            callee = parent.child_by_field_name("function")
            if callee is not None and callee.type in ("as_expression", "satisfies_expression"):
                raise _Refused(f"type arguments after an `as` type (line {_line(node)})")
            if parent.type == "call_expression" and arguments is not None:
                if arguments.type != "arguments":
                    raise _Refused(f"a tagged template with type arguments (line {_line(node)})")
            elif parent.type not in ("new_expression", "extends_clause") or (
                parent.type == "new_expression" and arguments is None
            ):
                raise _Refused(f"type arguments with no call (line {_line(node)})")
        _no_bracket_line(self._data, node)
        self._erase(node.start_byte, node.end_byte)
        if (
            node.type == "type_arguments"
            and parent is not None
            and parent.type == "call_expression"
        ):
            self.calls.append(self.edits[-1])

    def _erase(self, start: int, end: int, *, statement: bool = False) -> None:
        self.edits.append((start, end, statement))

    def _markers(self, node: tree_sitter.Node) -> None:
        for child in js_syntax.children(node):
            if not child.is_named and child.type in _MARKERS:
                if child.type == "readonly" and node.type == "method_definition":
                    raise _Refused(f"a readonly method (line {_line(node)})")
                if child.type in ("readonly", "abstract"):
                    _alone_on_its_line(self._data, child)
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

    def _continued(self, node: tree_sitter.Node, keyword: tree_sitter.Node) -> None:
        """TypeScript ends an `as` or `satisfies` expression at its type: what comes
        next (`(`, `` ` ``, `.`, `?.`, `**`; `[` on a new line) is no call, tag, member
        or operand of it, whatever the grammar here made of it (after erasure
        JavaScript would read one). Nor does the keyword follow a line break or a
        digit (`1as T` and `x` + new line + `as T` are not TypeScript). Such a
        program is refused."""
        line = _line(node)
        before = self._data[max(keyword.start_byte - 1, 0) : keyword.start_byte]
        if before.isdigit() or _breaks_line(self._data[: keyword.start_byte], backwards=True):
            raise _Refused(f"an `{keyword.type}` keyword after a line break (line {line})")
        gap, token = _next_token(self._data, node.end_byte)
        if token in _NOT_AFTER_AS or (token == "[" and _LINE_BREAK.search(gap)):
            raise _Refused(f"code right after an `{keyword.type}` type (line {line})")
        if node.parent is not None and node.parent.type == "non_null_expression":
            raise _Refused(f"a `!` right after an `{keyword.type}` type (line {line})")
        _no_bracket_line(self._data, node)

    def _comparison(self, node: tree_sitter.Node) -> None:
        """`f < T > x` and `a < b, c > d`: comparisons to this grammar that TypeScript
        may read as type arguments (or the other way round). Refused: a `>` whose left
        operand ends in a `<` comparison, and a `<` whose `>` after it encloses only
        what a list of types could be (`_type_list_end`): whether TypeScript then
        reads types depends on what follows (`(`, a template, a line break, an
        operator), which this grammar does not weigh."""
        operator = node.child_by_field_name("operator")
        if operator is None:
            return
        if operator.type in (">", ">>", ">>>", ">="):
            left = node.child_by_field_name("left")
            while left is not None and left.type == "binary_expression":
                inner = left.child_by_field_name("operator")
                if inner is not None and inner.type == "<":
                    raise _Refused(f"a < … > TypeScript may read as types (line {_line(node)})")
                left = left.child_by_field_name("right")
        elif operator.type == "<":
            right = node.child_by_field_name("right")
            if right is not None and right.type in _TYPE_LIKE_OPERANDS:
                raise _Refused(f"a < … > TypeScript may read as types (line {_line(node)})")
            if _type_list_end(self._data, operator.end_byte) is not None:
                raise _Refused(f"a < … > TypeScript may read as types (line {_line(node)})")


def _type_list_end(data: bytes, start: int) -> int | None:
    """Where the `>` is that would close type arguments opened just before `start`, if
    everything up to it could be a list of types; None if something cannot be (an
    operator no type has, a bracket closed that was opened before, a `;` or `?` of
    code), or no such `>` comes within `_TYPE_LIST_BYTES`.

    Generous on purpose: it sees tokens, not the grammar of types, so a comparison it
    takes for types is refused (and runs on Deno), never erased with another meaning.
    """
    brackets = angles = 0
    conditional = False  # after `extends`, `?` and `:` may be a conditional type's
    end = min(len(data), start + _TYPE_LIST_BYTES)
    for token in _TYPE_TOKEN.finditer(data, start, end):
        kind = token.lastgroup
        if kind == "open":
            brackets += 1
        elif kind == "close":
            brackets -= 1
            if brackets < 0:
                return None
        elif kind == "angle":
            angles += 1
            if angles > _TYPE_LIST_ANGLES:  # deeper than types go: types only if a > follows
                return token.start() if data.find(b">", token.end(), end) >= 0 else None
        elif kind == "end":
            if not angles:
                return token.start() if not brackets else None  # in brackets: code
            angles -= 1
        elif kind == "type":
            conditional = conditional or token[0] == b"extends"
        elif kind != "nested" or not (brackets or conditional):
            return None
    return None


def _line(node: tree_sitter.Node) -> int:
    return node.start_point.row + 1


def _text(data: bytes) -> str:
    """Text to look for spaces and line breaks in (a character cut at an end is
    replaced)."""
    return data.decode("utf-8", "replace")


def _next_token(data: bytes, offset: int) -> tuple[str, str]:
    """The space and comments after `offset`, and the token that follows ("" at the
    end, or past `_GAP_BYTES` of comments: a gap that long is taken as a line break)."""
    found = _NEXT_TOKEN.match(_text(data[offset : offset + _GAP_BYTES]))
    assert found is not None  # the pattern matches the empty string
    if found[2] is None and offset + _GAP_BYTES < len(data):
        return "\n", ""
    return found[1], found[2] or ""


def _breaks_line(data: bytes, *, backwards: bool = False) -> bool:
    """Whether the space (and comments) that `data` ends with, or with `backwards`
    False starts with, holds a line break (or a comment, to be safe)."""
    if backwards:
        tail = _text(data[-_GAP_BYTES:])
        gap = tail[_TRAILING_GAP.search(tail).start() :]  # type: ignore[union-attr]
    else:
        gap = _next_token(data, 0)[0]
    return bool(_LINE_BREAK.search(gap)) or "/" in gap


def _no_bracket_line(data: bytes, node: tree_sitter.Node) -> None:
    """TypeScript never continues a type with `[` on a new line (an array or an
    indexed type): a line inside a type starting with `[` is code there."""
    if _BRACKET_LINE.search(_text(data[node.start_byte : node.end_byte])):
        raise _Refused(f"a type's line starting with [ (line {_line(node)})")


def _alone_on_its_line(data: bytes, token: tree_sitter.Node) -> None:
    """A modifier that a line break or a comment parts from what it modifies: the
    grammars read it one way or the other; refused."""
    if _breaks_line(data[token.end_byte : token.end_byte + _GAP_BYTES]):
        word = _text(data[token.start_byte : token.end_byte])
        raise _Refused(f"`{word}` ending a line (line {_line(token)})")


def _check_reading(data: bytes, node: tree_sitter.Node) -> None:
    """Refuse `node` where TypeScript's reading and this grammar's part, or where the
    erased text would read otherwise to JavaScript (see each case)."""
    kind = node.type
    if kind == "arrow_function":
        _arrow_on_one_line(data, node)
    elif kind == "expression_statement":
        named = [child for child in node.named_children if not child.is_extra]
        if len(named) == 1 and _is_keyword(data, named[0], _STATEMENT_WORDS):
            raise _Refused(f"a keyword alone as a statement (line {_line(node)})")
    elif kind in _LEADING_KEYWORD:
        keyword = node.child(0)
        if keyword is not None and not keyword.is_named:
            _alone_on_its_line(data, keyword)
    elif kind == "public_field_definition":
        valued = node.child_by_field_name("value") is not None
        if not valued and _is_keyword(data, node.child_by_field_name("name")):
            raise _Refused(f"a field named like a keyword, with no value (line {_line(node)})")
    elif kind == "formal_parameters":
        parameters = [child for child in node.named_children if not child.is_extra]
        if any(_is_rest(parameter) for parameter in parameters[:-1]):
            raise _Refused(f"a rest parameter that is not the last (line {_line(node)})")


def _is_keyword(
    data: bytes, name: tree_sitter.Node | None, words: frozenset[str] = _KEYWORDS
) -> bool:
    """Whether `name` is a name spelled as one of `words`."""
    if name is None or name.type not in ("identifier", "property_identifier"):
        return False
    return _text(data[name.start_byte : name.end_byte]) in words


def _is_rest(parameter: tree_sitter.Node) -> bool:
    inner = parameter.named_child(0)
    return parameter.type == "rest_pattern" or (inner is not None and inner.type == "rest_pattern")


def _arrow_on_one_line(data: bytes, arrow: tree_sitter.Node) -> None:
    """JavaScript allows no line break before `=>`, nor between `async` and the
    parameters: erasing a return type or type parameters must not leave one."""
    parameters = arrow.child_by_field_name("parameters") or arrow.child_by_field_name("parameter")
    token = next((child for child in js_syntax.children(arrow) if child.type == "=>"), None)
    if parameters is None or token is None:
        return
    if _LINE_BREAK.search(_text(data[parameters.end_byte : token.start_byte])):
        raise _Refused(f"a line break before an arrow function's => (line {_line(arrow)})")
    first = arrow.child(0)
    after_async = (
        b""
        if first is None or first.type != "async"
        else data[first.end_byte : parameters.start_byte]
    )
    if _LINE_BREAK.search(_text(after_async)):
        raise _Refused(f"a line break after an arrow function's async (line {_line(arrow)})")


def _no_typed_arrow_after_parentheses(
    data: bytes, node: tree_sitter.Node, known: dict[int, bool]
) -> None:
    """In `c ? (x): T => y : z => 1`, TypeScript reads the true branch as an arrow
    function with a return type (`(x): T => y`), as a `:` follows it; this grammar
    reads `(x)` as the branch and `T => ((y): z => 1)` as the other. Where a true
    branch ends with `)` and the false one holds an arrow function with a return type
    outside brackets, the program is refused. `known` keeps what each node holds, so
    nested conditionals look at each node once."""
    consequence = node.child_by_field_name("consequence")
    alternative = node.child_by_field_name("alternative")
    if consequence is None or alternative is None:
        return
    if not data[consequence.start_byte : consequence.end_byte].endswith(b")"):
        return
    if _holds_typed_arrow(alternative, known):
        line = _line(node)
        raise _Refused(
            f"a conditional whose true branch TypeScript may read as a function (line {line})"
        )


def _holds_typed_arrow(root: tree_sitter.Node, known: dict[int, bool]) -> bool:
    """Whether `root` is or holds, outside brackets, an arrow function with a return
    type (children first, without recursion; each answer kept in `known`)."""
    waiting = [(root, False)]
    while waiting:
        node, children_known = waiting.pop()
        if node.id in known:
            continue
        if node.type == "arrow_function" and node.child_by_field_name("return_type"):
            known[node.id] = True
        elif node.type in _BRACKETED:
            known[node.id] = False
        elif children_known:
            known[node.id] = any(known[child.id] for child in node.children)
        else:
            waiting.append((node, True))
            waiting.extend((child, False) for child in node.children)
    return known[root.id]


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
        erased = data[start:end]
        if _LINE_BREAK_BYTES.search(erased) is None:  # most types: one line, no U+2028
            out[start:end] = b" " * len(erased)
        else:
            out[start:end] = _KEEP_LINE_BREAKS.sub(_space, erased)
        if statement:
            out[start] = ord(";")
    return bytes(out)


def _in_columns(data: bytes, edits: list[_Edit]) -> bytes:
    """`_apply`'s program, with each erased character one space per UTF-16 unit (a
    column, to the engines) rather than one per byte: what follows a non-ASCII
    character in a type on its line keeps its column."""
    out = bytearray()
    done = 0
    for first, end, statement in sorted(edits):
        start = max(first, done)  # a range within one erased already
        if start >= end:
            continue
        out += data[done:start]
        blank = _CHARACTER.sub(_columns, data[start:end].decode("utf-8", "surrogatepass"))
        out += (";" + blank[1:] if statement else blank).encode("utf-8", "surrogatepass")
        done = end
    out += data[done:]
    return bytes(out)


def _columns(found: re.Match[str]) -> str:
    """A character's columns as spaces: two for one past U+FFFF (a surrogate pair)."""
    return "  " if ord(found[0]) > 0xFFFF else " "


def _program(data: bytes) -> str:
    """Edited program bytes as text: lone surrogates, kept as their bytes, come back."""
    return data.decode("utf-8", "surrogatepass")


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

    def start(node: tree_sitter.Node) -> int | None:
        """Where what is left of `node` starts (past its leading modifiers, if they
        were erased); None if it is gone whole."""
        end = within(node.start_byte)
        if end is None:
            return node.start_byte
        if node.end_byte <= end and node.parent is not None:
            return None
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
        # (the program starts at 0, whatever space is before its code)
        begins = None if not node.is_named else start(node) if depth else 0
        if begins is not None:
            if node.type in _TRANSPARENT and not _is_default_parameter(node):
                below.append(depth)
            else:
                yield _javascript_name(node), begins, depth
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
