"""JavaScript and TypeScript programs, read with a real parser (tree-sitter).

Two readers rest on one parse:

- `prepare_module` turns a program into an ES module whose default export runs it. A
  program arrives as script-like text: top-level `await` and `return`, static imports
  anywhere at top level, and a last expression whose value is the result (as in a REPL
  or a notebook cell):

      import … ; export default async function () {    <- line 1: the header
      <the program, line for line>                           <- user line N is N + 1
      }

- `Syntax.mentions` lists what a program names (globals, module specifiers, method
  calls): what the daemon's policy and wasm-js's `Intl` check match against. Strings,
  comments, property names and object keys are never mentions.

`parse` makes the `Syntax` both read; `prepare_parsed` prepares a program from a parse
made already, so that one request parses its program once (`syntax_memo`).

The dialect is the runtime's: `typescript` (Deno loading `application/typescript`) or
`javascript` (Deno loading `application/javascript`, and SpiderMonkey). A program the
grammar does not accept (a syntax error, or syntax newer than the grammar), one too
large or too slow to parse, is never rewritten: it is wrapped unchanged, and the
runtime reports its own error at the user's line.

Every input is hostile. Parsing runs in C without recursion in Python; tree-sitter's
own stack use grows with unclosed nesting, so a large program is parsed on a thread
whose stack is sized for it (`_STACK_BYTES_PER_SOURCE_BYTE`), and every parse stops
after `PARSE_BUDGET_S` of CPU time. Trees are walked with a TreeCursor in a loop, never
recursively (tree-sitter's queries are no help here: they slow to minutes on a tree
50,000 levels deep).

`js_session` rewrites a session's steps on the same parse (`parse`, `Syntax.root`).

It deliberately knows nothing about Deno, permissions, policies or how a module is
loaded.
"""

from __future__ import annotations

import bisect
import contextlib
import enum
import functools
import itertools
import re
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

import tree_sitter
import tree_sitter_javascript
import tree_sitter_typescript

__all__ = [
    "PARSE_BUDGET_S",
    "Dialect",
    "Member",
    "Mention",
    "MentionKind",
    "PreparedModule",
    "Syntax",
    "children",
    "may_await",
    "parse",
    "prepare_module",
    "prepare_parsed",
    "unread_parses",
]

Dialect = Literal["typescript", "javascript"]

# CPU time one parse may take: far above any real program's (100 KB takes tens of
# milliseconds), far below what garbage crafted against error recovery can cost
# (seconds a megabyte). Thread CPU time, so a busy machine does not cut a parse short.
PARSE_BUDGET_S = 1.0
# Smaller programs are parsed without the budget's progress callback, which would cost
# a fifth of their parse; at ~10 us a byte for the worst text, they end within 50 ms.
_UNTIMED_PARSE_BYTES = 4 * 1024
# tree-sitter's stack grows with unclosed nesting, up to ~32 bytes per source byte for
# the worst shape found (`{a:` repeated overflows 8 MB at 270 KB). Programs up to this
# size then fit in a fraction of an ordinary thread's stack and are parsed in place.
_INLINE_PARSE_BYTES = 16 * 1024
# Larger ones get a thread with this much stack per byte, four times the worst shape's
# need; only the pages touched cost memory.
_STACK_BYTES_PER_SOURCE_BYTE = 128
_MIN_STACK_BYTES = 8 * 1024 * 1024
# Larger programs are not parsed (their stack alone would be half a gigabyte): they run
# unchanged. The daemon's default code limit is 1 MB.
MAX_PARSE_BYTES = 4 * 1024 * 1024


# --- Parsing ----------------------------------------------------------------------------


@functools.cache
def _language(dialect: Dialect) -> tree_sitter.Language:
    """The grammar, loaded once per process."""
    if dialect == "javascript":
        return tree_sitter.Language(tree_sitter_javascript.language())
    return tree_sitter.Language(tree_sitter_typescript.language_typescript())


# A Parser holds state between calls and is not thread-safe: one per thread and dialect.
_parsers = threading.local()
# `threading.stack_size` is process-wide: set it and start the thread under one lock.
_stack_size_lock = threading.Lock()


def _parser(dialect: Dialect) -> tree_sitter.Parser:
    cached: dict[str, tree_sitter.Parser] | None = getattr(_parsers, "by_dialect", None)
    if cached is None:
        cached = _parsers.by_dialect = {}
    if dialect not in cached:
        cached[dialect] = tree_sitter.Parser(_language(dialect))
    return cached[dialect]


def _parse_here(data: bytes, dialect: Dialect) -> tree_sitter.Tree | None:
    """Parse on this thread within PARSE_BUDGET_S of its CPU time; None if it ran out."""
    parser = _parser(dialect)
    if len(data) <= _UNTIMED_PARSE_BYTES:
        return parser.parse(data)
    deadline = time.thread_time() + PARSE_BUDGET_S

    def out_of_time(_offset: int, _has_error: bool) -> bool:
        return time.thread_time() > deadline

    view = memoryview(data)
    with _read_buffer() as buffer:

        def read(offset: int, _point: object) -> bytearray:
            # Always the same buffer, refilled: the parser never lets go of what `read`
            # returns (py-tree-sitter 0.26), so a new object each time would be kept
            # each time, and a view of `data` would keep all of it. It has let go of
            # its view of the buffer before it asks again, so the buffer may resize.
            buffer[:] = view[offset : offset + _READ_CHUNK_BYTES]
            return buffer

        try:
            return parser.parse(read, progress_callback=out_of_time)
        except ValueError:  # halted by `out_of_time`; the parser would resume otherwise
            parser.reset()
            return None
        except BaseException:  # whatever stopped it, the next parse starts afresh
            parser.reset()
            raise


