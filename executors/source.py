"""Normalise program text the way clients send it: markdown fences removed.

Models often wrap a program in a fenced code block (```` ```ts ````, ```` ```python ````,
``~~~``). `unwrap_fence` removes exactly one such fence when it encloses the whole text
and nothing else. It follows CommonMark's fence rules (fence length, fence character,
info string, up to three spaces of indentation) so that it agrees with how the model's
own markdown would render. It knows nothing about the language inside the fence.
"""

from __future__ import annotations

import re

__all__ = ["unwrap_fence"]

# An opening fence after any blank lines: up to three spaces, three or more backticks or
# tildes, then an info string (the language tag, possibly more) up to the line's end.
_OPENING = re.compile(r"(?:[ \t]*\r?\n)*(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^\n]*)\n")
# A line that could close a fence: nothing but the fence characters and blanks.
_CLOSING = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})[ \t]*\r?$", re.MULTILINE)


def unwrap_fence(code: str) -> str:
    """Return the program inside a single markdown code fence, or `code` unchanged.

    The fence must enclose the whole text: blank lines may surround it, but any other
    text before or after it, a second fence, or a missing closing fence leaves `code`
    unchanged. The body is returned exactly as written (line endings included), minus
    the indentation of the opening fence, which CommonMark strips from every line.
    """
    opening = _OPENING.match(code)
    if opening is None:
        return code
    fence = opening["fence"]
    # CommonMark forbids backticks in a backtick fence's info string, which is what
    # keeps "```js `x` ```" an inline code span.
    if fence[0] == "`" and "`" in opening["info"]:
        return code
    for closing in _CLOSING.finditer(code, opening.end()):
        found = closing["fence"]
        if found[0] == fence[0] and len(found) >= len(fence):
            break
    else:
        return code
    # The first line that closes the fence must end the text (two blocks, or prose
    # after the block, are not one enclosing fence).
    if code[closing.end() :].strip():
        return code
    body = code[opening.end() : closing.start()].removesuffix("\n").removesuffix("\r")
    indent = len(opening["indent"])
    if indent:
        body = "\n".join(_dedent(line, indent) for line in body.split("\n"))
    return body


def _dedent(line: str, indent: int) -> str:
    """Remove up to `indent` leading spaces, as CommonMark does inside an indented fence."""
    stripped = len(line) - len(line.lstrip(" "))
    return line[min(stripped, indent) :]
