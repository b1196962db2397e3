"""Turn a JavaScript/TypeScript program into a module whose default export runs it.

STUB: to be replaced by the real implementation (see the contract in `prepare_module`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PreparedModule", "prepare_module"]


@dataclass(frozen=True, slots=True)
class PreparedModule:
    """Module text and how many lines precede the user's first line in it."""

    text: str
    line_offset: int


def prepare_module(code: str) -> PreparedModule:
    """Wrap `code` as `export default async function (inputs) { ... }`.

    Contract: top-level `return` and `await` work; the value of a final bare expression
    statement is returned; top-level static `import` declarations are hoisted out of the
    function (their lines blanked so line numbers stay); user line N is line
    N + line_offset of `text`.
    """
    return PreparedModule(
        text="export default async function (inputs) {\n" + code + "\n}\n", line_offset=1
    )