# Buffers the parser reads programs through (`_parse_here`), each used by one parse at
# a time: as many as parses ever ran at once, never freed (the parser keeps a
# reference to each for good).
_READ_CHUNK_BYTES = 64 * 1024
_read_buffers: list[bytearray] = []
_read_buffers_lock = threading.Lock()


@contextlib.contextmanager
def _read_buffer() -> Iterator[bytearray]:
    with _read_buffers_lock:
        buffer = _read_buffers.pop() if _read_buffers else bytearray()
    try:
        yield buffer
    finally:
        with _read_buffers_lock:
            _read_buffers.append(buffer)


def _parse_bytes(data: bytes, dialect: Dialect) -> tree_sitter.Tree | None:
    if len(data) <= _INLINE_PARSE_BYTES:
        return _parse_here(data, dialect)
    if len(data) > MAX_PARSE_BYTES:
        return None
    result: list[tree_sitter.Tree | None] = [None]

    def run() -> None:
        result[0] = _parse_here(data, dialect)

    stack = max(_MIN_STACK_BYTES, len(data) * _STACK_BYTES_PER_SOURCE_BYTE)
    with _stack_size_lock:
        previous = threading.stack_size(stack)
        try:
            thread = threading.Thread(target=run, name="js-syntax-parse", daemon=True)
            thread.start()
        except (RuntimeError, MemoryError):  # no thread to be had: the program runs unread
            return None
        finally:
            threading.stack_size(previous)
    thread.join()
    return result[0]


# JavaScript also ends lines at a lone CR, U+2028 and U+2029, which the grammars do not
# know. A copy with those made `\n` (padded to the same length, so offsets hold) is
# parsed first; U+2028 and U+2029 may also sit in a string literal, where a `\n` is an
# error, so the program as written is parsed when the copy does not parse.
_OTHER_LINE_BREAKS = re.compile(rb"\r(?!\n)|\xe2\x80[\xa8\xa9]")


def _parse_program(data: bytes, dialect: Dialect) -> tree_sitter.Tree | None:
    """The program's tree; None if it was too large or too slow to parse."""
    normalized = _OTHER_LINE_BREAKS.sub(lambda found: b"\n".ljust(len(found[0])), data)
    tree = _parse_bytes(normalized, dialect)
    # The program as written reads its other line breaks as spaces: it is a fallback
    # for a copy that parsed with errors, never for one that could not be parsed.
    if tree is not None and normalized != data and tree.root_node.has_error:
        tree = _parse_bytes(data, dialect) or tree
    return tree


def _encode(code: str) -> bytes:
    # Lone surrogates (valid in a JSON string, and in a JavaScript one) pass through as
    # the bytes they would be; the parser reads them as invalid UTF-8 inside the string
    # literal, and decoding the rewritten text gives them back.
    return code.encode("utf-8", "surrogatepass")


def _decode(data: bytes) -> str:
    return data.decode("utf-8", "surrogatepass")


def parse(code: str, dialect: Dialect) -> Syntax | None:
    """`code` parsed, or None if it was too large or too slow to parse. A program with
    syntax errors parses too, with `Syntax.complete` False. Never raises."""
    data = _encode(code)
    tree = _parse_program(data, dialect)
    if tree is None:
        _came_to_nothing.count = unread_parses() + 1
        return None
    return Syntax(code, data, dialect, tree)


# How many of a thread's parses came to nothing: a reader that decides from parses
# (`SyntaxMemo.decided`) tells whether one of its own did.
_came_to_nothing = threading.local()


def unread_parses() -> int:
    """How many `parse` calls on this thread have returned None."""
    count: int = getattr(_came_to_nothing, "count", 0)
    return count


# --- Mentions ---------------------------------------------------------------------------


class MentionKind(enum.Enum):
    """What a program names, as the policy and wasm-js read it."""

    NAME = "name"  # an identifier in code: a variable, a global, a binding
    GLOBAL_PROPERTY = "global_property"  # `globalThis.X`, `window["X"]` (a literal key)
    METHOD_CALL = "method_call"  # `x.name(...)`, `x?.name(...)`
    SPECIFIER = "specifier"  # `import … "x"`, `export … from "x"`, `import("x")`, `require("x")`


@dataclass(frozen=True, slots=True)
class Mention:
    """One thing a program names: its kind, its value (escapes decoded), the character
    offset of its first character, and (for a method call) whether it has arguments."""

    kind: MentionKind
    value: str
    offset: int
    has_arguments: bool = False


@dataclass(frozen=True, slots=True)
class Member:
    """A property the program reads: its name, what it is read from (a name, or None
    for anything else: `f().x`), and whether the read is a call's callee (`x.name()`)."""

    receiver: str | None
    name: str
    called: bool


# Objects whose properties are the globals themselves.
_GLOBAL_OBJECTS = frozenset(("globalThis", "window", "self", "global"))

# Nodes that name something, by type (see `Syntax._mention`).
_NAMES = frozenset(
    ("identifier", "shorthand_property_identifier", "shorthand_property_identifier_pattern")
)
_WITH_SOURCE = frozenset(("import_statement", "export_statement", "import_require_clause"))
_OPENERS = frozenset(("(", "[", "{", "${"))
_CLOSERS = frozenset((")", "]", "}"))


