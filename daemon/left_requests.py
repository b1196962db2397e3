"""A sandbox's requests that go on after the sandbox is gone.

A Deno or Pyodide worker makes its program's tool calls on one connection to the
sandboxes' socket, and a one-shot worker exits as soon as it has answered. The calls
its program started and never awaited are then still running in the daemon, or still
unread in the socket: like a wasm-js guest's (`executors/wasm_guest_calls.py`), they go
on to their end within the daemon's room for calls left behind (`LeftCalls`, charged to
the client that started the program), and are cancelled past it. Nobody reads their
answers.

A client connection is different: once its peer is gone, whatever it asked for is
cancelled (`Connection`). Only the sandboxes' socket hands its requests to a
`LeftRequests`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import trio

from conduit.core.left_calls import LeftCalls

__all__ = ["LeftRequests"]


@dataclass(slots=True)
class _Running:
    owner: str  # who the call is charged to: the client that started the program
    size: int  # bytes of the line it came in
    left: bool = False  # counted in `LeftCalls`


class LeftRequests:
    """One sandbox connection's requests in flight, and what becomes of them once its
    peer is gone (`peer_gone`); Trio thread only."""

    def __init__(self, left: LeftCalls) -> None:
        self._left = left
        self._running: dict[trio.CancelScope, _Running] = {}
        self.gone = False

    def __repr__(self) -> str:
        state = "gone" if self.gone else "connected"
        return f"<LeftRequests {len(self._running)} running, peer {state}>"

    @contextmanager
    def running(self, owner: str, size: int) -> Iterator[trio.CancelScope]:
        """Run a request of `owner`'s, `size` bytes, in the scope yielded: cancelled
        should its peer be gone and the room for calls left behind be full."""
        with trio.CancelScope() as scope:
            request = _Running(owner, size)
            self._running[scope] = request
            try:
                if self.gone:
                    self._leave(scope, request)
                yield scope
            finally:
                del self._running[scope]
                if request.left:
                    self._left.give_back(owner, scope)

    def peer_gone(self) -> None:
        """Nobody reads the answers any more: each request running goes on while there
        is room for it, and so does each read from now on."""
        if self.gone:
            return
        self.gone = True
        for scope, request in list(self._running.items()):
            self._leave(scope, request)

    def _leave(self, scope: trio.CancelScope, request: _Running) -> None:
        request.left = self._left.take(request.owner, scope, request.size, scope.cancel)
        if not request.left:
            scope.cancel()
