"""Calls a guest starts and collects later, so that its event loop runs meanwhile.

A JavaScript program does not stop for a tool call: `Promise.all` of three calls runs
them at once, a `Promise.race` against a timer can be won by the timer, and an interval
ticks while a call is out, as on Deno. A guest with an event loop (wasm-js) therefore
makes its calls through one host call, `calls/wait`:

    {"start": [{"ticket": n, "call": {"method", "params"}}, ...], "timeout_ms": t | null}

It starts the calls listed, each a task of the executor's nursery (`GuestCalls`)
dispatched under the execution's session as a blocking call is, then waits until some
call is done or `timeout_ms` has passed (the guest's next timer is due), and answers
every call done since the last wait: `[[ticket, <JSON-RPC answer>], ...]`. Tickets are
the guest's own numbers, only handed back. The guest sends its calls as it polls, so a
program awaiting one call after another pays one host call for each, as with a call
that blocks; and such a call, alone and waited for with no timer due, is awaited by the
waiting task itself, with no task of its own (`GuestCalls.alone`). The wait gives the
CPU slot up, as a blocking call does, and the executor's `_Execution.host_call` scopes
it, so that a stop or a timeout ends it.

A call still out when the run answers goes on to its end, as a call a Deno program
started and did not await does, while the executor has room for it (`LeftCalls`: at
most `LEFT_CALLS_MAX` such calls holding `LEFT_BYTES_MAX` of arguments, each caller an
even share of both among the callers leaving calls); it is cancelled otherwise, or later,
should another caller need the room it holds beyond its share. Nobody collects its
answer. The executor's nursery owns it, so it ends with the executor at the latest,
and the gateway bounds each call's time. The calls a program sends only as it answers
(`last`) are made within what is left of its `limits.tool_calls`: past it they are
dropped, as a Deno worker's are once it has answered, rather than have the finished
program stopped over the limit. A program that failed or was stopped (its time up,
cancelled, over a limit) has its calls cancelled.
Before the execution is reported, every call the guest started has begun (`begun`): it
was counted and authorised while its execution ran, never refused as late.

A long wait's JSON goes on the guest's stdout rather than in the host call: the guest
announces it with `calls/pipe` ({"length": the most UTF-8 bytes it can take}), writes
it as one line, and sends `calls/wait` with empty params, which takes that line (see
`wasm_fs.GuestFiles.pipe_text`). A string handed to `host-call` crosses through the
componentize-js bindings, which measure it in a JavaScript loop (~0.5 µs a character,
46 ms for a 100 KiB argument) and never free the copy they make (1 MiB arguments ran
a 128 MB guest out of memory in 9 calls); the engine writes stdout natively, and
frees what it wrote.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from conduit.core import jsontext
from conduit.core.errors import RpcError
from conduit.core.left_calls import LeftCalls

__all__ = [
    "CALLS_OUT_MAX",
    "INTERNAL_ERROR",
    "PIPE_METHOD",
    "WAIT_METHOD",
    "GuestCalls",
    "StartedCall",
    "WaitRequest",
    "answers_text",
    "rpc_error",
]

log = logging.getLogger(__name__)

WAIT_METHOD = "calls/wait"
# The host call that announces a wait's JSON on stdout (above).
PIPE_METHOD = "calls/pipe"
# Calls one execution may have out at once (guest.js holds the rest back): enough for
# any fan-out a program means, few enough that a loop starting calls it never awaits
# cannot fill the daemon with tasks.
CALLS_OUT_MAX = 256
# JSON-RPC "internal error", for a call that failed other than with an RpcError.
INTERNAL_ERROR = -32603
# The largest ticket: an integer a JavaScript number holds exactly.
MAX_TICKET = 2**53
# A wait this long or longer is a wait with no time limit: a year, in milliseconds.
MAX_WAIT_MS = 365 * 24 * 3600 * 1000

Request = Callable[[str, dict[str, Any]], Awaitable[Any]]
# A call's answer: (its ticket, True, its result) or (its ticket, False, the JSON-RPC
# error answer as text). Results are encoded by `answers_text` in the guest's thread,
# never on the event loop: a tool's result may be large.
Answer = tuple[int, bool, Any]


@dataclass(frozen=True, slots=True)
class StartedCall:
    ticket: int
    method: str
    params: dict[str, Any]
    size: int = 0  # bytes of its arguments as UTF-8 JSON (see `WaitRequest.parse`)


@dataclass(frozen=True, slots=True)
class WaitRequest:
    """A `calls/wait`, read and checked."""

    start: tuple[StartedCall, ...]
    timeout_s: float  # `inf`: until a call is done
    # Sent as the run answers: what the program started and never waited for.
    last: bool = False

    @classmethod
    def parse(cls, params: Any, text: str = "") -> WaitRequest:
        """Raises ValueError, saying what is wrong, for anything but the shape above.
        `text` is what `params` was read from: a call alone in it is charged the
        text's bytes; calls sharing it are each measured, as UTF-8."""
        if not isinstance(params, dict) or not isinstance(params.get("start", []), list):
            raise ValueError("params must be {start: [...], timeout_ms}")
        items = params.get("start", [])
        alone = len(text.encode("utf-8", "surrogatepass")) if len(items) == 1 else None
        return cls(
            tuple(_started(item, alone) for item in items),
            _timeout_s(params.get("timeout_ms")),
            params.get("last") is True,
        )


