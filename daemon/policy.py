"""The pre-execution policy: configurable checks on a program's text before it runs.

A filter in front of the sandbox, never a substitute for it. It refuses programs that
plainly state an intent the operator has ruled out (`import js` on Pyodide, `Deno.env`,
a 5,000-line blob), with the rule and the line, before a slot or a sandbox is spent.
Any check of source text is bypassed by a program that builds what it wants at run
time (`getattr(__builtins__, "ev" + "al")`, `globalThis["De" + "no"]`); the sandbox is
what stops that. docs/security.md says so to operators.

```
Policy.check(language, executor, code, syntax) -> Violation | None
├── shape: lines, line length, bracket nesting      every language; string work
├── Python: modules, names, builtins                the host's `ast`, one walk
└── JavaScript/TypeScript: imports, globals         js_syntax's parse: never strings,
                                                    comments, properties or keys
```

Rules are read only when a program could trip them: a rule set whose words appear
nowhere in the text decides without parsing it, so the common case costs a regex
search. A program the rules cannot read (a syntax error, or syntax newer than the
host's Python) is not refused unless `refuse_unparsable` is set: it runs, and its
sandbox reports the program's own error.

A JavaScript or TypeScript program's parse is the request's (`SyntaxMemo`): read from
there if the registry made it, and left there for the executor if the policy makes it.

Pure but for that memo: no I/O, no clock, no Trio; safe to call from a worker thread.
It knows nothing of executions, events or the wire beyond `Violation.to_wire`.
"""

from __future__ import annotations

import ast
import bisect
import fnmatch
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from conduit.daemon.config import JavaScriptPolicy, PolicyConfig, PythonPolicy
from conduit.executors.js_syntax import Dialect, MentionKind, Syntax
from conduit.executors.syntax_memo import SyntaxMemo

__all__ = ["Policy", "Violation"]

# The offending line as shown in a refusal: enough to recognise it, never a whole blob.
SNIPPET_CHARS = 160


@dataclass(frozen=True, slots=True)
class Violation:
    """Why the policy refused a program: a stable rule id, what to do, and where.

    `line` and `column` count from 1 (columns in characters); either is None when the
    rule is about the whole program. `snippet` is that line, trimmed.
    """

    rule: str
    message: str
    line: int | None = None
    column: int | None = None
    snippet: str = ""

    def describe(self) -> str:
        """The message with its place, as a person reads it."""
        if self.line is None:
            return self.message
        column = f", column {self.column}" if self.column is not None else ""
        return f"line {self.line}{column}: {self.message}"

    def to_wire(self) -> dict[str, Any]:
        """The rule and place, for the result's `error` object and events."""
        return {
            "rule": self.rule,
            "line": self.line,
            "column": self.column,
            "snippet": self.snippet,
        }


class Policy:
    """The configured checks, compiled once per configuration; `check` is the way in."""

    def __init__(self, config: PolicyConfig) -> None:
        self._config = config
        self._readers: dict[tuple[str, str], _Reader | None] = {}

    def __repr__(self) -> str:
        state = "enabled" if self._config.enabled else "disabled"
        return f"<Policy {state}, {len(self._readers)} rule sets compiled>"

    def check(
        self, language: str, executor: str, code: str, syntax: SyntaxMemo | None = None
    ) -> Violation | None:
        """The first violation in `code` (by place), or None if the policy allows it.

        `language` is python, typescript or javascript; `executor` the executor's name
        (`wasm-python`, `pyodide`, ...), whose rules add to the language's; `syntax` the
        request's memo of the program's parse. Never raises for any text: what cannot be
        read is allowed, or refused as `<language>.syntax` when `refuse_unparsable` is set.
        """
        if not self._config.enabled:
            return None
        found = _shape(code, self._config)
        if found is not None:
            return found
        reader = self._reader(language, executor)
        if reader is None:
            return None
        return reader.find(code, SyntaxMemo() if syntax is None else syntax)

    def reads(self, language: str, executor: str) -> bool:
        """Whether checking a program for this pair may parse it (costing time in
        proportion to its size), rather than only measuring it."""
        return self._config.enabled and self._reader(language, executor) is not None

    def _reader(self, language: str, executor: str) -> _Reader | None:
        # Compiled on first use; two threads compiling the same pair at once is harmless.
        key = (language, executor)
        if key not in self._readers:
            self._readers[key] = _build_reader(self._config, language, executor)
        return self._readers[key]