# Bytes that are not UTF-8 continuation bytes (0x80-0xBF): `translate` deletes them to
# count the rest. Lone surrogates, encoded as three bytes, follow the same pattern.
_NOT_CONTINUATION = bytes(value for value in range(256) if not 0x80 <= value < 0xC0)
# How many bytes one count of continuation bytes covers: an offset costs at most one
# block's `translate`, and the counts a list of len/4096 numbers.
_OFFSET_BLOCK = 4096

# Escapes in identifiers and strings: `\u0044eno` is `Deno`.
_ESCAPE = re.compile(
    r"\\(?:u\{(?P<code>[0-9a-fA-F]+)\}|u(?P<u4>[0-9a-fA-F]{4})|x(?P<x2>[0-9a-fA-F]{2})"
    r"|(?P<newline>\r\n|[\n\r\u2028\u2029])|(?P<other>[\s\S]))"
)
_SIMPLE_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "b": "\b", "f": "\f", "v": "\v", "0": "\0"}


def _unescape(text: str) -> str:
    """`text` with JavaScript's string and identifier escapes decoded."""
    if "\\" not in text:
        return text

    def decode(found: re.Match[str]) -> str:
        number = found["code"] or found["u4"] or found["x2"]
        if number is not None:
            value = int(number, 16)
            return chr(value) if value <= 0x10FFFF else ""
        if found["newline"] is not None:
            return ""
        other = found["other"]
        return _SIMPLE_ESCAPES.get(other, other)

    return _ESCAPE.sub(decode, text)


