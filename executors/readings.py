"""What readers decided of a program's text, kept for the next request with that text.

An agent runs the same program again and again: a retry, the same script with other
`inputs`, a template it fills in the same way each turn. What the daemon reads from a
program before it runs (what wasm-js lacks for it, the wrapped text its guest is
handed) is a function of the text alone, and reading a TypeScript program (two parses,
the erasure and the check that erasing changed no meaning) is most of what the event
loop does for a small execution. So a `SyntaxMemo` made with a `Readings` asks it
first, and tells it what it decided.

An entry belongs to an owner (the principal whose request read the program): a request
finds only what its own principal's requests decided, so the time a request takes
tells nobody whether another principal ran the same program. Only values a reader
returns are kept, never a parse (a tree is many times its program's size), and only
for programs of at most `MAX_CHARS`; the whole is bounded by `budget_chars`, the least
recently used going first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar

__all__ = ["BUDGET_CHARS", "MAX_CHARS", "Readings"]

T = TypeVar("T")

# Programs longer than this are read each time: the reading is a small part of such a
# program's run, and one would crowd out many short ones.
MAX_CHARS = 64 * 1024
# What all entries may hold together, each counted as twice its program's length (the
# text is kept as the key, and a wrapped text as long may be the value) and a little
# for the entry itself.
BUDGET_CHARS = 2 * 1024 * 1024
ENTRY_CHARS = 256

_MISSING = object()


class Readings:
    """A bounded map from (owner, what was decided, program text) to the decision."""

    def __init__(self, budget_chars: int = BUDGET_CHARS) -> None:
        self._budget = budget_chars
        self._used = 0
        self._entries: OrderedDict[tuple[str, Hashable, str], object] = OrderedDict()
        # Readers run on the event loop and, for large programs, in worker threads.
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"<Readings {len(self._entries)} entries, {self._used} of {self._budget}>"

    def decided(self, owner: str, what: Hashable, code: str, decide: Callable[[], T]) -> T:
        """What `decide()` returns for `code`: kept from an earlier call with the same
        owner, `what` and text, or made now (and kept, if `code` is short enough).
        `decide` must be a function of the text alone; what it raises is not kept."""
        if len(code) > MAX_CHARS:
            return decide()
        key = (owner, what, code)
        with self._lock:
            found = self._entries.get(key, _MISSING)
            if found is not _MISSING:
                self._entries.move_to_end(key)
                return found  # type: ignore[return-value]
        value = decide()
        self._keep(key, value)
        return value

    def _keep(self, key: tuple[str, Hashable, str], value: object) -> None:
        cost = _cost(key[2])
        with self._lock:
            if key in self._entries:  # another reader decided it meanwhile
                return
            self._entries[key] = value
            self._used += cost
            while self._used > self._budget:
                (_, _, code), _ = self._entries.popitem(last=False)
                self._used -= _cost(code)


def _cost(code: str) -> int:
    return 2 * len(code) + ENTRY_CHARS