# --- Places -----------------------------------------------------------------------------


def _line_text(code: str, line: int) -> str:
    """Line `line` (from 1) of `code`, without its line break."""
    start = 0
    for _ in range(line - 1):
        start = code.find("\n", start) + 1
        if start == 0:
            return ""
    end = code.find("\n", start)
    return code[start : end if end >= 0 else len(code)].rstrip("\r")


def _snippet(text: str) -> str:
    stripped = text.strip()
    if len(stripped) <= SNIPPET_CHARS:
        return stripped
    return stripped[: SNIPPET_CHARS - 1] + "…"


def _at(code: str, rule: str, message: str, line: int, column: int | None) -> Violation:
    return Violation(rule, message, line, column, _snippet(_line_text(code, line)))


# Line terminators: JavaScript's, and (once `\r\n` and `\r` are made `\n`) Python's.
_JAVASCRIPT_LINE_BREAKS = re.compile(r"\r\n|[\n\r\u2028\u2029]")
_NEWLINE = re.compile(r"\n")


def _at_offset(
    code: str, rule: str, message: str, offset: int, breaks: re.Pattern[str] = _NEWLINE
) -> Violation:
    """A violation at a character offset, its line and column counted by `breaks`."""
    line, line_start = 1, 0
    for found in breaks.finditer(code, 0, offset):
        line, line_start = line + 1, found.end()
    line_end = breaks.search(code, offset)
    text = code[line_start : line_end.start() if line_end else len(code)]
    return Violation(rule, message, line, offset - line_start + 1, _snippet(text))


def _python_lines(code: str) -> str:
    """`code` with its line breaks as Python counts them (`\r\n`, `\r`) made `\n`."""
    return code.replace("\r\n", "\n").replace("\r", "\n") if "\r" in code else code


# --- Shape ------------------------------------------------------------------------------


def _shape(code: str, config: PolicyConfig) -> Violation | None:
    """Lines and line length: plain string work, for every language."""
    if config.max_lines:
        lines = code.count("\n") + (0 if code.endswith("\n") else 1)
        if lines > config.max_lines:
            message = (
                f"the program has {lines} lines and the policy allows {config.max_lines} "
                "(policy.max_lines); send a shorter program"
            )
            return _at(code, "shape.max_lines", message, config.max_lines + 1, None)
    limit = config.max_line_chars
    if limit and len(code) > limit:
        for number, text in enumerate(code.split("\n"), 1):
            length = len(text.rstrip("\r"))
            if length > limit:
                message = (
                    f"the line is {length} characters long and the policy allows {limit} "
                    "(policy.max_line_chars); break it up, or pass data in `inputs`"
                )
                return _at(code, "shape.max_line_chars", message, number, limit + 1)
    return None


def _too_deep(
    code: str, depth: int, limit: int, offset: int, breaks: re.Pattern[str] = _NEWLINE
) -> Violation:
    message = (
        f"brackets nest {depth} deep here and the policy allows {limit} "
        "(policy.max_nesting_depth); flatten the code"
    )
    return _at_offset(code, "shape.max_nesting_depth", message, offset, breaks)


def _unparsable(code: str, language: str, reason: str, line: int | None) -> Violation:
    message = (
        f"the policy cannot read the program ({reason}) and refuses what it cannot read "
        "(policy.refuse_unparsable); fix the syntax"
    )
    if line is None:
        return Violation(f"{language}.syntax", message)
    return _at(code, f"{language}.syntax", message, line, None)