class Syntax:
    """A parsed program, and what can be read from its tree.

    `complete` is False when the program has syntax errors: its brackets are still
    there to count (`deepest`), but what it names is a guess of the parser's error
    recovery, and `mentions` finds nothing. Offsets count characters of the program.
    """

    def __init__(self, code: str, data: bytes, dialect: Dialect, tree: tree_sitter.Tree) -> None:
        self.code = code
        self.dialect: Dialect = dialect
        self._data = data
        self._tree = tree
        self._ascii = len(data) == len(code)
        self.complete = not tree.root_node.has_error
        # For each block of the UTF-8 form, how many continuation bytes precede it.
        self._continuations: list[int] | None = None

    def __repr__(self) -> str:
        return f"<Syntax {self.dialect}, {len(self.code)} characters>"

    @property
    def root(self) -> tree_sitter.Node:
        """The tree's root, for a reader that walks the statements itself (a rewrite)."""
        return self._tree.root_node

    @property
    def data(self) -> bytes:
        """The program's UTF-8 form: what the tree's byte offsets index."""
        return self._data

    def offset(self, byte: int) -> int:
        """The character offset of a byte offset into the program's UTF-8 form.

        Every character but its first byte is a continuation byte, so the offset is the
        bytes before it less their continuation bytes, counted per block once.
        """
        if self._ascii:
            return byte
        data = self._data
        if self._continuations is None:
            blocks = (
                len(data[start : start + _OFFSET_BLOCK].translate(None, _NOT_CONTINUATION))
                for start in range(0, len(data), _OFFSET_BLOCK)
            )
            self._continuations = list(itertools.accumulate(blocks, initial=0))
        block = byte // _OFFSET_BLOCK
        start = block * _OFFSET_BLOCK
        within = len(data[start:byte].translate(None, _NOT_CONTINUATION))
        return byte - self._continuations[block] - within

    def _text(self, node: tree_sitter.Node) -> str:
        return _decode(self._data[node.start_byte : node.end_byte])

    def deepest(self, limit: int) -> tuple[int, int] | None:
        """The first bracket (or template `${`) opening deeper than `limit`, as (depth,
        character offset), or None. Brackets in strings, comments and regular
        expression literals do not count; type arguments' angle brackets neither."""
        depth = 0
        for node in self._leaves():
            kind = node.type
            if kind in _OPENERS:
                depth += 1
                if depth > limit:
                    return depth, self.offset(node.start_byte)
            elif kind in _CLOSERS:
                depth = max(depth - 1, 0)
        return None

    def mentions(self, words: Iterable[str] | None = None) -> Iterator[Mention]:
        """What the program names, in source order of the nodes that name it (see
        `MentionKind`). For a program that is not `complete`, what the grammar read
        around its errors: a deny list errs on the side of finding.

        With `words`, only the parts of the tree whose text holds one of them are read
        (all of it when the program spells anything with a `\\u` escape), so a large
        program that mentions a word once costs a walk down to it.
        """
        places = None if words is None else self._places(words)
        for node in self._nodes(places):
            found = self._mention(node)
            if found is not None:
                yield found

    def loads_modules(self) -> bool:
        """Whether the program has an import declaration, an `import(…)`, `require(…)`
        or `import.meta`, or `export … from`: what needs a module loader. A program
        that is not `complete` is taken to."""
        if not self.complete:
            return True
        for node in self._nodes(self._places(("import", "require", "export"))):
            kind = node.type
            if kind in ("import", "import_statement", "meta_property"):
                return True
            if kind == "export_statement" and node.child_by_field_name("source") is not None:
                return True
            if kind == "call_expression":
                callee = node.child_by_field_name("function")
                is_name = callee is not None and callee.type == "identifier"
                if is_name and _unescape(self._text(callee)) == "require":
                    return True
        return False

    def globals_used(self, words: Iterable[str]) -> set[str]:
        """Those of `words` the program uses as globals: names it reads but never
        declares (as a variable, function, class, parameter or import, anywhere: a
        name declared in one scope counts as the program's own in every other), and
        properties of the global object, however it is reached: `globalThis.X`,
        `(0, globalThis)["X"]`, `globalThis.self.X`, `const { X } = globalThis`, or
        through a name given it (`const g = globalThis; g.X`). A program that is not
        `complete` uses none."""
        if not self.complete:
            return set()
        wanted = set(words)
        aliases = self._global_aliases()
        read: set[str] = set()
        declared: set[str] = set()
        properties: set[str] = set()
        for node in self._nodes(self._places(wanted)):
            kind = node.type
            if kind in _NAMES:
                name = _unescape(self._text(node))
                if name in wanted:
                    (declared if _declares(node) else read).add(name)
            elif kind in ("member_expression", "subscript_expression"):
                if self._is_global(node.child_by_field_name("object"), aliases):
                    properties |= self._keys([node]) & wanted
            elif kind == "variable_declarator":
                pattern = node.child_by_field_name("name")
                destructured = pattern is not None and pattern.type == "object_pattern"
                if destructured and self._is_global(node.child_by_field_name("value"), aliases):
                    properties |= self._keys(pattern.named_children) & wanted  # type: ignore[union-attr]
        return (read - declared) | properties

    def members(self, names: Iterable[str]) -> Iterator[Member]:
        """The program's reads of properties named one of `names`: `x.name`, `x?.name`,
        `x["name"]` (a literal key) and `const { name } = x`. A program that is not
        `complete` reads none."""
        if not self.complete:
            return
        wanted = set(names)
        for node in self._nodes(self._places(wanted)):
            kind = node.type
            if kind in ("member_expression", "subscript_expression"):
                receiver = self._name_of(node.child_by_field_name("object"))
                parent = node.parent
                called = (
                    parent is not None
                    and parent.type == "call_expression"
                    and parent.child_by_field_name("function") == node
                )
                for name in self._keys([node]) & wanted:
                    yield Member(receiver, name, called)
            elif kind == "variable_declarator":
                pattern = node.child_by_field_name("name")
                if pattern is not None and pattern.type == "object_pattern":
                    receiver = self._name_of(node.child_by_field_name("value"))
                    for name in self._keys(pattern.named_children) & wanted:
                        yield Member(receiver, name, called=False)

    def _name_of(self, node: tree_sitter.Node | None) -> str | None:
        """The name `node` is (through parentheses), or None if it is not a name."""
        node = _operand(node)
        if node is None or node.type != "identifier":
            return None
        return _unescape(self._text(node))

    def _global_aliases(self) -> set[str]:
        """Names the program gives the global object (`const g = globalThis`)."""
        aliases: set[str] = set()
        for node in self._nodes(self._places(_GLOBAL_OBJECTS)):
            if node.type == "variable_declarator":
                name, value = node.child_by_field_name("name"), node.child_by_field_name("value")
            elif node.type == "assignment_expression":
                name, value = node.child_by_field_name("left"), node.child_by_field_name("right")
            else:
                continue
            if name is not None and name.type == "identifier" and self._is_global(value, aliases):
                aliases.add(_unescape(self._text(name)))
        return aliases

    def _is_global(self, node: tree_sitter.Node | None, aliases: set[str]) -> bool:
        """Whether `node` is the global object (seen through parentheses, a comma
        sequence's last operand, and `globalThis.self`-like chains)."""
        node = _operand(node)
        if node is None:
            return False
        if node.type == "identifier":
            name = _unescape(self._text(node))
            return name in _GLOBAL_OBJECTS or name in aliases
        if node.type == "member_expression":
            named = node.child_by_field_name("property")
            if named is not None and _unescape(self._text(named)) in _GLOBAL_OBJECTS:
                return self._is_global(node.child_by_field_name("object"), aliases)
        return False

    def _keys(self, nodes: Iterable[tree_sitter.Node]) -> set[str]:
        """The property names `nodes` read: a member's property, a literal index, a
        destructuring pattern's keys."""
        keys: set[str] = set()
        for node in nodes:
            kind = node.type
            if kind == "member_expression":
                found = node.child_by_field_name("property")
            elif kind == "subscript_expression":
                index = node.child_by_field_name("index")
                literal = None if index is None else self._literal(MentionKind.NAME, index)
                if literal is not None:
                    keys.add(literal.value)
                continue
            elif kind in ("pair_pattern", "object_assignment_pattern"):
                found = node.child_by_field_name("key") or node.child_by_field_name("left")
            else:
                found = node
            if found is not None and found.type in (*_NAMES, "property_identifier"):
                keys.add(_unescape(self._text(found)))
            elif found is not None and found.type == "string":
                keys.add(_unescape(self._text(found)[1:-1]))
        return keys

    def _places(self, words: Iterable[str]) -> list[int] | None:
        """The sorted byte offsets where `words` occur, or None if escapes may hide them."""
        if b"\\u" in self._data:
            return None
        pattern = _words_pattern(tuple(words))
        return [found.start() for found in pattern.finditer(self._data)] if pattern else []

    def _nodes(self, places: list[int] | None) -> Iterator[tree_sitter.Node]:
        """Every node in document order, depth first, without recursion; with `places`,
        only those spanning one of them (and so only their subtrees)."""
        cursor = self._tree.walk()
        while True:
            node = cursor.node
            assert node is not None
            if places is None or _spans(places, node.start_byte, node.end_byte):
                yield node
                if cursor.goto_first_child():
                    continue
            while not cursor.goto_next_sibling():
                if not cursor.goto_parent():
                    return

    def _leaves(self) -> Iterator[tree_sitter.Node]:
        cursor = self._tree.walk()
        while True:
            if cursor.goto_first_child():
                continue
            node = cursor.node
            assert node is not None
            yield node
            while not cursor.goto_next_sibling():
                if not cursor.goto_parent():
                    return

    def _mention(self, node: tree_sitter.Node) -> Mention | None:
        kind = node.type
        if kind in _NAMES:
            return self._at(MentionKind.NAME, _unescape(self._text(node)), node)
        if kind in _WITH_SOURCE:
            source = node.child_by_field_name("source")
            return None if source is None else self._literal(MentionKind.SPECIFIER, source)
        if kind == "call_expression":
            callee = node.child_by_field_name("function")
            arguments = node.child_by_field_name("arguments")
            if callee is None or arguments is None or arguments.type != "arguments":
                return None
            return self._call(callee, arguments)
        if kind not in ("member_expression", "subscript_expression"):
            return None
        target = node.child_by_field_name("object")
        if target is None or target.type != "identifier":
            return None
        if _unescape(self._text(target)) not in _GLOBAL_OBJECTS:
            return None
        if kind == "member_expression":
            name = node.child_by_field_name("property")
            if name is None or name.type != "property_identifier":
                return None
            return self._at(MentionKind.GLOBAL_PROPERTY, _unescape(self._text(name)), name)
        key = node.child_by_field_name("index")
        return None if key is None else self._literal(MentionKind.GLOBAL_PROPERTY, key)

    def _call(self, callee: tree_sitter.Node, arguments: tree_sitter.Node) -> Mention | None:
        first = next((c for c in children(arguments) if c.is_named and not c.is_extra), None)
        if callee.type == "member_expression":
            method = callee.child_by_field_name("property")
            if method is None or method.type != "property_identifier":
                return None
            value = _unescape(self._text(method))
            return self._at(MentionKind.METHOD_CALL, value, method, first is not None)
        is_import = callee.type == "import"
        is_require = callee.type == "identifier" and _unescape(self._text(callee)) == "require"
        if (is_import or is_require) and first is not None:
            return self._literal(MentionKind.SPECIFIER, first)
        return None

    def _literal(self, kind: MentionKind, node: tree_sitter.Node) -> Mention | None:
        """A mention of a string literal's value (or a template's without substitutions)."""
        if node.type == "string" or (
            node.type == "template_string"
            and not any(child.type == "template_substitution" for child in children(node))
        ):
            return self._at(kind, _unescape(self._text(node)[1:-1]), node)
        return None

    def _at(
        self, kind: MentionKind, value: str, node: tree_sitter.Node, has_arguments: bool = False
    ) -> Mention:
        return Mention(kind, value, self.offset(node.start_byte), has_arguments)