def _started(item: Any, size: int | None) -> StartedCall:
    ticket = item.get("ticket") if isinstance(item, dict) else None
    call = item.get("call") if isinstance(item, dict) else None
    if not _is_ticket(ticket) or not isinstance(call, dict):
        raise ValueError("each call started is {ticket: integer, call: {method, params}}")
    method, params = call.get("method"), call.get("params")
    if not isinstance(method, str) or not isinstance(params, dict):
        raise ValueError("a call is {method: string, params: object}")
    if size is None:
        size = len(jsontext.encode(params))
    return StartedCall(ticket, method, params, size)


def _is_ticket(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TICKET


def _timeout_s(timeout_ms: Any) -> float:
    if timeout_ms is None:
        return math.inf
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int | float):
        raise ValueError("timeout_ms must be a number of milliseconds or null")
    if not timeout_ms >= 0:  # NaN too
        raise ValueError("timeout_ms must not be negative")
    # Past any execution's time, a wait is as long as it takes (the deadline ends it);
    # a huge integer would not even divide into a float.
    return math.inf if timeout_ms >= MAX_WAIT_MS else timeout_ms / 1000


class GuestCalls:
    """One execution's started calls (see the module doc); Trio thread only."""

    def __init__(
        self,
        request: Request,
        nursery: trio.Nursery | None,
        left: LeftCalls | None = None,
        principal: str | None = None,
    ) -> None:
        self._request = request
        self._nursery = nursery
        self._left = LeftCalls(limit=0) if left is None else left
        self._principal = principal or ""
        self._out = 0  # started, not yet done
        self._unbegun = 0
        self._done: list[Answer] = []  # not yet collected
        self._arrived = trio.Event()
        # The calls out, each by its scope, with whether it is counted in `_left`.
        self._scopes: dict[trio.CancelScope, tuple[StartedCall, bool]] = {}
        self._cancelled = False

    def __repr__(self) -> str:
        return f"<GuestCalls {self._out} out, {len(self._done)} done>"

    def start(self, call: StartedCall) -> None:
        """Start `call` as a task of its own; it runs once the caller yields."""
        if self._out >= CALLS_OUT_MAX:
            message = f"too many calls out at once (at most {CALLS_OUT_MAX}): await some first"
            self._finish((call.ticket, False, rpc_error(INTERNAL_ERROR, message)))
            return
        try:
            if self._nursery is None:
                raise RuntimeError("the executor is not being served")
            self._nursery.start_soon(self._call, call)
        except RuntimeError:  # the nursery is closed: the executor is stopping
            stopping = rpc_error(INTERNAL_ERROR, "the executor is stopping")
            self._finish((call.ticket, False, stopping))
            return
        self._out += 1
        self._unbegun += 1

    async def _call(self, call: StartedCall) -> None:
        # Runs into the dispatcher before it first yields: authorised and counted.
        self._unbegun -= 1
        answer = None
        with trio.CancelScope() as scope:
            self._scopes[scope] = (call, False)
            if self._cancelled:
                scope.cancel()
            try:
                answer = await self._answer(call)
            finally:
                if self._scopes.pop(scope)[1]:
                    self._left.give_back(self._principal, scope)
                self._out -= 1
        if answer is not None:
            self._finish(answer)

    async def _answer(self, call: StartedCall) -> Answer:
        try:
            return call.ticket, True, await self._request(call.method, call.params)
        except RpcError as exc:
            return call.ticket, False, rpc_error(exc.code, exc.message, exc.data)
        except Exception as exc:  # never into the executor's nursery
            log.exception("a guest's %s failed", call.method)
            error = rpc_error(INTERNAL_ERROR, f"internal error: {type(exc).__name__}")
            return call.ticket, False, error

    def alone(self, wait: WaitRequest) -> StartedCall | None:
        """The one call `wait` starts, if nothing else is out or done and the guest will
        wait for as long as it takes (it has no timer): that call then needs no task of
        its own, as the guest runs nothing until it is answered (see `answer_alone`)."""
        if len(wait.start) != 1 or wait.timeout_s != math.inf or self._out or self._done:
            return None
        return wait.start[0]

    async def answer_alone(self, call: StartedCall) -> list[Answer]:
        """`call`'s answer to the wait that started it, awaited in the waiting task."""
        return [await self._answer(call)]

    def cancel(self) -> None:
        """Cancel the calls out, and any started later: the program was stopped."""
        self._cancelled = True
        for scope in self._scopes:
            scope.cancel()

    def leave(self) -> None:
        """The run has answered: each call still out goes on while the executor's
        `LeftCalls` has room for it, and is cancelled otherwise."""
        self._cancelled = True  # nothing is started after the answer
        for scope, (call, _) in self._scopes.items():
            if self._left.take(self._principal, scope, call.size, scope.cancel):
                self._scopes[scope] = (call, True)
            else:
                scope.cancel()

    def _finish(self, answer: Answer) -> None:
        self._done.append(answer)
        self._arrived.set()

    async def begun(self) -> None:
        """Return once every call started has begun."""
        while self._unbegun:
            await trio.lowlevel.checkpoint()

    def collect_nowait(self) -> list[Answer] | None:
        """The answers of the calls done since the last collection; None if none is
        done and some are still out."""
        if not self._done and self._out:
            return None
        done, self._done = self._done, []
        self._arrived = trio.Event()
        return done

    async def collect(self, timeout_s: float) -> list[Answer]:
        """`collect_nowait`, waiting up to `timeout_s` for a call to be done."""
        with trio.move_on_after(timeout_s):
            await self._arrived.wait()
        return self.collect_nowait() or []


def answers_text(answers: list[Answer]) -> str:
    """The JSON-RPC answer to `calls/wait` for `answers` (the guest's thread: see
    `Answer`). jsontext: a lone surrogate in a result would not cross into the guest."""
    parts = (
        f"[{ticket},{jsontext.dumps({'result': value}) if ok else value}]"
        for ticket, ok, value in answers
    )
    return '{"result":[' + ",".join(parts) + "]}"


def rpc_error(code: int, message: str, data: Any = None) -> str:
    """A JSON-RPC error answer as text; `data` kept only if it is an object."""
    error: dict[str, Any] = {"code": code, "message": message}
    if isinstance(data, dict):
        error["data"] = data
    return jsontext.dumps({"error": error})