# --- Readers ----------------------------------------------------------------------------


class _Reader(Protocol):
    """One language's rules for one executor, compiled. `empty`: it has none. `find`
    reads a JavaScript or TypeScript program's parse from `syntax`."""

    empty: bool

    def find(self, code: str, syntax: SyntaxMemo) -> Violation | None: ...


def _origins(sections: Iterable[tuple[str, tuple[str, ...]]]) -> dict[str, str]:
    """Each forbidden item and the config key that forbids it (the first one wins)."""
    origins: dict[str, str] = {}
    for key, items in sections:
        for item in items:
            origins.setdefault(item, key)
    return origins


def _build_reader(config: PolicyConfig, language: str, executor: str) -> _Reader | None:
    section = executor.replace("-", "_")
    own = getattr(config.executors, section, None)
    if language == "python":
        rules = [("policy.python", config.python)]
        if isinstance(own, PythonPolicy):
            rules.append((f"policy.executors.{section}", own))
        reader: _Reader = _PythonReader(config, rules)
    elif language in ("typescript", "javascript"):
        js_rules = [("policy.javascript", config.javascript)]
        if isinstance(own, JavaScriptPolicy):
            js_rules.append((f"policy.executors.{section}", own))
        dialect: Dialect = "javascript" if language == "javascript" else "typescript"
        reader = _JavaScriptReader(config, js_rules, dialect)
    else:
        return None
    return None if reader.empty else reader


class _Words:
    """A quick test of whether text mentions any of some identifiers as whole words."""

    def __init__(self, words: Iterable[str]) -> None:
        self.words = tuple(sorted(set(words), key=lambda word: (-len(word), word)))
        alternatives = "|".join(re.escape(word) for word in self.words)
        self.pattern = re.compile(rf"(?<![\w$])(?:{alternatives})(?![\w$])")

    def __bool__(self) -> bool:
        return bool(self.words)

    def mentioned(self, text: str) -> bool:
        # A substring search in C rules most programs out before the regex runs.
        if not any(word in text for word in self.words):
            return False
        return self.pattern.search(text) is not None


# --- Python -----------------------------------------------------------------------------

# Calls that import the module their first argument names.
_IMPORT_CALLS = frozenset(("__import__", "import_module"))
# Calls that reach an attribute their second argument names.
_ATTRIBUTE_CALLS = frozenset(("getattr", "setattr", "hasattr", "delattr"))
# Names under which a program reaches the builtins module itself.
_BUILTINS_MODULES = frozenset(("builtins", "__builtins__"))

# Strings (prefixes are skipped as plain text), comments, and brackets: what Python's
# bracket nesting is measured from. An unterminated string runs to the end of its line
# (or of the text, if triple-quoted), so that no character is ever read twice.
_PYTHON_BRACKETS = re.compile(
    r"""'''(?:[^'\\]|\\[\s\S]|'(?!''))*+(?:'''|\Z)"""
    r"""|\"\"\"(?:[^"\\]|\\[\s\S]|"(?!""))*+(?:\"\"\"|\Z)"""
    r"""|'(?:[^'\\\n]|\\[\s\S])*+(?:'|(?=\n)|\Z)"""
    r"""|"(?:[^"\\\n]|\\[\s\S])*+(?:"|(?=\n)|\Z)"""
    r"""|\#[^\n]*+|[()\[\]{}]"""
)


def _python_depth(code: str, limit: int) -> tuple[int, int] | None:
    """The first bracket opening deeper than `limit`, as (depth, offset), or None."""
    depth = 0
    for found in _PYTHON_BRACKETS.finditer(code):
        char = found[0]
        if char in "([{":
            depth += 1
            if depth > limit:
                return depth, found.start()
        elif char in ")]}":
            depth = max(depth - 1, 0)
    return None


