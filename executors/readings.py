"""What readers decided of a program's text, kept for the next request with that text.

An agent runs the same program again and again: a retry, the same script with other
`inputs`, a template it fills in the same way each turn. What the daemon reads from a
program before it runs (what wasm-js lacks for it, the wrapped text its guest is
handed) is a function of the text alone, and reading a TypeScript program (two parses,
the erasure and the check that erasing changed no meaning) is most of what the event
loop does for a small execution. So a `SyntaxMemo` made with a `Readings` asks it
first, and tells it what it decided (`SyntaxMemo.decided`), unless the decision was
made while a parse came to nothing (a program too slow to parse, say): that one is
read again.

Each owner (the principal whose requests read the programs) has entries of its own,
in a budget of its own: a request finds only what its own principal's requests
decided, and what another principal runs neither adds to nor pushes out of its
entries, so the time a request takes tells nothing of what others ran. Only values a
reader returns are kept, never a parse (a tree is many times its program's size), and
only for programs of at most `MAX_CHARS`. Owners are the daemon's principals, so few;
past `MAX_OWNERS` (8 M characters in all), the one that read least recently gives up
its entries whole.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

__all__ = ["BUDGET_CHARS", "MAX_CHARS", "MAX_OWNERS", "MISSING", "Readings"]

# Programs longer than this are read each time: the reading is a small part of such a
# program's run, and one would crowd out many short ones.
MAX_CHARS = 64 * 1024
# What one owner's entries may hold together, each counted as four times its
# program's length (the text is the key, and a value may hold it twice more: the
# erased text and the wrapped one) and a little for the entry itself. A character
# takes one to four bytes.
BUDGET_CHARS = 512 * 1024
ENTRY_CHARS = 256
MAX_OWNERS = 16

# What `find` returns for a decision not kept (None is a decision like any other).
MISSING = object()

_Key = tuple[Hashable, str]


class _Owned:
    """One owner's entries, least recently used first."""

    __slots__ = ("entries", "used")

    def __init__(self) -> None:
        self.entries: OrderedDict[_Key, object] = OrderedDict()
        self.used = 0


class Readings:
    """Bounded maps, one per owner, from (what was decided, program text) to the
    decision."""

    def __init__(self, budget_chars: int = BUDGET_CHARS) -> None:
        self._budget = budget_chars
        self._owners: OrderedDict[str, _Owned] = OrderedDict()
        # Readers run on the event loop and, for large programs, in worker threads.
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return sum(len(owned.entries) for owned in self._owners.values())

    def __repr__(self) -> str:
        return f"<Readings {len(self)} entries of {len(self._owners)} owners>"

    def find(self, owner: str, what: Hashable, code: str) -> object:
        """The decision kept for `owner`, `what` and `code`, or `MISSING`."""
        if len(code) > MAX_CHARS:  # never kept: not worth hashing
            return MISSING
        with self._lock:
            owned = self._owners.get(owner)
            if owned is None:
                return MISSING
            self._owners.move_to_end(owner)
            found = owned.entries.get((what, code), MISSING)
            if found is not MISSING:
                owned.entries.move_to_end((what, code))
            return found

    def keep(self, owner: str, what: Hashable, code: str, value: object) -> None:
        """Keep `value`, what was decided of `code` (if it is short enough)."""
        if len(code) > MAX_CHARS:
            return
        cost = _cost(code)
        with self._lock:
            owned = self._owned(owner)
            if (what, code) in owned.entries:  # another reader decided it meanwhile
                return
            owned.entries[(what, code)] = value
            owned.used += cost
            while owned.used > self._budget:
                (_, dropped), _ = owned.entries.popitem(last=False)
                owned.used -= _cost(dropped)

    def _owned(self, owner: str) -> _Owned:
        owned = self._owners.get(owner)
        if owned is None:
            owned = self._owners[owner] = _Owned()
            if len(self._owners) > MAX_OWNERS:
                self._owners.popitem(last=False)
        else:
            self._owners.move_to_end(owner)
        return owned


def _cost(code: str) -> int:
    return 4 * len(code) + ENTRY_CHARS
