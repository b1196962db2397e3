"""Something a module's tests share, served by a Trio run in a thread of its own.

pytest-trio gives each test its own Trio run, so an executor or a daemon that several
tests use cannot live in any one of them: it lives in a run of its own, and tests call
into it through its token.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

import trio

from tests.sandboxes import LOAD_WAIT_S

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Served(Generic[T]):
    """`value`, served by a Trio run in a thread of its own until `scope` is cancelled."""

    value: T
    token: trio.lowlevel.TrioToken
    scope: trio.CancelScope

    async def call(self, function: Callable[..., Awaitable[R]], *args: Any) -> R:
        """`await function(*args)` in the serving run, from a test's own run. If the test
        is cancelled meanwhile, the call is left to end with the serving run."""
        call = partial(trio.from_thread.run, function, *args, trio_token=self.token)
        return await trio.to_thread.run_sync(call, abandon_on_cancel=True)

    async def call_sync(self, function: Callable[..., R], *args: Any) -> R:
        """`function(*args)` in the serving run (its state is not for other threads)."""
        call = partial(trio.from_thread.run_sync, function, *args, trio_token=self.token)
        return await trio.to_thread.run_sync(call, abandon_on_cancel=True)


@contextmanager
def serving_in_a_thread(start: Callable[[trio.Nursery], Awaitable[T]]) -> Iterator[Served[T]]:
    """Serve what `start` starts in the nursery it is given, in a Trio run in a thread of
    its own, until the block ends; what that run raised is raised here."""
    handoff: queue.Queue[Served[T] | BaseException] = queue.Queue()

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            value = await start(nursery)
            handoff.put(Served(value, trio.lowlevel.current_trio_token(), nursery.cancel_scope))

    def run() -> None:
        try:
            trio.run(serve)
        except BaseException as exc:  # handed to the test process, not lost in the thread
            handoff.put(exc)

    thread = threading.Thread(target=run, name="served-for-tests", daemon=True)
    thread.start()
    served = handoff.get(timeout=LOAD_WAIT_S)
    if isinstance(served, BaseException):
        raise served
    try:
        yield served
    finally:
        with suppress(trio.RunFinishedError):  # it ended already, raising
            trio.from_thread.run_sync(served.scope.cancel, trio_token=served.token)
        thread.join(LOAD_WAIT_S)
    assert not thread.is_alive(), "what the thread served did not stop"
    if not handoff.empty():
        raise handoff.get()
