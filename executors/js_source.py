"""Turn a JavaScript/TypeScript program into a module whose default export runs it.

A program arrives as script-like text: top-level `await` and `return`, static imports
anywhere at top level, and a last expression whose value is the result (as in a REPL or
a notebook cell). `prepare_module` turns it into an ES module for Deno whose default
export is an async function running the program:

    import … ; export default async function () {    <- line 1: the header
    <the program, line for line>                           <- user line N is N + 1
    }

What this module knows is lexical: tokens (strings, template literals with nested
substitutions, comments, regular expression literals), bracket nesting, and where
top-level statements end, including automatic semicolon insertion. It does not parse
expressions or types and never validates the program: anything it cannot tokenize is
wrapped unchanged and left for Deno to report, at the right line. Its rewrites are
chosen so that a misjudgement costs the program its return value (`undefined`), never
its meaning: when a statement's shape is in doubt, it is not rewritten.

It deliberately knows nothing about Deno, permissions, or how the module is loaded.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "PreparedModule",
    "Token",
    "TokenGroup",
    "may_await",
    "prepare_module",
    "token_groups",
]


@dataclass(frozen=True, slots=True)
class PreparedModule:
    """Module text, how many lines precede the user's first line in it, and the static
    imports hoisted into its header."""

    text: str
    line_offset: int
    imports: tuple[str, ...] = ()

    def function_expression(self, *, asynchronous: bool = True) -> str:
        """The program as `(async function () { ... })`, line for line as in `text`,
        for a runtime with no module loader (so only for a program with no imports).

        With `asynchronous=False` it is a plain `(function () { ... })`, whose body
        runs as the async one would for a program that `may_await` says cannot await;
        its caller must then settle the function's value as an async function's would
        be.
        """
        if self.imports:
            raise ValueError("a program with import declarations needs a module loader")
        body = self.text.removeprefix(_FUNCTION_HEAD)
        return f"({_ASYNC_HEAD if asynchronous else _PLAIN_HEAD}{body})"


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


def prepare_module(code: str) -> PreparedModule:
    """Wrap `code` as `export default async function () { ... }`.

    Contract: top-level `return` and `await` work; the value of a final bare expression
    statement is returned; top-level static `import` declarations are hoisted out of the
    function (their lines blanked so line numbers stay); user line N is line
    N + line_offset of `text`.

    Also: a top-level `export` is dropped from the declaration it introduces (its
    columns blanked), `export default <expression>` becomes the statement
    `(<expression>)`, re-exports (`export { … }`, `export * from …`) are blanked, and a
    `#!` line is blanked. The header is always one line, so `line_offset` is 1.

    Never raises: text it cannot tokenize (unterminated strings, unbalanced brackets,
    JSX) is wrapped unchanged, so the syntax error Deno reports points at the user's line.
    Runs in time linear in the length of `code`.
    """
    edits = _shebang_edits(code)
    try:
        imports, planned = _plan(code)
    except (_UntokenizableError, RecursionError):
        imports, planned = [], []
    header = "".join(f"{statement} " for statement in imports)
    body = _apply(code, edits + planned)
    return PreparedModule(
        text=f"{header}{_FUNCTION_HEAD}\n{body}\n}}\n",
        line_offset=_LINE_OFFSET,
        imports=tuple(imports),
    )


# `inputs` is a global the worker sets, not a parameter: a program may then declare its
# own `inputs` without a redeclaration error.
_EXPORT_DEFAULT = "export default "
_ASYNC_HEAD = "async function () {"
_PLAIN_HEAD = "function () {"
_FUNCTION_HEAD = f"{_EXPORT_DEFAULT}{_ASYNC_HEAD}"
# Hoisted imports share the header's line, so the program always starts on line 2.
_LINE_OFFSET = 1


class _UntokenizableError(Exception):
    """The text is not lexically valid JavaScript as far as this module can tell."""


def _words(words: str) -> frozenset[str]:
    return frozenset(words.split())


# --- Lexical patterns -------------------------------------------------------------------
#
# Speed comes from letting the regex engine do the walking. Most of a program is
# skipped without producing tokens: `_scan` walks the top level with one pattern that
# swallows whole bracketed groups, strings, comments and template literals, and
# `_skip_nested` walks groups too deep or too ambiguous for that pattern. Tokens are
# produced only for the statements that need reading (see `_plan`).

_LINE_BREAK = r"[\n\r\u2028\u2029]"
_LINE_TERMINATOR = re.compile(_LINE_BREAK)
_SINGLE_QUOTED = r"'(?:[^'\\\n\r]++|\\(?:\r\n|[\s\S]))*+'"
_DOUBLE_QUOTED = r'"(?:[^"\\\n\r]++|\\(?:\r\n|[\s\S]))*+"'
_STRING = f"{_SINGLE_QUOTED}|{_DOUBLE_QUOTED}"
_REGEX_BODY = (
    r"(?![*/])(?:[^/\\\[\n\r\u2028\u2029]++|\\[^\n\r\u2028\u2029]"
    r"|\[(?:[^\]\\\n\r\u2028\u2029]++|\\[^\n\r\u2028\u2029])*+\])++/[\w$]*+"
)
_REGEX_LITERAL = re.compile(f"/{_REGEX_BODY}")
# The rest of a template literal after its opening backtick or after a substitution's
# closing brace: up to the closing backtick, or to the next `${`.
_TEMPLATE_TEXT = r"(?:[^`\\$]++|\\[\s\S]|\$(?!\{))"
_TEMPLATE_REST = re.compile(rf"{_TEMPLATE_TEXT}*+(?:(?P<done>`)|\$\{{)")

# After these words a `/` starts a regular expression; after any other word it divides.
_REGEX_AFTER_WORDS = "return typeof instanceof in of new delete void throw case do else yield await"
_KEYWORDS_BEFORE_EXPRESSION = _words(_REGEX_AFTER_WORDS)
# A line starting with one of these always starts a new statement (anything else would
# be a syntax error), whatever ended the previous line.
_STATEMENT_KEYWORDS = _words(
    """const let var if for while do return throw try switch break continue debugger
    export with interface enum"""
)


def _not_after(texts: list[str], prefix: str = "") -> str:
    """Lookbehinds refusing a position right after any of `texts` (literal strings),
    each preceded by the zero-width `prefix` (such as `\\b`)."""
    by_width: dict[int, list[str]] = {}
    for text in texts:
        by_width.setdefault(len(text), []).append(prefix + re.escape(text))
    # One lookbehind per width: Python's lookbehind alternatives must share a width.
    return "".join(f"(?<!{'|'.join(group)})" for group in by_width.values())


# What a slash starts, when that is clear from the character before it (or before one
# space): a comment; a division after an operand that is not a keyword; a regex
# literal after punctuation that cannot end an operand. These agree with
# `_regex_after_offset`, which decides the remaining cases.
_SLASH = (
    r"/(?:/[^\n\r\u2028\u2029]*+|\*(?:[^*]++|\*(?!/))*+\*/"
    r"|(?:(?<=[\w$)\]]/)|(?<=[\w$)\]] /))(?![/*])"
    + _not_after([f"{word}/" for word in sorted(_KEYWORDS_BEFORE_EXPRESSION)])
    + _not_after([f"{word} /" for word in sorted(_KEYWORDS_BEFORE_EXPRESSION)])
    + rf"|(?:(?<=[(,=:\[&|?{{;>]/)|(?<=[(,=:\[&|?{{;>] /)){_REGEX_BODY})"
)
_PLAIN = r"[^'\"`/(){}\[\]]"
# How deep a group or template substitution the patterns swallow whole. Each level
# doubles the patterns' size (and their compile time at import); deeper code is walked
# by `_skip_nested`, a level at a time, which costs a Python iteration per bracket.
_LEVELS = 3


def _items(levels: int, plain: str | None = _PLAIN) -> str:
    """Alternatives for one complete item of code: a run of `plain` characters, a
    string, a comment, an unambiguous slash, or a group or template literal whose
    brackets and substitutions nest at most `levels` deep.

    Bracket kinds are not matched against each other: a mismatch is a syntax error Deno
    reports anyway, and matching them would triple the pattern at every level.
    """
    head = f"{plain}++|" if plain else ""
    if levels == 0:
        return rf"{head}{_STRING}|`{_TEMPLATE_TEXT}*+`|{_SLASH}"
    inner = f"(?:{_items(levels - 1)})*+"
    template = rf"`(?:{_TEMPLATE_TEXT}|\$\{{{inner}\}})*+`"
    return rf"{head}[(\[{{]{inner}[)\]}}]|{_STRING}|{template}|{_SLASH}"


# Code inside a group, up to the first character it cannot swallow.
_CONTENT = re.compile(f"(?:{_items(_LEVELS - 1)})*+")

# The top level, up to the first character it cannot swallow. Line breaks and `;` are
# items of their own so that the match can record the last statement starts it saw
# (empty groups, whose last capture survives the loop) and stop before a line or
# statement starting with `import` or `export`. Statement starts it records:
# - `semi`: after a `;`, when code (not a comment or another `;`) follows;
# - `line`: a line starting with a statement keyword or a TypeScript type alias, which
#   no expression can continue;
# - `block`: a line starting a function or class declaration right after a line ending
#   in `}` or `;` (after an operator, `function` could still continue an expression);
# - `asi`: a line starting with a word, string or number after a line ending with an
#   operand (a name that is not a keyword, a literal, `]` or `}`), where automatic
#   semicolon insertion ends the statement;
# - `call`: the same after a line ending with a call's `)`, told apart from the `)` of
#   an `if (…)` head by the name or bracket right before its `(`.
# A `while` never starts a recorded statement: it may end a `do … while` loop, whose
# body reading would then swallow the next statement. A line comment swallows its line
# break, so that the comment's last character is never taken for the end of code.
_HORIZONTAL_SPACE = r"[^\S\n\r\u2028\u2029]"
_MODULE_WORD = r"(?:import(?![\w$])(?!\s*+[(.])|export(?![\w$]))"
_STATEMENT_WORD = "(?:{}|type\\s++[\\w$]++\\s*+[=<])(?![\\w$])".format(
    "|".join(sorted(_STATEMENT_KEYWORDS - {"while"}))
)
_DECLARATION_WORD = r"(?:async\s++function|function|class|abstract\s++class)(?![\w$])"
# Words that leave a statement unfinished at the end of a line.
_OPEN_WORDS = _words(
    """in instanceof typeof new delete void await else do case extends implements as
    satisfies keyof infer var let const function class import export default from if
    for while switch try catch finally with interface enum async of type declare
    abstract namespace module readonly unique asserts is get set static accessor"""
)
# Words that continue the previous line's statement at the start of a line.
_CONTINUING_WORDS = _words(
    "in instanceof as satisfies else catch finally from of extends implements is keyof while"
)
_ENDS_OPERAND = r"(?<=[\w$\]}'\"`])" + _not_after(sorted(_OPEN_WORDS), prefix=r"\b")
_STARTS_STATEMENT = "(?!(?:{})(?![\\w$]))[\\w$'\"]".format("|".join(sorted(_CONTINUING_WORDS)))
_NEXT_LINE_STARTS_STATEMENT = (
    rf"(?={_HORIZONTAL_SPACE}*+{_LINE_BREAK}(?!{_HORIZONTAL_SPACE}*+{_MODULE_WORD})"
    rf"\s*+{_STARTS_STATEMENT})"
)
_CALL = (
    r"(?=\()(?<=[\w$)\]>.])"
    + _not_after(["if", "for", "while", "with", "await", "catch", "switch"], prefix=r"\b")
    + rf"\((?:{_items(1)})*+\)(?:{_NEXT_LINE_STARTS_STATEMENT}(?P<call>))?"
)
_TOP_LEVEL = re.compile(
    rf"(?:[^'\"`/(){{}}\[\];\n\r\u2028\u2029]++"
    rf"|(?={_LINE_BREAK}){_ENDS_OPERAND}{_LINE_BREAK}(?!{_HORIZONTAL_SPACE}*+{_MODULE_WORD})"
    rf"(?=\s*+{_STARTS_STATEMENT})(?P<asi>)"
    rf"|{_LINE_BREAK}(?!{_HORIZONTAL_SPACE}*+{_MODULE_WORD})"
    rf"(?:(?={_HORIZONTAL_SPACE}*+{_STATEMENT_WORD})(?P<line>)"
    rf"|(?<=[}};]{_LINE_BREAK})(?=\s*+{_DECLARATION_WORD})(?P<block>))?"
    rf"|;(?!{_HORIZONTAL_SPACE}*+{_MODULE_WORD})"
    rf"(?:(?=\s*+(?:[^\s;/]|/[^/*]))(?!\s*+while(?![\w$]))(?P<semi>))?"
    rf"|//[^\n\r\u2028\u2029]*+(?:{_LINE_BREAK}(?!{_HORIZONTAL_SPACE}*+{_MODULE_WORD})"
    rf"(?:(?={_HORIZONTAL_SPACE}*+{_STATEMENT_WORD})(?P<commented>))?)?"
    rf"|{_CALL}|{_items(_LEVELS, None)})*+"
)
_BOUNDARY_GROUPS = ("semi", "line", "block", "asi", "call", "commented")
_MODULE_STATEMENT = re.compile(rf"[\s\ufeff]*+(?={_MODULE_WORD})")

_CLOSER = {"(": ")", "[": "]", "{": "}"}
# Marks "inside a template substitution": its `}` resumes the template literal.
_SUBSTITUTION = "${"


# --- Skipping ---------------------------------------------------------------------------


def _scan(text: str) -> tuple[int, list[int]]:
    """Walk the top level: return the last statement boundary and the module statements.

    The boundary is the offset of the last top-level statement start that `_scan` can
    recognise without tokens (see `_TOP_LEVEL`); the last statement that stays in the
    function starts at or after it. Reading may start inside a statement there (the
    `else` of an `if`), which the statement reader tolerates. The module statements are
    the offsets of `import` and `export` declarations starting a line, following a `;`,
    or starting the text.
    """
    pos = boundary = _shebang_end(text)
    candidates: list[int] = []
    leading = _MODULE_STATEMENT.match(text, pos)
    if leading:
        candidates.append(leading.end())
        pos = leading.end() + len("import")  # as long as "export"
    scan, length = _TOP_LEVEL.match, len(text)
    while True:
        found = scan(text, pos)
        pos = found.end()
        boundary = max(boundary, *map(found.start, _BOUNDARY_GROUPS))
        if pos >= length:
            return boundary, candidates
        char = text[pos]
        if char in "\n\r\u2028\u2029;":  # a line or statement starting with import/export
            pos = _MODULE_STATEMENT.match(text, pos + 1).end()
            candidates.append(pos)
            pos += len("import")  # as long as "export"
        elif char in _CLOSER:
            pos = _skip_nested(text, pos + 1, [_CLOSER[char]])
        elif char == "`":
            pos = _skip_template(text, pos + 1)
        elif char == "/":
            pos = _skip_slash(text, pos)
        else:
            raise _UntokenizableError(f"unbalanced {char!r} at offset {pos}")


def _skip_nested(
    text: str, pos: int, expected: list[str], ends: dict[int, int] | None = None
) -> int:
    """Return the offset just past the bracket (or substitution) that empties `expected`.

    `expected` is the stack of closers still open at `pos`: `)`, `]`, `}`, or
    `_SUBSTITUTION` for a template substitution, whose `}` resumes the template.
    `ends`, if given, gets the end of every group, template literal and substitution
    opened (and closed) on the way: see `_Opened`.
    """
    content, length = _CONTENT.match, len(text)
    opened = _Opened(ends) if ends is not None else None
    while True:
        pos = content(text, pos).end()
        if pos >= length:
            raise _UntokenizableError("unbalanced brackets")
        char = text[pos]
        if char in ")]}":
            pos = _close(text, pos, expected, opened)
            if not expected:
                return pos
        elif char in _CLOSER:
            expected.append(_CLOSER[char])
            if opened is not None:
                opened.brackets.append(pos)
            pos += 1
        elif char == "`":
            depth = len(expected)
            rest = _template_rest(text, pos + 1, expected)
            if opened is not None:
                opened.template(pos, rest, substituted=len(expected) > depth)
            pos = rest
        elif char == "/":
            pos = _skip_slash(text, pos)
        else:
            raise _UntokenizableError(f"unterminated string at offset {pos}")


def _close(text: str, pos: int, expected: list[str], opened: _Opened | None) -> int:
    """Close the bracket or substitution whose closer is at `pos`; return what follows."""
    char = text[pos]
    closer = expected.pop()
    if closer == _SUBSTITUTION and char == "}":
        depth = len(expected)
        rest = _template_rest(text, pos + 1, expected)
        if opened is not None:
            opened.substitution_closed(pos + 1, rest, reopened=len(expected) > depth)
        return rest
    if closer != char:
        raise _UntokenizableError(f"mismatched {char!r} at offset {pos}")
    if opened is not None:
        opened.bracket_closed(pos + 1)
    return pos + 1


class _Opened:
    """What one `_skip_nested` walk opened, to record in `ends` where each one ends.

    `ends` maps a group's opening bracket, a template literal's opening backtick, and a
    substitution's `{` (of `${`) to the offset just past its end. A reader that walks
    into every group (`token_groups`) then finds each nested group's end without
    walking it again, which keeps deep nesting linear rather than quadratic. What the
    caller opened is not recorded (the caller knows its end), and neither are groups
    `_CONTENT` swallows whole, which nest at most `_LEVELS` deep.
    """

    def __init__(self, ends: dict[int, int]) -> None:
        self.ends = ends
        self.brackets: list[int] = []
        self.templates: list[int] = []
        self.substitutions: list[int] = []

    def bracket_closed(self, end: int) -> None:
        if self.brackets:  # else the caller's
            self.ends[self.brackets.pop()] = end

    def template(self, tick: int, rest: int, *, substituted: bool) -> None:
        if substituted:  # `rest` is just past the `${`
            self.templates.append(tick)
            self.substitutions.append(rest - 1)
        else:
            self.ends[tick] = rest

    def substitution_closed(self, end: int, rest: int, *, reopened: bool) -> None:
        if not self.substitutions:  # the caller's
            return
        self.ends[self.substitutions.pop()] = end
        if reopened:
            self.substitutions.append(rest - 1)
        else:
            self.ends[self.templates.pop()] = rest


def _skip_template(text: str, pos: int, ends: dict[int, int] | None = None) -> int:
    """Return the end of the template literal whose opening backtick ends at `pos`."""
    expected: list[str] = []
    end = _template_rest(text, pos, expected)
    return _skip_nested(text, end, expected, ends) if expected else end


def _template_rest(text: str, pos: int, expected: list[str]) -> int:
    """Skip template text from `pos` to its closing backtick or its next `${`.

    Pushes `_SUBSTITUTION` on `expected` when a substitution opens.
    """
    rest = _TEMPLATE_REST.match(text, pos)
    if rest is None:
        raise _UntokenizableError("unterminated template literal")
    if not rest["done"]:
        expected.append(_SUBSTITUTION)
    return rest.end()


def _skip_slash(text: str, pos: int) -> int:
    """Skip the comment, regex literal or division operator at `pos`."""
    if text.startswith("/*", pos):
        end = text.find("*/", pos + 2)
        if end < 0:
            raise _UntokenizableError("unterminated comment")
        return end + 2
    if text.startswith("//", pos):
        found = _LINE_TERMINATOR.search(text, pos)
        return found.start() if found else len(text)
    if _regex_after_offset(text, _previous_significant(text, pos)):
        regex = _REGEX_LITERAL.match(text, pos)
        if regex:
            return regex.end()
    return pos + 1


def _previous_significant(text: str, pos: int) -> int:
    """Offset of the last character before `pos` that is not blank or in a comment.

    Block comments are recognised from their end, which is enough here; -1 at the start.
    """
    index = pos - 1
    while index >= 0:
        char = text[index]
        if char.isspace() or char == "\ufeff":
            index -= 1
        elif char == "/" and index > 0 and text[index - 1] == "*":
            opening = text.rfind("/*", 0, index - 1)
            if opening < 0:
                return index
            index = opening - 1
        else:
            return index
    return -1


def _is_identifier_char(char: str) -> bool:
    return char.isalnum() or char in "_$" or char > "\x7f"


def _regex_after_offset(text: str, last: int) -> bool:
    """Whether a `/` whose previous significant character is text[last] starts a regex.

    JavaScript decides by the previous token: a regex may start where an expression
    may, a division where an operand just ended. A `)` is taken to end an operand (so
    `if (x) /re/` is misread, as rarely matters) and a `}` to end a block.
    """
    if last < 0:
        return True
    char = text[last]
    if char in ")]'\"`":
        return False
    if _is_identifier_char(char):
        start = last
        while start > 0 and _is_identifier_char(text[start - 1]):
            start -= 1
        before = _previous_significant(text, start)
        if before >= 0 and text[before] == ".":  # a property named like a keyword
            return False
        return text[start : last + 1] in _KEYWORDS_BEFORE_EXPRESSION
    if char in "+-":  # `x++ / 2` divides; `a + /re/` is a regex
        return not (last > 0 and text[last - 1] == char)
    if char == "!" and last > 0:  # TypeScript's non-null assertion: `x! / 2`
        return not (_is_identifier_char(text[last - 1]) or text[last - 1] in ")]")
    return True


def _shebang_end(text: str) -> int:
    """The end of a `#!` first line, or 0."""
    if not text.startswith("#!"):
        return 0
    found = _LINE_TERMINATOR.search(text)
    return found.start() if found else len(text)


# --- Tokens -----------------------------------------------------------------------------
#
# Only top-level tokens (bracket depth 0) are materialised. A bracketed group is one
# token spanning from its opening to its matching closing bracket, and a template
# literal is one token including its substitutions: top-level statement structure is
# all the statement reader needs.


class Token(NamedTuple):
    """One token: its kind ("name", "num", "str", "template", "regex", "punct" or
    "group") and its span in the text. A group (a bracketed group) or a template
    literal is one token, its contents included."""

    kind: str  # one of the kinds below
    value: str  # the word for NAME, the operator for PUNCT, the bracket for GROUP
    start: int
    end: int
    newline_before: bool  # a line terminator (or multi-line comment) precedes it


_NAME, _NUM, _STR, _TEMPLATE, _REGEX, _PUNCT, _GROUP = (
    "name",
    "num",
    "str",
    "template",
    "regex",
    "punct",
    "group",
)

_TRIVIA = r"(?:[\s\ufeff]++|//[^\n\r\u2028\u2029]*+|/\*(?:[^*]++|\*(?!/))*+\*/)*+"
_IDENTIFIER_START = r"(?:[^\W\d]|\$|\\u[0-9a-fA-F]{4}|\\u\{[0-9a-fA-F]+\})"
_IDENTIFIER_PART = r"(?:[\w$\u200c\u200d]|\\u[0-9a-fA-F]{4}|\\u\{[0-9a-fA-F]+\})"
_NUMBER = (
    r"(?:0[xX][\da-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+"
    r"|(?:\d[\d_]*+(?:\.[\d_]*+)?|\.\d[\d_]*+)(?:[eE][+-]?\d[\d_]*+)?)n?"
)
_OPERATOR = (
    r">>>=|\.\.\.|===|!==|\*\*=|<<=|>>=|>>>|&&=|\|\|=|\?\?=|=>|==|!=|<=|>=|&&|\|\||\?\?"
    r"|\?\.(?!\d)|\+\+|--|\+=|-=|\*=|%=|&=|\|=|\^=|<<|>>|\*\*|[-+*%<>=!~^&|?:;,.@#]"
)
_TOKEN = re.compile(
    rf"{_TRIVIA}(?:(?P<{_NAME}>#?{_IDENTIFIER_START}{_IDENTIFIER_PART}*+)"
    rf"|(?P<{_NUM}>{_NUMBER})|(?P<{_STR}>{_STRING})|(?P<{_PUNCT}>{_OPERATOR})"
    rf"|(?P<open>[(\[{{])|(?P<tick>`)|(?P<slash>/)|(?P<eof>\Z)|(?P<bad>))"
)
_WORD_KINDS = frozenset((_NAME, _PUNCT))
_VALUE_KINDS = frozenset((_NUM, _STR))


def _tokenize(
    text: str,
    pos: int,
    limit: int = -1,
    stop: int | None = None,
    ends: dict[int, int] | None = None,
) -> list[Token]:
    """Top-level tokens from `pos` to `stop` (the end of text), or only the first `limit`.

    `ends` records, and then supplies, where nested groups end (see `_Opened`). Raises
    _UntokenizableError for text that is not lexically JavaScript.
    """
    tokens: list[Token] = []
    append = tokens.append
    new = tuple.__new__  # builds a Token without NamedTuple's Python-level __new__
    match, find = _TOKEN.match, text.find
    exotic = _has_exotic_line_breaks(text)
    pos = max(pos, _shebang_end(text))
    stop = len(text) if stop is None else stop
    while len(tokens) != limit:
        if pos > stop:  # a token ran past the end of its group
            raise _UntokenizableError(f"unbalanced text before offset {pos}")
        found = match(text, pos, stop)
        kind = found.lastgroup
        start = found.start(kind)
        end = found.end()
        newline = start > pos and (
            find("\n", pos, start) >= 0
            or (exotic and _LINE_TERMINATOR.search(text, pos, start) is not None)
        )
        if kind in _WORD_KINDS:
            append(new(Token, (kind, found[kind], start, end, newline)))
        elif kind in _VALUE_KINDS:
            append(new(Token, (kind, "", start, end, newline)))
        elif kind == "eof":
            break
        else:
            append(_long_token(text, tokens, kind, start, end, newline, ends))
            end = tokens[-1].end
        pos = end
    return tokens


@functools.lru_cache(maxsize=1)  # one program is tokenized in several pieces
def _has_exotic_line_breaks(text: str) -> bool:
    """Whether `text` may hold line breaks other than "\\n" (which are rare enough that
    tokens can look for them with a regex search rather than `str.find`)."""
    return "\r" in text or not text.isascii()


def _long_token(
    text: str,
    tokens: list[Token],
    kind: str,
    start: int,
    end: int,
    newline: bool,
    ends: dict[int, int] | None = None,
) -> Token:
    """The group, template, regex literal or `/` operator starting at `start`."""
    known = ends.get(start) if ends is not None else None
    if kind == "open":
        bracket = text[start]
        end = known or _skip_nested(text, end, [_CLOSER[bracket]], ends)
        return Token(_GROUP, bracket, start, end, newline)
    if kind == "tick":
        return Token(_TEMPLATE, "", start, known or _skip_template(text, end, ends), newline)
    if kind == "slash":
        if text.startswith("/*", start):
            raise _UntokenizableError("unterminated comment")
        last = tokens[-1].end - 1 if tokens else _previous_significant(text, start)
        regex = _regex_after_offset(text, last) and _REGEX_LITERAL.match(text, start)
        if regex:
            return Token(_REGEX, "", start, regex.end(), newline)
        operator = "/=" if text.startswith("/=", start) else "/"
        return Token(_PUNCT, operator, start, start + len(operator), newline)
    raise _UntokenizableError(f"unexpected character at offset {start}")


def _is_property(tokens: list[Token], index: int) -> bool:
    """Whether the NAME at `index` follows `.` or `?.` (so it is not a keyword)."""
    return index > 0 and tokens[index - 1].kind == _PUNCT and tokens[index - 1].value in (".", "?.")


# --- Statements -------------------------------------------------------------------------
#
# Statements are found by a small recursive reader over the top-level tokens:
# control statements and declarations with bodies are read by their shape (so that a
# `for (…)\n  x += 1` body is not mistaken for a statement of its own), everything else
# ends at `;` or where automatic semicolon insertion would end it.

# Words after which a statement can never end (operators and heads of constructs).
# TypeScript's contextual words that are also common variable names (`type`, `module`,
# `of`) are left out: wrongly ending a statement there is worse than missing a value.
_NOT_AT_END = _words(
    """in instanceof typeof new delete void await else do case extends implements as
    satisfies keyof infer var let const function class import export default from if
    for while switch try catch finally with interface enum"""
)
_CONTROL_HEADS = frozenset(("if", "while", "for", "with"))
# Restricted productions: a line break right after these ends the statement.
_RESTRICTED = frozenset(("return", "break", "continue", "throw", "yield"))
# Operators that cannot continue an expression from the previous line.
_NOT_CONTINUING = frozenset(("!", "~", "@", "#", "...", "++", "--", ";"))
# Statement heads that make the last statement something other than an expression.
_NOT_EXPRESSIONS = _words(
    """var let const if for while do switch try throw return break continue debugger
    function class import export with else case default enum"""
)
# TypeScript's contextual declaration words, a declaration when a name follows them.
_CONTEXTUAL_DECLARATIONS = _words("type interface namespace module declare abstract using")
_BINARY_WORDS = frozenset(("in", "instanceof", "as", "satisfies"))
# A brace after these tokens is part of a type or an expression, never a body.
_NOT_BEFORE_BODY = frozenset(("extends", "implements", "keyof", "typeof", "is", "as", "new"))


def _statement_end(tokens: list[Token], index: int) -> int:
    """Return the index just past the statement that starts at tokens[index]."""
    token = tokens[index]
    if (token.kind == _GROUP and token.value == "{") or (
        token.kind == _PUNCT and token.value == ";"
    ):
        return index + 1  # a block (`{a: 1}` included, as JavaScript reads it), or empty
    if token.kind == _NAME:
        end = _keyword_statement_end(tokens, index)
        if end is not None:
            return end
    return _simple_statement_end(tokens, index)


def _keyword_statement_end(tokens: list[Token], index: int) -> int | None:
    """The end of a statement read by its shape, or None for a simple statement."""
    word, following = tokens[index].value, index + 1
    if (word == "import" and _is_import_declaration(tokens, index)) or _is_reexport(tokens, index):
        return _module_clause_end(tokens, following)
    if word == "export":
        following += _is(tokens, following, _NAME, "default")
        if following < len(tokens) and _is_declaration_with_body(tokens, following):
            return _body_end(tokens, following)
        return None
    if word in _CONTROL_HEADS:
        return _control_end(tokens, index)
    if word == "else":  # only seen when reading starts inside an `if` (see `_scan`)
        return _nested_statement_end(tokens, following)
    if word == "do":
        end = _nested_statement_end(tokens, following)
        if _is(tokens, end, _NAME, "while") and _is(tokens, end + 1, _GROUP, "("):
            end += 2
            end += _is(tokens, end, _PUNCT, ";")
        return end
    if word == "try":
        return _try_end(tokens, following)
    if word == "switch":
        if _is(tokens, following, _GROUP, "(") and _is(tokens, following + 1, _GROUP, "{"):
            return following + 2
        return None
    if _is_declaration_with_body(tokens, index):
        return _body_end(tokens, index)
    if _is(tokens, following, _PUNCT, ":") and word not in _NOT_AT_END:
        return _nested_statement_end(tokens, following + 1)  # a labelled statement
    return None


def _control_end(tokens: list[Token], index: int) -> int | None:
    """The end of `if`, `for`, `while` or `with`: its head, its body, and any `else`.

    An `else if` chain is followed in a loop rather than by recursion, however long.
    """
    while True:
        word, following = tokens[index].value, index + 1
        if word == "for" and _is(tokens, following, _NAME, "await"):
            following += 1
        if not _is(tokens, following, _GROUP, "("):
            return None
        end = _nested_statement_end(tokens, following + 1)
        if word != "if" or not _is(tokens, end, _NAME, "else"):
            return end
        if not (_is(tokens, end + 1, _NAME, "if") and _is(tokens, end + 2, _GROUP, "(")):
            return _nested_statement_end(tokens, end + 1)
        index = end + 1


def _is_import_declaration(tokens: list[Token], index: int) -> bool:
    """Whether the `import` at `index` is a declaration, not `import(…)` or `import.meta`."""
    following = index + 1
    return following < len(tokens) and tokens[following].value not in ("(", ".")


def _is_reexport(tokens: list[Token], index: int) -> bool:
    """Whether tokens[index] starts `export {…}`, `export * …` or `export type {…}`."""
    if not _is(tokens, index, _NAME, "export") or index + 1 >= len(tokens):
        return False
    following = tokens[index + 1]
    if following.kind == _NAME and following.value == "type":
        return _is(tokens, index + 2, _GROUP, "{") or _is(tokens, index + 2, _PUNCT, "*")
    return following.value in ("{", "*")


def _module_clause_end(tokens: list[Token], index: int) -> int:
    """The end of an import or re-export: its module specifier (and attributes), or `}`.

    JavaScript ends these declarations there even without a semicolon, so a following
    line starting with `(` is a statement of its own.
    """
    count = len(tokens)
    for position in range(index, count):
        kind, value, _, _, newline = tokens[position]
        if kind == _PUNCT and value == ";":
            return position + 1
        if newline and value != "from" and _line_break_ends_statement(tokens, position):
            return position
        if kind == _STR or (
            kind == _GROUP and value == "{" and not _is(tokens, position + 1, _NAME, "from")
        ):
            end = position + 1
            attributes = end < count and tokens[end].value in ("with", "assert")
            if kind == _STR and attributes and _is(tokens, end + 1, _GROUP, "{"):
                end += 2
            return end + _is(tokens, end, _PUNCT, ";")
    return count


def _nested_statement_end(tokens: list[Token], index: int) -> int:
    """The end of the statement at `index`, which may be missing at the end of text."""
    return _statement_end(tokens, index) if index < len(tokens) else index


def _try_end(tokens: list[Token], index: int) -> int:
    end = index + _is(tokens, index, _GROUP, "{")
    if _is(tokens, end, _NAME, "catch"):
        end += 1
        end += _is(tokens, end, _GROUP, "(")
        end += _is(tokens, end, _GROUP, "{")
    if _is(tokens, end, _NAME, "finally"):
        end += 1
        end += _is(tokens, end, _GROUP, "{")
    return end


def _is(tokens: list[Token], index: int, kind: str, value: str) -> bool:
    return index < len(tokens) and tokens[index].kind == kind and tokens[index].value == value


def _is_declaration_with_body(tokens: list[Token], index: int) -> bool:
    """Whether tokens[index] starts a function or class declaration."""
    word = tokens[index].value
    if tokens[index].kind != _NAME:
        return False
    if word in ("function", "class"):
        return True
    following = index + 1
    if word in ("async", "abstract"):
        expected = "function" if word == "async" else "class"
        return _is(tokens, following, _NAME, expected) and not tokens[following].newline_before
    return False


def _body_end(tokens: list[Token], index: int) -> int:
    """The end of a function or class declaration: just past its `{…}` body.

    The body is the first brace group that follows something that can end a type or a
    parameter list, so that `function f(): { a: number } {…}` and
    `class C extends Base<{ a: 1 }> {…}` find the right one. A declaration without a
    body (a TypeScript overload) ends at `;` or at a line starting a new statement.
    """
    count = len(tokens)
    for position in range(index + 1, count):
        kind, value, _, _, newline = tokens[position]
        if kind == _PUNCT and value == ";":
            return position + 1
        if newline and kind == _NAME and value in _STATEMENT_KEYWORDS:
            return position
        if kind == _GROUP and value == "{":
            before = tokens[position - 1]
            if before.kind == _NAME and before.value not in _NOT_BEFORE_BODY:
                return position + 1
            if before.kind in (_GROUP, _STR, _NUM) or before.value in (">", ">>", ">>>"):
                return position + 1
    return count


def _simple_statement_end(tokens: list[Token], index: int) -> int:
    """The end of an expression statement or declaration: `;`, ASI, or the end of text."""
    count = len(tokens)
    for position in range(index + 1, count):
        token = tokens[position]
        if token.kind == _PUNCT and token.value == ";":
            return position + 1
        if token.newline_before and _line_break_ends_statement(tokens, position):
            return position
    return count


def _line_break_ends_statement(tokens: list[Token], index: int) -> bool:
    """Whether automatic semicolon insertion ends a statement before tokens[index].

    JavaScript inserts a semicolon at a line break when the next token cannot continue
    the statement. Like JavaScript, a line starting with `(`, `[`, a template literal or
    a binary operator continues the previous one (`a\\n(b)` is the call `a(b)`).
    """
    previous, token = tokens[index - 1], tokens[index]
    kind, value = token.kind, token.value
    if previous.kind == _NAME and previous.value in _RESTRICTED:
        return not _is_property(tokens, index - 1)
    if previous.kind == _NAME and previous.value == "export":
        return _is_property(tokens, index - 1)  # `export\nconst x = 1` is one statement
    if kind == _NAME and value in _STATEMENT_KEYWORDS:
        return True
    if not _can_end_statement(tokens, index - 1):
        return False
    if kind == _GROUP:
        return value == "{"
    if kind == _PUNCT:
        return value in _NOT_CONTINUING
    if kind == _NAME:
        return value not in ("in", "instanceof")
    return kind != _TEMPLATE  # a template after an expression is a tagged template


def _can_end_statement(tokens: list[Token], index: int) -> bool:
    kind, value = tokens[index].kind, tokens[index].value
    if kind == _NAME:
        return value not in _NOT_AT_END or _is_property(tokens, index)
    if kind == _PUNCT:
        if value in (">", ">>", ">>>"):
            return _closes_type_arguments(tokens, index)
        if value == "!":  # TypeScript's non-null assertion, written against its operand
            previous = tokens[index - 1] if index else None
            return (
                previous is not None
                and previous.end == tokens[index].start
                and previous.kind != _PUNCT
                and _can_end_statement(tokens, index - 1)
            )
        return value in ("++", "--")
    return True


# How far back `_closes_type_arguments` looks for the `<`: type arguments are short
# (`Record<string, Array<{ a: 1 }>>` is 9 tokens), and the bound keeps a long statement
# full of comparisons cheap. Longer ones are taken for comparisons, which only costs
# the program its return value.
_TYPE_ARGUMENTS_TOKENS = 16


def _closes_type_arguments(tokens: list[Token], index: int) -> bool:
    """Whether the `>` at `index` closes TypeScript type arguments (`Map<K, V>`).

    The opening `<` must follow a name with no space between, the way generics are
    written and comparisons are not; `a < b >` is taken for a comparison that goes on.
    """
    depth = 0
    for position in range(index, max(index - _TYPE_ARGUMENTS_TOKENS, -1), -1):
        kind, value, start, _, _ = tokens[position]
        if kind != _PUNCT:
            continue
        if value in (">", ">>", ">>>"):
            depth += len(value)
        elif value == "<":
            depth -= 1
            if depth == 0:
                before = tokens[position - 1] if position else None
                return before is not None and before.kind == _NAME and before.end == start
        elif value in (";", "=>", "&&", "||", "??", "?"):
            return False
    return False


def _is_expression_statement(tokens: list[Token], index: int, end: int) -> bool:
    """Whether tokens[index:end] is a statement whose value may be returned.

    Only shapes that are certainly expressions qualify: declarations, control
    statements, labels, blocks, decorators and anything unusual do not.
    """
    token = tokens[index]
    kind, value = token.kind, token.value
    if kind == _GROUP:
        return value != "{"
    if kind == _PUNCT:
        return value in ("!", "~", "+", "-", "++", "--")
    if kind != _NAME:
        return True  # a number, string, template or regex literal
    following = tokens[index + 1] if index + 1 < end else None
    if value == "import":  # `import(…)` and `import.meta` are expressions
        return following is not None and following.value in ("(", ".")
    if value in _NOT_EXPRESSIONS or value.startswith("#"):
        return False
    if following is None:
        return True
    if following.kind == _PUNCT and following.value == ":":
        return False  # a label
    same_line_word = following.kind in (_NAME, _STR) and not following.newline_before
    if value in _CONTEXTUAL_DECLARATIONS and same_line_word:
        return following.value in _BINARY_WORDS
    if value == "async" and following.value == "function" and same_line_word:
        return False
    return not (value == "await" and following.value == "using" and same_line_word)


# --- Rewriting --------------------------------------------------------------------------


class _Edit(NamedTuple):
    start: int
    end: int
    text: str


_IMPORT_NOISE = re.compile(
    rf"({_STRING})|//[^\n\r\u2028\u2029]*|/\*[\s\S]*?\*/|[\n\r\u2028\u2029]+"
)
_NOT_LINE_BREAK = re.compile(r"[^\n\r\u2028\u2029]")

# What a top-level statement becomes (see `_plan_statement`).
_KEPT, _GONE, _DECLARATION, _PARENTHESISED = "", "gone", "declaration", "parenthesised"
# Tokens first read for an import or export: enough for most (`import x from "y";` is
# 5). A statement that may go on is read again with four times as many tokens.
_CANDIDATE_TOKENS = 8


def _plan(text: str) -> tuple[list[str], list[_Edit]]:
    """Decide the hoisted imports and the edits to the program text.

    Module statements before the last statement boundary `_scan` found are read one by
    one; from the boundary on, every statement is read, and the last one that stays in
    the function is made to return its value. Should nothing after the boundary stay
    (it was all imports and re-exports), the whole program is read instead.
    """
    boundary, candidates = _scan(text)
    imports, edits, last_found = _plan_from(text, boundary, candidates)
    start = _shebang_end(text)
    if not last_found and boundary > start:
        imports, edits, _ = _plan_from(text, start, [])
    return imports, edits


def _plan_from(
    text: str, boundary: int, candidates: list[int]
) -> tuple[list[str], list[_Edit], bool]:
    """Plan the `candidates` before `boundary`, then every statement from it on."""
    imports: list[str] = []
    edits: list[_Edit] = []
    for start in candidates:
        if start >= boundary:
            break
        _plan_candidate(text, start, imports, edits)
    tokens = _tokenize(text, boundary)
    last: tuple[int, int, str] | None = None
    index = 0
    while index < len(tokens):
        end = _statement_end(tokens, index)
        shape = _plan_statement(text, tokens, index, end, imports, edits)
        if shape != _GONE:
            last = (index, end, shape)
        index = end
    if last is not None:
        _plan_return(tokens, *last, edits)
    return imports, edits, last is not None


def _plan_candidate(text: str, start: int, imports: list[str], edits: list[_Edit]) -> None:
    """Plan the `import` or `export` statement at `start`, reading as little as needed."""
    limit = _CANDIDATE_TOKENS
    tokens = _tokenize(text, start, limit)
    if len(tokens) > 1 and _is_export_declaration(tokens, 0):
        _blank_export(tokens, 0, edits)  # the declaration itself needs no reading
        return
    end = _statement_end(tokens, 0)
    while end == len(tokens) == limit:  # it may go on past what was read
        limit *= 4
        tokens = _tokenize(text, start, limit)
        end = _statement_end(tokens, 0)
    _plan_statement(text, tokens, 0, end, imports, edits)


def _plan_statement(
    text: str, tokens: list[Token], index: int, end: int, imports: list[str], edits: list[_Edit]
) -> str:
    """Edit an import or export statement; return what the statement became."""
    first = tokens[index]
    if first.kind == _PUNCT and first.value == ";":
        return _GONE  # an empty statement has no value to return
    if first.kind != _NAME:
        return _KEPT
    if first.value == "import" and _is_import_declaration(tokens, index):
        start, stop = first.start, tokens[end - 1].end
        imports.append(_single_line(text[start:stop]))
        edits.append(_blank(text, start, stop))
        return _GONE
    if first.value == "export" and end > index + 1:
        return _plan_export(text, tokens, index, end, edits)
    return _KEPT


def _is_export_declaration(tokens: list[Token], index: int) -> bool:
    """Whether tokens[index] is `export` before a declaration (not a default or re-export)."""
    return (
        _is(tokens, index, _NAME, "export")
        and index + 1 < len(tokens)
        and not _is_reexport(tokens, index)
        and tokens[index + 1].value not in ("=", "as", "default")
    )


def _plan_export(text: str, tokens: list[Token], index: int, end: int, edits: list[_Edit]) -> str:
    """Edit a top-level `export` statement; return what it became."""
    export, following = tokens[index], tokens[index + 1]
    if _is_reexport(tokens, index) or following.value in ("=", "as"):
        # Re-exports, `export =` and `export as namespace` mean nothing in a function.
        edits.append(_blank(text, export.start, tokens[end - 1].end))
        return _GONE
    if following.kind == _NAME and following.value == "default" and index + 2 < end:
        target = tokens[index + 2]
        # The words go with the space after them, unless that holds a line break.
        words_end = target.start
        if _LINE_TERMINATOR.search(text, following.end, target.start):
            words_end = following.end
        if _is_named_declaration(tokens, index + 2) or target.value == "interface":
            edits.append(_Edit(export.start, words_end, ""))
            return _DECLARATION
        # Anything else is an expression (an anonymous function or class included), and
        # in parentheses it is an expression statement.
        edits.append(_Edit(export.start, words_end, "("))
        stop = _expression_end(tokens, index, end)
        edits.append(_Edit(stop, stop, ")"))
        return _PARENTHESISED
    _blank_export(tokens, index, edits)
    return _DECLARATION


def _blank_export(tokens: list[Token], index: int, edits: list[_Edit]) -> None:
    """Blank the `export` keyword at `index`, so the declaration keeps its columns."""
    export = tokens[index]
    edits.append(_Edit(export.start, export.end, " " * (export.end - export.start)))


def _is_named_declaration(tokens: list[Token], index: int) -> bool:
    """Whether tokens[index] starts a function or class declaration that has a name."""
    if not _is_declaration_with_body(tokens, index):
        return False
    position = index
    while position < len(tokens) and tokens[position].value in _DECLARATION_HEADS:
        position += 1
    if position >= len(tokens):
        return False
    name = tokens[position]
    return name.kind == _NAME and name.value not in ("extends", "implements")


_DECLARATION_HEADS = frozenset(("async", "abstract", "function", "class", "*"))


def _expression_end(tokens: list[Token], index: int, end: int) -> int:
    """The offset just past the statement's last token, not counting its `;`."""
    last = end - 1
    if last > index and tokens[last].kind == _PUNCT and tokens[last].value == ";":
        last -= 1
    return tokens[last].end


