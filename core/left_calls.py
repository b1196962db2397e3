"""Calls going on after whoever made them is gone, and the room they may take.

A program may start tool calls and answer without waiting for them, as a Deno program
may: the calls go on to their end (nobody reads their answers). The daemon keeps their
arguments, and the requests made of them, outside every execution's memory, so their
number and bytes are bounded: a wasm-js executor's guests (`wasm_guest_calls`) and the
sandboxes' socket (a Deno or Pyodide worker that exited as it answered,
`daemon/connection.py`) each have a `LeftCalls`. Past its room, a call is cancelled
rather than left, so that run after run leaving calls behind cannot pile them up.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["LEFT_BYTES_MAX", "LEFT_CALLS_MAX", "Cancel", "LeftCalls"]

# Calls left going on at once, and the bytes of their arguments, in one `LeftCalls`.
LEFT_CALLS_MAX = 256
LEFT_BYTES_MAX = 64 * 1024 * 1024

# Cancels a call that was left (it lost its room to another caller's).
Cancel = Callable[[], None]


class LeftCalls:
    """Calls going on after their programs answered: how many, and the bytes of their
    arguments, in all and per caller (the client that started the program).

    A caller may hold an even share of each among the callers holding calls, itself
    included. One below its share that finds no room makes it: the oldest calls of
    whoever holds the most are cancelled (by the `cancel` each was taken with) until
    the call fits. So a caller alone may use all the room, and no caller, nor two, can
    keep another's calls from going on."""

    def __init__(self, limit: int = LEFT_CALLS_MAX, byte_limit: int = LEFT_BYTES_MAX) -> None:
        self.limit = limit
        self.byte_limit = byte_limit
        self.count = 0
        self.bytes = 0
        # Per caller, its calls in the order taken: key -> (bytes, cancel).
        self._held: dict[str, dict[object, tuple[int, Cancel]]] = {}
        self._bytes_of: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"<LeftCalls {self.count}/{self.limit}, {self.bytes}/{self.byte_limit} bytes>"

    def held(self, principal: str) -> tuple[int, int]:
        """`principal`'s calls and their bytes."""
        return len(self._held.get(principal, ())), self._bytes_of.get(principal, 0)

    def take(self, principal: str, key: object, size: int, cancel: Cancel) -> bool:
        """Count `principal`'s call `key`, with `size` bytes of arguments, if it is
        within the caller's share, making room for it if need be; False if it is not.
        `cancel` is called should the call later lose its room to another caller's."""
        callers = len(self._held) + (principal not in self._held)
        calls, used = self.held(principal)
        if calls + 1 > self.limit // callers or used + size > self.byte_limit // callers:
            return False
        while self.count + 1 > self.limit:
            self._evict(max(self._held, key=lambda caller: len(self._held[caller])))
        while self.bytes + size > self.byte_limit:
            self._evict(max(self._held, key=self._bytes_of.__getitem__))
        self._held.setdefault(principal, {})[key] = (size, cancel)
        self._bytes_of[principal] = used + size
        self.count += 1
        self.bytes += size
        return True

    def give_back(self, principal: str, key: object) -> None:
        """Call `key` is done; nothing if it was no longer counted (it lost its room)."""
        entry = self._held.get(principal, {}).get(key)
        if entry is not None:
            self._forget(principal, key, entry[0])

    def _evict(self, principal: str) -> None:
        """Cancel `principal`'s oldest call, no longer counting it."""
        key, (size, cancel) = next(iter(self._held[principal].items()))
        self._forget(principal, key, size)
        cancel()

    def _forget(self, principal: str, key: object, size: int) -> None:
        mine = self._held[principal]
        del mine[key]
        if mine:
            self._bytes_of[principal] -= size
        else:
            del self._held[principal], self._bytes_of[principal]
        self.count -= 1
        self.bytes -= size
