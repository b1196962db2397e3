"""What readers decided of a program's text, kept for the next request with that text.

An agent runs the same program again and again: a retry, the same script with other
`inputs`, a template it fills in the same way each turn. What the daemon reads from a
program before it runs (what wasm-js lacks for it, the wrapped text its guest is
handed) is a function of the text alone, and reading a TypeScript program (two parses,
the erasure and the check that erasing changed no meaning) is most of what the event
loop does for a small execution. So a `SyntaxMemo` made with a `Readings` asks it
first, and tells it what it decided (`SyntaxMemo.decided`), unless the decision was
made without a parse (a program too slow to parse, say): that one is read again.

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
from collections.abc import Hashable

__all__ = ["BUDGET_CHARS", "MAX_CHARS", "MISSING", "Readings"]

# Programs longer than this are read each time: the reading is a small part of such a
# program's run, and one would crowd out many short ones.
MAX_CHARS = 64 * 1024
# What all entries may hold together, each counted as twice its program's length (the
# text is kept as the key, and a wrapped text as long may be the value) and a little
# for the entry itself.
BUDGET_CHARS = 2 * 1024 * 1024
ENTRY_CHARS = 256

# What `find` returns for a decision not kept (None is a decision like any other).
MISSING = object()


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

    def find(self, owner: str, what: Hashable, code: str) -> object:
        """The decision kept for `owner`, `what` and `code`, or `MISSING`."""
        if len(code) > MAX_CHARS:  # never kept: not worth hashing
            return MISSING
        key = (owner, what, code)
        with self._lock:
            found = self._entries.get(key, MISSING)
            if found is not MISSING:
                self._entries.move_to_end(key)
            return found

    def keep(self, owner: str, what: Hashable, code: str, value: object) -> None:
        """Keep `value`, what was decided of `code` (if it is short enough)."""
        if len(code) > MAX_CHARS:
            return
        key = (owner, what, code)
        cost = _cost(code)
        with self._lock:
            if key in self._entries:  # another reader decided it meanwhile
                return
            self._entries[key] = value
            self._used += cost
            while self._used > self._budget:
                (_, _, dropped), _ = self._entries.popitem(last=False)
                self._used -= _cost(dropped)


def _cost(code: str) -> int:
    return 2 * len(code) + ENTRY_CHARS