# Where (line, UTF-8 byte column, as `ast` counts), the rule broken, and the message.
_Finding = tuple[int, int, str, str]


class _PythonReader:
    """Forbidden modules, names and builtins, found in the syntax tree."""

    def __init__(self, config: PolicyConfig, sections: list[tuple[str, PythonPolicy]]) -> None:
        self._modules = _origins(
            (f"{k}.forbidden_modules", s.forbidden_modules) for k, s in sections
        )
        self._names = _origins((f"{k}.forbidden_names", s.forbidden_names) for k, s in sections)
        self._builtins = _origins(
            (f"{k}.forbidden_builtins", s.forbidden_builtins) for k, s in sections
        )
        self._max_depth = config.max_nesting_depth
        self._refuse_unparsable = config.refuse_unparsable
        # The tree can hold a forbidden item only if the text holds one of these words
        # (literal arguments to these calls may be spelled with escapes or split in two).
        words = {module.split(".")[0] for module in self._modules}
        words |= self._names.keys() | self._builtins.keys()
        if self._modules:
            words |= _IMPORT_CALLS
        if self._names or self._builtins:
            words |= _ATTRIBUTE_CALLS
        self._words = _Words(words)
        self.empty = not self._words and not self._max_depth

    def find(self, code: str, syntax: SyntaxMemo) -> Violation | None:
        # Lines as the parser numbers them, so that the lines where words are found
        # and the tree's line numbers agree.
        code = _python_lines(code)
        if self._max_depth:
            deep = _python_depth(code, self._max_depth)
            if deep is not None:
                return _too_deep(code, deep[0], self._max_depth, deep[1])
        # Python reads identifiers in NFKC form: `eval` in fullwidth letters is `eval`.
        text = code if code.isascii() else unicodedata.normalize("NFKC", code)
        if not self._words or not self._words.mentioned(text):
            return None
        try:
            tree = ast.parse(code)
        except SyntaxError as exc:
            if not self._refuse_unparsable:
                return None
            return _unparsable(code, "python", exc.msg, exc.lineno)
        except (ValueError, RecursionError, MemoryError) as exc:
            # Null bytes (3.11's ValueError) and nesting too deep for the host's parser.
            if not self._refuse_unparsable:
                return None
            return _unparsable(code, "python", str(exc) or type(exc).__name__, None)
        return self._first(code, self._findings(tree, self._lines_mentioning(text)))

    def _lines_mentioning(self, text: str) -> list[int]:
        """The lines (from 1, in order) where the words are, counted in one pass."""
        lines: list[int] = []
        line, counted = 1, 0
        for found in self._words.pattern.finditer(text):
            line += text.count("\n", counted, found.start())
            counted = found.start()
            if not lines or lines[-1] != line:
                lines.append(line)
        return lines

    def _first(self, code: str, findings: Iterator[_Finding]) -> Violation | None:
        best = min(findings, default=None)
        if best is None:
            return None
        line, byte_column, rule, message = best
        column = _character_column(_line_text(code, line), byte_column)
        return _at(code, rule, message, line, column)

    def _findings(self, tree: ast.AST, lines: list[int]) -> Iterator[_Finding]:
        """What the nodes break, visiting only statements and expressions that span
        one of `lines` (where the words are): nothing elsewhere can break a rule."""
        visitors: dict[type[ast.AST], Callable[[Any], Iterator[_Finding]]] = {
            ast.Name: self._name_node,
            ast.Attribute: self._attribute,
            ast.Call: self._call,
            ast.Subscript: self._subscript,
            ast.Import: self._import,
            ast.ImportFrom: self._import_from,
        }
        pending = [tree]
        while pending:
            node = pending.pop()
            visit = visitors.get(type(node))
            if visit is not None:
                yield from visit(node)
            for child in ast.iter_child_nodes(node):
                if _may_span(child, lines):
                    pending.append(child)

    def _name_node(self, node: ast.Name) -> Iterator[_Finding]:
        if node.id in self._names:
            yield *_place(node), *self._name(node.id)
        if node.id in self._builtins:
            yield *_place(node), *self._builtin(node.id)

    def _attribute(self, node: ast.Attribute) -> Iterator[_Finding]:
        # Point at the attribute's own name, which ends where the node does.
        line = node.end_lineno or node.lineno
        place = (line, (node.end_col_offset or 0) - len(node.attr.encode()))
        if node.attr in self._names:
            yield *place, *self._name(node.attr)
        if node.attr in self._builtins and _is_builtins(node.value):
            yield *place, *self._builtin(node.attr)

    def _subscript(self, node: ast.Subscript) -> Iterator[_Finding]:
        key = _literal(node.slice)
        if key in self._builtins and _is_builtins(node.value):
            yield *_place(node), *self._builtin(key)

    def _import(self, node: ast.Import) -> Iterator[_Finding]:
        for alias in node.names:
            found = self._module(alias.name)
            if found is not None:
                yield *_place(node), *found

    def _import_from(self, node: ast.ImportFrom) -> Iterator[_Finding]:
        if node.level or not node.module:  # the program's own modules: there are none
            return
        module = node.module
        for alias in node.names:
            found = self._module(f"{module}.{alias.name}")
            if found is not None:
                yield *_place(node), *found
            if alias.name in self._names:
                yield *_place(node), *self._name(alias.name)
            if module in _BUILTINS_MODULES and alias.name in self._builtins:
                yield *_place(node), *self._builtin(alias.name)

    def _call(self, node: ast.Call) -> Iterator[_Finding]:
        function = node.func
        called = (
            function.id
            if isinstance(function, ast.Name)
            else function.attr
            if isinstance(function, ast.Attribute)
            else None
        )
        first = _literal(node.args[0]) if node.args else None
        if called in _IMPORT_CALLS and first is not None:
            found = self._module(first)
            if found is not None:
                yield *_place(node), *found
        elif called in _ATTRIBUTE_CALLS and len(node.args) >= 2:
            attribute = _literal(node.args[1])
            if attribute in self._names:
                yield *_place(node), *self._name(attribute)
            if attribute in self._builtins and _is_builtins(node.args[0]):
                yield *_place(node), *self._builtin(attribute)

    def _module(self, name: str) -> tuple[str, str] | None:
        parts = name.split(".")
        for end in range(1, len(parts) + 1):
            forbidden = ".".join(parts[:end])
            key = self._modules.get(forbidden)
            if key is not None:
                return "python.forbidden_import", (
                    f"importing {name} is forbidden by the policy ({key} has {forbidden}); "
                    "remove the import"
                )
        return None

    def _name(self, name: str) -> tuple[str, str]:
        return "python.forbidden_name", (
            f"the name {name} is forbidden by the policy ({self._names[name]}); do without it"
        )

    def _builtin(self, name: str) -> tuple[str, str]:
        return "python.forbidden_builtin", (
            f"the builtin {name} is forbidden by the policy ({self._builtins[name]}); do without it"
        )


