"""One parse of a request's JavaScript or TypeScript program, for all who read it.

Up to three readers look at a program's syntax tree before it runs, one after another:
the registry (what wasm-js lacks: `Intl`), the daemon's policy (forbidden globals and
imports) and the executor (`js_syntax.prepare_parsed`). A large program's parse costs
up to `js_syntax.PARSE_BUDGET_S` of CPU, and its tree many times the program's size in
memory (two hundred times, for the worst shapes). So a request makes one `SyntaxMemo`
and hands it to each reader in turn (the executor finds it on the `Job`): the first
reader parses, the others read that parse, and the executor, the last, `take`s it, so
that the tree goes as soon as its last reader is done with it.

A memo holds one parse, of one program in one dialect: a reader asking for another
replaces it. A TypeScript program's erasure (`ts_erase`: the JavaScript it means, and
that JavaScript's parse) is held beside it, made by the registry's reader when wasm-js
may run it, and taken by wasm-js. It belongs to one request and is never shared, so no
reader ever sees another request's program. What readers decide from the parse (not the
parse) may be kept for the next request of the same principal with the same text
(`decided`, `readings.Readings`), or, for a small one, for the request's later readers.

Whoever makes a request wait between readers (for an execution slot, for an executor
still starting) lets go of its parse first (`forget`): a tree held through a wait of
unbounded length would hold its memory as long, for every waiting request; the
executor parses again instead.

Not for two threads at once: a request's readers take turns, each after the one before
it has finished, on the event loop or in a worker thread.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TypeVar

from conduit.executors import js_syntax, ts_erase
from conduit.executors.js_syntax import Dialect, Syntax
from conduit.executors.readings import MISSING, Readings
from conduit.executors.ts_erase import Erased, NotErasable

__all__ = ["SyntaxMemo"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Parse:
    """`js_syntax.parse(code, dialect)`, None included (too large or too slow)."""

    code: str
    dialect: Dialect
    syntax: Syntax | None


class SyntaxMemo:
    """A request's parse of its program, made by the first reader that asks for it."""

    __slots__ = ("_decisions", "_erasure", "_held", "_owner", "_readings", "_unread")

    def __init__(self, readings: Readings | None = None, owner: str = "") -> None:
        self._held: _Parse | None = None
        # A TypeScript program's erasure (`ts_erase`), held beside its parse.
        self._erasure: tuple[str, Erased | NotErasable] | None = None
        # What readers decided of programs before, for requests of `owner`.
        self._readings = readings
        self._owner = owner
        # Set when a parse came to nothing while a decision was being made.
        self._unread = False
        # The decisions kept for this request alone (`decided(shared=False)`): what was
        # decided -> (the text, the decision).
        self._decisions: dict[Hashable, tuple[str, object]] = {}

    def __repr__(self) -> str:
        held = self._held
        if held is None:
            return "<SyntaxMemo empty>"
        return f"<SyntaxMemo {held.dialect}, {len(held.code)} characters>"

    def decided(
        self, what: Hashable, code: str, decide: Callable[[], T], *, shared: bool = True
    ) -> T:
        """`decide()`, a reader's decision about `code` (a function of its text alone,
        made from this memo's parse), or the one made for the same text before by a
        request of the same owner (`Readings`). A decision made while a parse came to
        nothing (too large, too slow, no thread for it) is not kept: the next request
        reads the program again. What `decide` raises is not kept either.

        Not `shared`: kept for this request's later readers only, whatever the
        program's length; for a small decision (a flag) that is cheap to make again
        for a short program, and not worth a place in `Readings`."""
        if not shared:
            made = self._decisions.get(what)
            if made is not None and (made[0] is code or made[0] == code):
                return made[1]  # type: ignore[return-value]
            value = decide()
            self._decisions[what] = (code, value)
            return value
        readings = self._readings
        if readings is None:
            return decide()
        found = readings.find(self._owner, what, code)
        if found is not MISSING:
            return found  # type: ignore[return-value]
        self._unread = False
        unread_before = js_syntax.unread_parses()
        value = decide()
        if not self._unread and js_syntax.unread_parses() == unread_before:
            readings.keep(self._owner, what, code, value)
        return value

    def parse(self, code: str, dialect: Dialect) -> Syntax | None:
        """`js_syntax.parse(code, dialect)`, kept for the next reader: made only if the
        memo does not hold that very program, in that dialect."""
        held = self._held
        # Dialect first: the program is compared only when it is the same one, and the
        # same string object compares equal without reading it.
        if held is None or held.dialect != dialect or held.code != code:
            held = self._held = _Parse(code, dialect, js_syntax.parse(code, dialect))
        if held.syntax is None:
            self._unread = True
        return held.syntax

    def take(self, code: str, dialect: Dialect) -> Syntax | None:
        """`parse`, for the program's last reader: the memo no longer holds it."""
        syntax = self.parse(code, dialect)
        self._held = None
        return syntax

    def erase(self, code: str) -> Erased | NotErasable:
        """`ts_erase.erase` of the TypeScript program `code` (its parse taken from, or
        kept in, this memo), kept for the next reader."""
        held = self._erasure
        if held is None or held[0] != code:
            held = self._erasure = (code, ts_erase.erase(self.parse(code, "typescript")))
        if isinstance(held[1], NotErasable) and held[1].unread:
            self._unread = True
        return held[1]

    def take_erased(self, code: str) -> Erased | NotErasable:
        """`erase`, for the program's last reader: the memo no longer holds anything."""
        erasure = self.erase(code)
        self.forget()
        return erasure

    def forget(self) -> None:
        """Let go of the parse held, if any (a request about to wait)."""
        self._held = None
        self._erasure = None