# Where a name is declared: the parent's type, and the field the name is in (None: any).
_DECLARING_FIELDS = {
    "variable_declarator": "name",
    "function_declaration": "name",
    "generator_function_declaration": "name",
    "function_expression": "name",
    "generator_function": "name",
    "class_declaration": "name",
    "class": "name",
    "arrow_function": "parameter",
    "catch_clause": "parameter",
    "assignment_pattern": "left",
    "object_assignment_pattern": "left",
    "pair_pattern": "value",
    "for_in_statement": "left",
}
_DECLARING = frozenset(
    {
        "formal_parameters",
        "array_pattern",
        "rest_pattern",
        "import_specifier",
        "import_clause",
        "namespace_import",
    }
)


def _declares(name: tree_sitter.Node) -> bool:
    """Whether the identifier `name` is where a name is declared (or, in a
    destructuring assignment or `for (x of …)`, assigned: taken for the same)."""
    if name.type == "shorthand_property_identifier_pattern":
        return True
    parent = name.parent
    if parent is None:
        return False
    if parent.type in _DECLARING:
        return True
    field = _DECLARING_FIELDS.get(parent.type)
    return field is not None and parent.child_by_field_name(field) == name


@functools.lru_cache(maxsize=64)
def _words_pattern(words: tuple[str, ...]) -> re.Pattern[bytes] | None:
    """A pattern finding any of `words` (None for none), compiled once per list."""
    if not words:
        return None
    return re.compile(b"|".join(re.escape(_encode(word)) for word in words))


def _operand(node: tree_sitter.Node | None) -> tree_sitter.Node | None:
    """`node` without the parentheses around it, or the comma sequence whose value
    it is (`(0, x)` is `x`)."""
    while node is not None and node.type in ("parenthesized_expression", "sequence_expression"):
        inner = [child for child in node.named_children if not child.is_extra]
        node = inner[-1] if inner else None
    return node


def children(node: tree_sitter.Node) -> Iterator[tree_sitter.Node]:
    """`node`'s children one at a time. `node.children` makes them all in one call that
    holds the GIL throughout: tens of milliseconds of a stalled event loop for a program
    of many thousand statements, or a call with as many arguments."""
    cursor = node.walk()
    if not cursor.goto_first_child():
        return
    while True:
        child = cursor.node
        assert child is not None
        yield child
        if not cursor.goto_next_sibling():
            return


def _spans(places: list[int], start: int, end: int) -> bool:
    """Whether any of the sorted `places` falls within start..end (exclusive)."""
    at = bisect.bisect_left(places, start)
    return at < len(places) and places[at] < end