def _plan_return(tokens: list[Token], index: int, end: int, shape: str, edits: list[_Edit]) -> None:
    """Make the final statement return its value, if it is an expression statement."""
    first = tokens[index]
    if shape == _PARENTHESISED:  # already `(<expression>)`
        edits.append(_Edit(first.start, first.start, "return "))
    elif shape == _KEPT and _is_expression_statement(tokens, index, end):
        edits.append(_Edit(first.start, first.start, "return ("))
        stop = _expression_end(tokens, index, end)
        edits.append(_Edit(stop, stop, ")"))


def _single_line(statement: str) -> str:
    """An import declaration on one line: comments dropped, line breaks made spaces."""
    flat = _IMPORT_NOISE.sub(lambda found: found[1] or " ", statement).strip()
    return flat if flat.endswith(";") else f"{flat};"


def _blank(text: str, start: int, end: int) -> _Edit:
    """Blank text[start:end] but keep its line breaks, so later lines keep their numbers.

    Spaces keep the columns of code that follows on the same line; when nothing does,
    the line is left empty.
    """
    rest = _LINE_TERMINATOR.search(text, end)
    followed = text[end : rest.start() if rest else len(text)].strip()
    segment = text[start:end]
    return _Edit(start, end, _NOT_LINE_BREAK.sub(" " if followed else "", segment))