def _may_span(node: ast.AST, lines: list[int]) -> bool:
    """Whether `node` (or what it holds) may be on one of the sorted `lines`."""
    first = getattr(node, "lineno", None)
    if first is None:  # `arguments`, `comprehension`, ...: no place of their own
        return True
    last = getattr(node, "end_lineno", None) or first
    # A definition's place starts at `def`/`class`, below its decorators.
    decorators = getattr(node, "decorator_list", None)
    if decorators:
        first = min(first, decorators[0].lineno)
    return _spans(lines, first, last)


def _spans(places: list[int], first: int, last: int) -> bool:
    """Whether any of the sorted `places` (lines, offsets) falls within first..last."""
    at = bisect.bisect_left(places, first)
    return at < len(places) and places[at] <= last


def _place(node: ast.AST) -> tuple[int, int]:
    return getattr(node, "lineno", 1), getattr(node, "col_offset", 0)


def _character_column(line: str, byte_offset: int) -> int:
    """The 1-based character column of a UTF-8 byte offset into `line` (as `ast` gives)."""
    return len(line.encode()[:byte_offset].decode(errors="ignore")) + 1


def _literal(node: ast.AST) -> str | None:
    """The value of a string constant, else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _is_builtins(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in _BUILTINS_MODULES


# --- JavaScript and TypeScript ----------------------------------------------------------


class _JavaScriptReader:
    """Forbidden module specifiers and globals, found in the syntax tree."""

    def __init__(
        self,
        config: PolicyConfig,
        sections: list[tuple[str, JavaScriptPolicy]],
        dialect: Dialect,
    ) -> None:
        patterns = _origins((f"{k}.forbidden_imports", s.forbidden_imports) for k, s in sections)
        self._imports = [
            (re.compile(fnmatch.translate(pattern)), pattern, key)
            for pattern, key in patterns.items()
        ]
        self._globals = _origins(
            (f"{k}.forbidden_globals", s.forbidden_globals) for k, s in sections
        )
        self._dialect: Dialect = dialect
        self._max_depth = config.max_nesting_depth
        self._refuse_unparsable = config.refuse_unparsable
        words = set(self._globals)
        if self._imports:
            words |= {"import", "export", "require"}
        self._words = _Words(words)
        self.empty = not self._words and not self._max_depth

    def find(self, code: str, syntax: SyntaxMemo) -> Violation | None:
        # An identifier spelled with escapes (`\u0044eno`) is still the identifier.
        triggered = bool(self._words) and ("\\u" in code or self._words.mentioned(code))
        if not (triggered or self._max_depth):
            return None
        parsed = syntax.parse(code, self._dialect)
        if parsed is None:
            return self._unreadable(code)
        if self._max_depth:
            # A program with syntax errors still has its brackets.
            deep = parsed.deepest(self._max_depth)
            if deep is not None:
                depth, offset = deep
                return _too_deep(code, depth, self._max_depth, offset, _JAVASCRIPT_LINE_BREAKS)
        # Text the grammar cannot read whole (a typo, or syntax newer than the grammar
        # that the runtime may still accept) is still searched in what it could read:
        # a forbidden word there is refused either way.
        refused = self._forbidden(code, parsed) if triggered else None
        if refused is None and not parsed.complete:
            return self._unreadable(code)
        return refused

    def _forbidden(self, code: str, syntax: Syntax) -> Violation | None:
        found: list[tuple[int, str, str]] = []
        for mention in syntax.mentions(self._words.words):
            if mention.kind is MentionKind.SPECIFIER:
                refused = self._specifier(mention.value)
            elif mention.kind is not MentionKind.METHOD_CALL and mention.value in self._globals:
                refused = self._global(mention.value)
            else:
                refused = None
            if refused is not None:
                found.append((mention.offset, *refused))
        if not found:
            return None
        offset, rule, message = min(found)
        return _at_offset(code, rule, message, offset, _JAVASCRIPT_LINE_BREAKS)

    def _unreadable(self, code: str) -> Violation | None:
        """A program the parser could not read runs (its runtime reports the syntax
        error), unless the policy refuses what it cannot read."""
        if not self._refuse_unparsable:
            return None
        return _unparsable(code, "javascript", "not JavaScript the parser can read", None)

    def _specifier(self, specifier: str) -> tuple[str, str] | None:
        for compiled, pattern, key in self._imports:
            if compiled.match(specifier):
                return "javascript.forbidden_import", (
                    f"importing {specifier!r} is forbidden by the policy ({key} has "
                    f"{pattern!r}); remove the import"
                )
        return None

    def _global(self, name: str) -> tuple[str, str]:
        return "javascript.forbidden_global", (
            f"the global {name} is forbidden by the policy ({self._globals[name]}); do without it"
        )