# --- The module -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PreparedModule:
    """Module text, how many lines precede the user's first line in it, and the static
    imports hoisted into its header."""

    text: str
    line_offset: int
    imports: tuple[str, ...] = ()
    # Where `return (` went in front of the final expression on a line of the
    # program's own (line, column of the expression, width), or None: the runtimes
    # move the columns of that line's frames back by it.
    column_shift: tuple[int, int, int] | None = None
    # Where `return (` went on a line before the final expression (line, column of
    # `return`; 0 for the header's line), and where the expression starts (line,
    # column), or None: V8 places an error the expression throws at that `return`, so
    # Deno's worker moves such a frame to the expression.
    return_site: tuple[int, int, int, int] | None = None

    def function_expression(self, *, asynchronous: bool = True, strict: bool = False) -> str:
        """The program as `(async function () { ... })`, line for line as in `text`,
        for a runtime with no module loader (so only for a program with no imports).

        With `asynchronous=False` it is a plain `(function () { ... })`, whose body
        runs as the async one would for a program that `may_await` says cannot await;
        its caller must then settle the function's value as an async function's would
        be. With `strict=True` its code is strict mode code, as a module's is.
        """
        if self.imports:
            raise ValueError("a program with import declarations needs a module loader")
        body = self.text.removeprefix(_FUNCTION_HEAD)
        head = _ASYNC_HEAD if asynchronous else _PLAIN_HEAD
        return f"({head}{_STRICT if strict else ''}{body})"


def may_await(code: str) -> bool:
    """Whether `code` may use `await`; when not, its body means the same in a plain
    function as in an async one.

    The two bodies differ only in `await` being reserved in the async one, so text
    that spells it neither plainly nor through a `\\u` escape (which could spell it
    in an identifier) parses and runs alike in both; only the function around it
    differs, for a program that inspects it (`arguments.callee`, a function's
    `caller`). Conservative: `await` in a comment or a string also counts.
    """
    return "await" in code or "\\u" in code


def prepare_module(code: str, dialect: Dialect = "typescript") -> PreparedModule:
    """Wrap `code` as `export default async function () { ... }`.

    Contract: top-level `return` and `await` work; the value of a final expression
    statement is returned; top-level static `import` declarations are hoisted out of the
    function (their lines blanked so line numbers stay); user line N is line
    N + line_offset of `text`.

    Also: a top-level `export` is dropped from the declaration it introduces (its
    columns blanked), `export default <expression>` becomes the statement
    `(<expression>)`, re-exports (`export { … }`, `export * from …`) are blanked, and a
    `#!` line is blanked. The header is always one line, so `line_offset` is 1.

    Never raises. A program with a syntax error has only the statements before the
    first one in error rewritten (their imports hoisted, their `export`s dropped), so
    that the runtime reports that error, at the user's line, rather than an import
    stranded in a function; its value is not returned. A program too large or too slow
    to parse (see `parse`) is wrapped unchanged.
    """
    return prepare_parsed(code, parse(code, dialect))


def prepare_parsed(code: str, syntax: Syntax | None) -> PreparedModule:
    """`prepare_module` for a program parsed already: `syntax` is what `parse` made of
    `code` (in the dialect its runtime reads), None if it could not parse it. Raises
    ValueError for a parse of another program."""
    if syntax is None:
        data = _encode(code)
    elif syntax.code == code:
        data = syntax._data
    else:
        raise ValueError("the parse given is of another program")
    edits = _shebang_edits(data)
    imports: list[str] = []
    head_end = ""
    shift = site = None
    if syntax is not None:
        planned, opens_on_head, returned_from = _plan(data, syntax._tree.root_node, imports)
        edits += planned
        head_end = _RETURN_OPEN if opens_on_head else ""
        shift = _column_shift(data, planned)
    header = "".join(f"{statement} " for statement in imports)
    if syntax is not None and shift is None and returned_from is not None:
        site = _return_site(data, planned, returned_from, _utf16_len(header + _FUNCTION_HEAD))
    body = _decode(_apply(data, edits))
    return PreparedModule(
        text=f"{header}{_FUNCTION_HEAD}{head_end}\n{body}\n}}\n",
        line_offset=_LINE_OFFSET,
        imports=tuple(imports),
        column_shift=shift,
        return_site=site,
    )


def _return_site(
    data: bytes, planned: list[_Edit], returned_from: int, head_columns: int
) -> tuple[int, int, int, int]:
    """`PreparedModule.return_site`: where the `return` written on a line before the
    final expression stands (the header's line is line 0), and where the expression
    starts, in the program's lines and the engines' UTF-16 columns."""
    at = _inserted_at(planned, b";" + _RETURN_OPEN.encode())
    if at is None:  # on the header's line, after the function's head
        keyword = (0, head_columns + 1)
    else:
        line, column = _engine_position(data, at)
        keyword = (line, column + 1)  # past the `;` that ends the statement before
    return (*keyword, *_engine_position(data, returned_from))


def _engine_position(data: bytes, at: int) -> tuple[int, int]:
    """The 1-based line and UTF-16 column of byte `at`, as the engines count them."""
    breaks = list(_ENGINE_LINE_BREAK.finditer(data, 0, at))
    line_start = breaks[-1].end() if breaks else 0
    return len(breaks) + 1, _utf16_len(data[line_start:at].decode("utf-8", "surrogatepass")) + 1


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _column_shift(data: bytes, planned: list[_Edit]) -> tuple[int, int, int] | None:
    """`PreparedModule.column_shift`: where `_returned` put `return (` right in front of
    the final expression (on its line, after the statement before it), in the lines and
    UTF-16 columns the engines count; None if it went on a line of its own."""
    at = _inserted_at(planned, _RETURN_OPEN.encode())
    if at is None:
        return None
    return (*_engine_position(data, at), len(_RETURN_OPEN))


def _inserted_at(planned: list[_Edit], text: bytes) -> int | None:
    """Where the edits insert `text`, if they do."""
    return next((start for start, end, new in planned if start == end and new == text), None)