def _shebang_edits(text: str) -> list[_Edit]:
    """Blank a `#!` line: valid at the start of a module, a syntax error in a function."""
    end = _shebang_end(text)
    return [_Edit(0, end, "")] if end else []


def _apply(text: str, edits: list[_Edit]) -> str:
    """`text` with `edits` applied; an insertion sorts before a replacement at its offset."""
    if not edits:
        return text
    pieces: list[str] = []
    pos = 0
    for start, end, replacement in sorted(edits, key=lambda edit: (edit.start, edit.end)):
        pieces.append(text[pos:start])
        pieces.append(replacement)
        pos = max(pos, end)
    pieces.append(text[pos:])
    return "".join(pieces)


# --- Token groups -----------------------------------------------------------------------
#
# For readers that look at every token rather than at statements (the daemon's
# pre-execution policy): the same tokens, one group at a time, at every depth.


class TokenGroup(NamedTuple):
    """The tokens directly inside one bracketed group, one template substitution, or
    the top level.

    `opener` is "(", "[", "{", "${", or "" for the top level; `depth` is how many groups
    and substitutions enclose the tokens (0 at the top level); `start` is the offset
    just past the opener. A nested group is one token of kind "group" here (its `start`
    is its opener's), and its contents are a `TokenGroup` of their own.
    """

    opener: str
    depth: int
    start: int
    tokens: list[Token]


