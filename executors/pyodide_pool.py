"""A pool of Pyodide worker processes, each running programs one at a time.

`HostPool` keeps `size` hosts (`pyodide_host.PyodideHost`) alive. A host is handed out
only while its next interpreter is ready; after its program, the one who took it gives
it back (`release`), and the pool has it make its next interpreter in the background
(`PyodideHost.recycle`) before handing it out again, or kills it when it may not run
another program. A host that dies, or is killed, is replaced, with back-off after
failed starts so a broken runtime costs one attempt every half minute.

A session takes a host for keeps (`take`): the pool forgets it and starts another in
its place, so sessions never hold what fresh programs run on; the session kills it.

Programs that wait (on a tool, a sleep) hold their host all the while: when every host
is running a program and none is making an interpreter, a program that waits for one
has the pool start another host, up to `max_size`; hosts beyond `size` are retired as
their program ends once no program waits, or after `SURPLUS_IDLE_S` unused.

The pool knows nothing about jobs: like `WarmPool` it changes its bookkeeping without
awaiting, and closes hosts as a separate, shielded step.

Resource handling: every host's task lives in the nursery that `run()` owns, in use or
not, so when `run()` is cancelled every host is stopped before `run()` returns.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from conduit.executors.pool import PoolState, StartRelay
from conduit.executors.pyodide_host import HostBroken, PyodideHost

__all__ = ["HostPool"]

log = logging.getLogger(__name__)

Start = Callable[..., Awaitable[Any]]

# After a failed start, wait before the next attempt, doubling up to the cap.
FIRST_BACKOFF_S = 0.1
MAX_BACKOFF_S = 30.0
# A host is replaced after this many programs, so nothing the runtime accumulates over
# a long life (its own caches, fragmentation) grows without bound; a new host (~1 s of
# CPU, compiling Pyodide) costs what a few programs' interpreters do.
MAX_JOBS_PER_HOST = 500
# Closing hosts is a kill and a reap each; past this, their tasks are left to end.
CLOSE_TIMEOUT_S = 5.0
# How long a host beyond `size` may wait unused before it retires: one started for a
# program that was served meanwhile serves the next that comes soon, rather than a host
# being started and killed for each (a start is ~1 s of CPU).
SURPLUS_IDLE_S = 10.0
# How long a program waits for an interpreter before the pool looks whether one is on
# its way. A short program takes well under this even on a busy machine, so only hosts
# busy with long ones (waiting on a tool, a sleep) make the pool start another.
GROW_CHECK_S = 0.5


class HostPool:
    """Keeps `size` Pyodide hosts (none: each is started when a program comes) and hands
    out those with an interpreter ready.

    `start(*, task_status)` must run one host until its process exits, calling
    `task_status.started(host)` once its first interpreter is ready; an exception before
    that is a failed start. `recycle_timeout_s` bounds making a next interpreter.
    """

    def __init__(
        self,
        start: Start,
        *,
        size: int,
        max_size: int,
        recycle_timeout_s: float,
        name: str = "pyodide",
    ) -> None:
        if not 0 <= size <= max_size or max_size < 1:
            raise ValueError(f"a Pyodide pool needs 0 <= size <= max_size, not {size}, {max_size}")
        self._start = start
        self._size = size
        self._max_size = max_size
        self._recycle_timeout_s = recycle_timeout_s
        self._name = name
        self._state = PoolState.CLOSED
        self._ready_send, self._ready = trio.open_memory_channel[PyodideHost](math.inf)
        # The hosts in `_ready` still alive, and since when they are: one that exits
        # there stays in the channel until `acquire` passes it over, and is not idle.
        self._idle_hosts: dict[PyodideHost, float] = {}
        self._live: set[PyodideHost] = set()
        self._busy: set[PyodideHost] = set()
        self._killed: set[PyodideHost] = set()
        # Taken for keeps: no longer the pool's, though their tasks run in its nursery.
        self._taken: set[PyodideHost] = set()
        self._starting = 0
        self._recycling = 0
        self._waiting = 0
        self._counts = dict.fromkeys(
            (
                "handed_out",
                "taken",
                "cold_starts",
                "refills",
                "deaths",
                "start_failures",
                "discarded",
            ),
            0,
        )
        self._refill_seconds_total = 0.0
        self._last_refill_s: float | None = None
        self._failures_in_a_row = 0
        # Why the latest start failed, while no start has succeeded since.
        self.last_failure: str | None = None
        self._changed = trio.Event()
        self._nursery: trio.Nursery | None = None

    def __repr__(self) -> str:
        return (
            f"<HostPool {self._name} [{self._state.name}] [Hosts: {self._idle()} ready, "
            f"{self._recycling} recycling, {self._starting} starting, {len(self._busy)} "
            f"running | target {self._size}]>"
        )

    @property
    def processes(self) -> int:
        """Hosts alive now, in any state."""
        return len(self._live)

    def _idle(self) -> int:
        return len(self._idle_hosts)

    def statistics(self) -> dict[str, Any]:
        """A snapshot of the pool, in `WarmPool.statistics()`'s terms where they fit:
        an idle host has its interpreter ready; a starting one is being started or is
        making its next interpreter."""
        return {
            "state": self._state.value,
            "size": self._size,
            "max_size": self._max_size,
            "processes": len(self._live),
            "idle": self._idle(),
            "starting": self._starting + self._recycling,
            "in_use": len(self._busy),
            "waiting": self._waiting,
            **self._counts,
            "refill_seconds_total": self._refill_seconds_total,
            "last_refill_s": self._last_refill_s,
        }

    # -- handing out -------------------------------------------------------------------

    async def acquire(self, within_s: float) -> PyodideHost | None:
        """A host whose interpreter is ready, waiting at most `within_s` for one; None
        if none was. The caller runs one program on it, then must `release` it."""
        try:
            host = self._ready.receive_nowait()
            self._idle_hosts.pop(host, None)
        except trio.WouldBlock:
            host = None
            self._counts["cold_starts"] += 1
            if not self._live:
                self._grow()  # a pool of none starts its hosts on demand
        deadline = trio.current_time() + within_s
        while host is None or not host.alive:
            host = None
            self._waiting += 1
            try:
                with trio.move_on_at(min(deadline, trio.current_time() + GROW_CHECK_S)):
                    host = await self._ready.receive()
                    self._idle_hosts.pop(host, None)
            finally:
                self._waiting -= 1
            if host is None:
                if trio.current_time() >= deadline:
                    return None
                self._grow()
        self._busy.add(host)
        self._counts["handed_out"] += 1
        return host

    async def take(self, within_s: float) -> PyodideHost | None:
        """`acquire`, for keeps: the host is no longer the pool's, which starts another
        in its place; the caller kills it when done with it."""
        host = await self.acquire(within_s)
        if host is not None:
            self._busy.discard(host)
            self._live.discard(host)
            self._taken.add(host)
            self._counts["taken"] += 1
            self._changed.set()
        return host

    def release(self, host: PyodideHost, reusable: bool) -> None:
        """Take back `host` after its program: it makes its next interpreter in the
        background, or, when not `reusable` (or worn out), it is killed and replaced."""
        self._busy.discard(host)
        worn = host.jobs >= MAX_JOBS_PER_HOST
        if not reusable or self._surplus() or worn or self._nursery is None:
            self._discard(host)
            return
        self._recycling += 1
        self._nursery.start_soon(self._recycle, host)

    async def _recycle(self, host: PyodideHost) -> None:
        began = trio.current_time()
        try:
            await host.recycle(self._recycle_timeout_s)
        except HostBroken as exc:
            log.warning("%s: a worker process was replaced: %s", self._name, exc)
            self._discard(host)
        else:
            self._note_refill(trio.current_time() - began)
            self._make_idle(host)
        finally:
            self._recycling -= 1

    def _discard(self, host: PyodideHost) -> None:
        self._counts["discarded"] += 1
        self._killed.add(host)
        host.kill()

    # -- keeping the pool filled -------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep `size` hosts alive until cancelled; `started()` once the first round of
        starts is under way (a program may wait for one to be ready)."""
        if self._state is not PoolState.CLOSED or self._nursery is not None:
            raise RuntimeError(f"{self!r} is already running; run() may be called once")
        self._state = PoolState.STARTING
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    self._fill()
                    task_status.started()
                    self._state = PoolState.READY
                    await self._keep_filled()
                finally:
                    self._state = PoolState.DRAINING
                    with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT_S):
                        for host in [*self._live, *self._taken]:
                            await host.aclose()
        finally:
            self._nursery = None
            self._state = PoolState.CLOSED

    def _grow(self) -> None:
        """One more host, if a program waits and no interpreter is on its way: every host
        runs a program, which may take any time (a tool call, a sleep). While one is
        making an interpreter, programs wait for it rather than for a new host (~1 s of
        CPU, which would only slow everything on a busy machine)."""
        if self._nursery is None or self._recycling + self._starting > 0:
            return
        if len(self._live) + self._starting >= self._max_size:
            return
        self._starting += 1
        self._nursery.start_soon(self._start_one)

    def _fill(self) -> None:
        assert self._nursery is not None
        while len(self._live) + self._starting < self._size:
            self._starting += 1
            self._nursery.start_soon(self._start_one)

    async def _keep_filled(self) -> None:
        while True:
            self._fill()
            await self._changed.wait()
            self._changed = trio.Event()

    async def _start_one(self) -> None:
        """Start one host (already counted in `_starting`) and run it until it exits."""
        assert self._nursery is not None
        relay: StartRelay[PyodideHost] = StartRelay(trio.TASK_STATUS_IGNORED, self._adopt)
        try:
            await self._start(task_status=relay)
        except Exception as exc:
            if relay.worker is not None:
                # Its process is gone all the same; it is replaced like any other.
                log.warning("%s: a worker process failed: %s", self._name, exc)
                return
            self._counts["start_failures"] += 1
            self._failures_in_a_row += 1
            self.last_failure = str(exc)
            log.warning("%s: could not start a worker process: %s", self._name, exc)
            # Still counted as starting, so no other start is attempted meanwhile.
            exponent = min(self._failures_in_a_row - 1, 20)
            await trio.sleep(min(FIRST_BACKOFF_S * math.pow(2, exponent), MAX_BACKOFF_S))
        finally:
            if relay.worker is None:
                self._starting -= 1
            else:
                self._forget(relay.worker)
            self._changed.set()

    def _adopt(self, host: PyodideHost, took_s: float) -> None:
        self._starting -= 1
        self._failures_in_a_row = 0
        self.last_failure = None
        self._live.add(host)
        self._note_refill(took_s)
        if self._state is PoolState.DRAINING:
            host.kill()
        else:
            self._make_idle(host)

    def _note_refill(self, took_s: float) -> None:
        self._counts["refills"] += 1
        self._refill_seconds_total += took_s
        self._last_refill_s = took_s

    def _make_idle(self, host: PyodideHost) -> None:
        """Hand `host` to the next program; one beyond `size` with no program waiting
        (started for a waiter that another host served, or that gave up) retires if
        none comes for `SURPLUS_IDLE_S`, rather than idle for ever, holding its memory."""
        since = trio.current_time()
        self._idle_hosts[host] = since
        self._ready_send.send_nowait(host)
        if self._surplus() and self._nursery is not None:
            self._nursery.start_soon(self._retire_if_unused, host, since)

    async def _retire_if_unused(self, host: PyodideHost, since: float) -> None:
        await trio.sleep(SURPLUS_IDLE_S)
        # Still idle since then (not handed out and back meanwhile), and still beyond.
        if self._idle_hosts.get(host) == since and self._surplus():
            self._idle_hosts.pop(host, None)
            self._discard(host)

    def _surplus(self) -> bool:
        """Whether the pool holds more hosts than `size` while no program waits."""
        return len(self._live) - len(self._killed) > self._size and self._waiting == 0

    def _forget(self, host: PyodideHost) -> None:
        self._idle_hosts.pop(host, None)
        if host in self._taken:
            self._taken.discard(host)
            return
        self._live.discard(host)
        if host in self._killed:
            self._killed.discard(host)
        elif host not in self._busy and self._state is not PoolState.DRAINING:
            self._counts["deaths"] += 1
            log.warning("%s: a worker process exited on its own; replacing it", self._name)
        self._busy.discard(host)