# `inputs` is a global the worker sets, not a parameter: a program may then declare its
# own `inputs` without a redeclaration error.
_EXPORT_DEFAULT = "export default "
_ASYNC_HEAD = "async function () {"
_PLAIN_HEAD = "function () {"
_STRICT = '"use strict";'
_FUNCTION_HEAD = f"{_EXPORT_DEFAULT}{_ASYNC_HEAD}"
# What opens the final expression's value, returned (`_returned`).
_RETURN_OPEN = "return ("
# Hoisted imports share the header's line, so the program always starts on line 2.
_LINE_OFFSET = 1

# An edit of the program's UTF-8 bytes: replace data[start:end] with `text`.
_Edit = tuple[int, int, bytes]

# What a top-level statement becomes.
_KEPT, _GONE, _EXPRESSION, _EXPORTED_EXPRESSION = "kept", "gone", "expression", "exported"
# Gone, and blanked too: nothing of it is left in the body.
_BLANKED = "blanked"
# Expression statements that are declarations in disguise: TypeScript's `namespace N
# {}`, which the grammar reads as an expression.
_NOT_VALUES = frozenset(("internal_module",))
# TypeScript's statements that are types alone: no code, so no value either (the last
# value before them is the program's, as once their types are erased).
_TYPES_ALONE = frozenset(
    ("interface_declaration", "type_alias_declaration", "ambient_declaration", "function_signature")
)
# `using` declarations, newer than the grammar, which reads them as expressions.
_USING = re.compile(rb"(?:await[ \t]+)?using[ \t]+[\w$\\\x80-\xff]")
_LINE_BREAK = re.compile(r"[\n\r\u2028\u2029]")
_IMPORT_NOISE = re.compile(
    r"""('(?:[^'\\\n\r]|\\[\s\S])*'|"(?:[^"\\\n\r]|\\[\s\S])*")"""
    r"|//[^\n\r\u2028\u2029]*|/\*[\s\S]*?\*/|[\n\r\u2028\u2029]+"
)
_NOT_LINE_BREAK = re.compile(r"[^\n\r\u2028\u2029]")
# A backslash before a line break in a string: it adds nothing to the string's value,
# and on the header's one line it has no place.
_LINE_CONTINUATION = re.compile(r"\\(?:\r\n|[\n\r\u2028\u2029])")
# What a script may read as an HTML-like comment, and the nodes in which it is text.
_HTML_COMMENT_MARK = re.compile(rb"<!--|-->")
_TEXT_NODES = frozenset({"string", "template_string", "regex", "comment"})
# Line terminators as the engines count lines (CR LF is one).
_ENGINE_LINE_BREAK = re.compile(rb"\r\n|[\n\r]|\xe2\x80[\xa8\xa9]")
# The same line breaks in UTF-8.
_LINE_BREAK_BYTES = re.compile(rb"[\n\r]|\xe2\x80[\xa8\xa9]")


def _plan(
    data: bytes, root: tree_sitter.Node, imports: list[str]
) -> tuple[list[_Edit], bool, int | None]:
    """The edits to the program's top-level statements, whether the returned value's
    parenthesis opens on the header's line (see `_returned`), and where the returned
    expression starts (a byte offset; None if nothing is returned); hoisted imports go
    to `imports`.

    Statements from the first one in error on are left alone: what the parser made of
    them is a guess of its error recovery.
    """
    edits: list[_Edit] = []
    last: tuple[tree_sitter.Node, str] | None = None
    before_last: tree_sitter.Node | None = None
    previous: tree_sitter.Node | None = None
    for statement in children(root):
        if statement.has_error:
            return edits, False, None
        if statement.is_extra or statement.type == "hash_bang_line":
            continue
        shape = _plan_statement(data, statement, imports, edits)
        if shape not in (_GONE, _BLANKED):
            last, before_last = (statement, shape), previous
        if shape != _BLANKED:
            previous = statement
    if last is None:
        return edits, False, None
    # A script (the wasm-js guest evaluates the program as one) reads `<!--` and a
    # line's leading `-->` as comments to the end of the line, where the grammar reads
    # operators: with either in the code, nothing is written on a line before.
    inline = _html_comment_marks(data, root)
    returned, on_head = _returned(*last, before_last, inline=inline)
    expression = _expression(last[0]) if returned else None
    return edits + returned, on_head, None if expression is None else expression.start_byte


def _html_comment_marks(data: bytes, root: tree_sitter.Node) -> bool:
    """Whether `<!--` or `-->` stands in the program's code (not in a string, template,
    regular expression or comment: there it is text, whatever the type around it, so a
    TypeScript program and its erasure are planned alike)."""
    for mark in _HTML_COMMENT_MARK.finditer(data):
        node: tree_sitter.Node | None = root.descendant_for_byte_range(mark.start(), mark.end())
        while node is not None and node.type not in _TEXT_NODES:
            node = node.parent
        if node is None:
            return True
    return False


def _plan_statement(
    data: bytes, statement: tree_sitter.Node, imports: list[str], edits: list[_Edit]
) -> str:
    kind = statement.type
    if kind == "empty_statement" or kind in _TYPES_ALONE:
        return _GONE  # no value to return
    if kind == "import_statement":
        text = _decode(data[statement.start_byte : statement.end_byte])
        imports.append(_single_line(text))
        edits.append(_blank(data, statement.start_byte, statement.end_byte))
        return _BLANKED
    if kind == "export_statement":
        return _plan_export(data, statement, edits)
    if kind == "expression_statement":
        expression = _expression(statement)
        if expression is None:
            return _KEPT
        if _is_export_alone(data, statement, expression):
            # `export` ending its line, read as a name: the declaration that follows
            # is what it exports.
            edits.append((expression.start_byte, expression.end_byte, b"      "))
            return _BLANKED
        if expression.type in _NOT_VALUES or _USING.match(data, statement.start_byte):
            return _KEPT
        if data.startswith(b"{", statement.start_byte):
            return _KEPT  # a block to JavaScript (`{a: 1}`), whatever the grammar says
        return _EXPRESSION
    return _KEPT