def token_groups(
    code: str, enter: Callable[[int, int], bool] | None = None
) -> Iterator[TokenGroup]:
    """Every group of tokens in `code`: the top level first, then each group inside.

    Strings, comments, regular expression literals and template text are never split
    into tokens, so a word inside one of them is never a NAME token. `enter`, if given,
    is asked about each nested group or template literal, by the span of its contents
    (`start`, `stop`), after its parent group has been handed out: when it answers
    False, that group and everything inside it is skipped.

    Raises `ValueError` (possibly after yielding some groups) if `code` is not
    lexically JavaScript or TypeScript as far as this module can tell. Walks
    iteratively: nesting depth costs no recursion.
    """
    pending = [("", 0, 0, len(code))]
    ends: dict[int, int] = {}
    try:
        while pending:
            opener, depth, start, stop = pending.pop()
            tokens = _tokenize(code, start, stop=stop, ends=ends)
            yield TokenGroup(opener, depth, start, tokens)
            inside: list[tuple[str, int, int, int]] = []
            for token in tokens:
                if token.kind not in (_GROUP, _TEMPLATE):
                    continue
                if enter is not None and not enter(token.start + 1, token.end - 1):
                    continue
                if token.kind == _GROUP:
                    inside.append((token.value, depth + 1, token.start + 1, token.end - 1))
                else:
                    inside.extend(_substitutions(code, token, depth + 1, ends))
            pending.extend(reversed(inside))  # popped in source order
    except (_UntokenizableError, RecursionError) as exc:
        raise ValueError(f"not lexically JavaScript: {exc}") from None


def _substitutions(
    code: str, template: Token, depth: int, ends: dict[int, int]
) -> list[tuple[str, int, int, int]]:
    """The `${…}` substitutions of a template literal token, as spans to tokenize."""
    spans = []
    pos = template.start + 1
    while True:
        expected: list[str] = []
        pos = _template_rest(code, pos, expected)
        if not expected:  # the closing backtick
            return spans
        # A substitution's contents are balanced like a `{` group's, closed by its `}`.
        close = ends.get(pos - 1) or _skip_nested(code, pos, ["}"], ends)
        spans.append((_SUBSTITUTION, depth, pos, close - 1))
        pos = close