def _expression(statement: tree_sitter.Node) -> tree_sitter.Node | None:
    """The expression of an expression statement (comments inside it are children too)."""
    return next((child for child in statement.named_children if not child.is_extra), None)


def _is_export_alone(
    data: bytes, statement: tree_sitter.Node, expression: tree_sitter.Node
) -> bool:
    return (
        expression.type == "identifier"
        and all(child == expression or child.is_extra for child in statement.children)
        and data[expression.start_byte : expression.end_byte] == b"export"
    )


def _plan_export(data: bytes, statement: tree_sitter.Node, edits: list[_Edit]) -> str:
    """Edit a top-level `export` statement; return what it became."""
    export = next((child for child in statement.children if child.type == "export"), None)
    default = next((child for child in statement.children if child.type == "default"), None)
    target = statement.child_by_field_name("declaration") or statement.child_by_field_name("value")
    if export is None:
        return _KEPT
    if target is None:
        # Re-exports, `export =` and `export as namespace` mean nothing in a function.
        edits.append(_blank(data, export.start_byte, statement.end_byte))
        return _BLANKED
    if default is None:
        # Blank the keyword alone, so the declaration keeps its columns.
        edits.append(
            (export.start_byte, export.end_byte, b" " * (export.end_byte - export.start_byte))
        )
        return _GONE if target.type in _TYPES_ALONE else _KEPT
    # The words go with the space after them, unless that holds a line break.
    words_end = target.start_byte
    if _LINE_BREAK.search(_decode(data[default.end_byte : target.start_byte])):
        words_end = default.end_byte
    if statement.child_by_field_name("declaration") is not None:
        edits.append((export.start_byte, words_end, b""))
        return _KEPT
    # Anything else is an expression (an anonymous function or class included), and
    # in parentheses it is an expression statement.
    edits.append((export.start_byte, words_end, b"("))
    edits.append((target.end_byte, target.end_byte, b")"))
    return _EXPORTED_EXPRESSION


def _returned(
    statement: tree_sitter.Node,
    shape: str,
    previous: tree_sitter.Node | None,
    *,
    inline: bool = False,
) -> tuple[list[_Edit], bool]:
    """The edits that make the final statement return its value, if it has one, and
    whether `return (` goes at the end of the header's line.

    So that the expression keeps its columns (an error in it points at the program's
    own text), `return (` opens on an earlier line when one ends the statement before
    (after it, with a `;` to end that statement where it ended) or, with no statement
    before, on the header's line; only an expression that starts on the line where
    the statement before it ends is moved along by it, as is every one when `inline`.
    """
    if shape == _EXPORTED_EXPRESSION:  # already `(<expression>)`
        return [(statement.start_byte, statement.start_byte, b"return ")], False
    expression = _expression(statement)
    if shape != _EXPRESSION or expression is None:
        return [], False
    close = (expression.end_byte, expression.end_byte, b")")
    opening = _RETURN_OPEN.encode()
    if not inline:
        if previous is None:
            return [close], True
        end = _last_token(previous)
        if end.end_point.row < expression.start_point.row:
            return [(end.end_byte, end.end_byte, b";" + opening), close], False
    return [(expression.start_byte, expression.start_byte, opening), close], False


def _last_token(node: tree_sitter.Node) -> tree_sitter.Node:
    """The last token of `node`'s code: not a comment after it, nor the empty semicolon
    the grammar puts where a line break ends a statement (after any comment there)."""
    while True:
        last = next(
            (
                child
                for child in reversed(node.children)
                if not child.is_extra and child.end_byte > child.start_byte
            ),
            None,
        )
        if last is None:
            return node
        node = last


def _single_line(statement: str) -> str:
    """An import declaration on one line: comments dropped, line breaks made spaces."""
    flat = _IMPORT_NOISE.sub(
        lambda found: _LINE_CONTINUATION.sub("", found[1]) if found[1] else " ", statement
    ).strip()
    return flat if flat.endswith(";") else f"{flat};"


def _blank(data: bytes, start: int, end: int) -> _Edit:
    """Blank data[start:end] but keep its line breaks, so later lines keep their numbers.

    Spaces keep the columns of code that follows on the same line; when nothing does,
    the line is left empty.
    """
    line_end = _LINE_BREAK_BYTES.search(data, end)
    followed = _decode(data[end : line_end.start() if line_end else len(data)]).strip()
    segment = _decode(data[start:end])
    return start, end, _encode(_NOT_LINE_BREAK.sub(" " if followed else "", segment))


def _shebang_edits(data: bytes) -> list[_Edit]:
    """Blank a `#!` line: valid at the start of a module, a syntax error in a function."""
    if not data.startswith(b"#!"):
        return []
    found = _LINE_BREAK_BYTES.search(data)
    return [(0, found.start() if found else len(data), b"")]


def _apply(data: bytes, edits: list[_Edit]) -> bytes:
    """`data` with `edits` applied; an insertion sorts before a replacement at its offset."""
    if not edits:
        return data
    pieces: list[bytes] = []
    pos = 0
    for start, end, replacement in sorted(edits, key=lambda edit: (edit[0], edit[1])):
        pieces.append(data[pos:start])
        pieces.append(replacement)
        pos = max(pos, end)
    pieces.append(data[pos:])
    return b"".join(pieces)
