"""An upstream's requests of the client that called its tool: sampling, elicitation.

An upstream with `ask_clients` set may send `sampling/createMessage` or
`elicitation/create` while one of its tools runs. `SessionKeeper` finds the call it
belongs to (its solo call, as for log messages) and hands the request here, with the
call's `CallObserver`, whose `ask` passes it to the client and returns the answer.

While a call's client is being asked, the call's own deadline stands still: a person
may take a while to answer, and a call given up over it would keep its connection from
relaying anything more (see `SessionKeeper._observing`). Each request waits at most
`ASK_TIMEOUT_S` instead, and all of a call's end with the call.

An answer goes back to the upstream only once it parses as the request's result and
nests no deeper than `MAX_DEPTH`; anything else, and any refusal, reaches the upstream
as a JSON-RPC error that says what happened.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
import trio
from pydantic import BaseModel, TypeAdapter, ValidationError

from conduit.core import jsontext
from conduit.core.errors import RpcError
from conduit.gateway.upstream import CallObserver

__all__ = ["ASK_TIMEOUT_S", "MAX_DEPTH", "CallAsks"]

# Long enough for a person to read a form and answer it; past it the tool is told so.
ASK_TIMEOUT_S = 600.0
# Sampling results and elicited forms are shallow; deeper is an attack on whoever
# serializes it next (the SDK gives up past ~1,000 levels, noisily).
MAX_DEPTH = 64
# What a client's answer to a relayed request must be, by method.
_RESULTS: dict[str, TypeAdapter[Any]] = {
    "sampling/createMessage": TypeAdapter(
        types.CreateMessageResult | types.CreateMessageResultWithTools
    ),
    "elicitation/create": TypeAdapter(types.ElicitResult),
}


@dataclass(slots=True)
class _Asking:
    """One call's requests waiting on its client, and its deadline while they do."""

    deadline: trio.CancelScope | None
    paused_at: float
    saved_deadline: float
    scopes: set[trio.CancelScope] = field(default_factory=set)


class CallAsks:
    """The requests waiting on calls' clients, by call key (one upstream's)."""

    def __init__(self) -> None:
        self._asking: dict[int, _Asking] = {}

    def __len__(self) -> int:
        """How many requests wait on clients."""
        return sum(len(asking.scopes) for asking in self._asking.values())

    async def relay(
        self,
        key: int,
        observer: CallObserver,
        deadline: trio.CancelScope | None,
        method: str,
        params: BaseModel,
    ) -> BaseModel:
        """Ask call `key`'s client (`observer.ask`); its result, or an `ErrorData`."""
        assert observer.ask is not None
        asking = self._pause(key, deadline)
        scope = trio.CancelScope(deadline=trio.current_time() + ASK_TIMEOUT_S)
        asking.scopes.add(scope)
        answer: dict[str, Any] | None = None
        try:
            with scope:
                answer = await observer.ask(
                    method, params.model_dump(by_alias=True, mode="json", exclude_none=True)
                )
        except RpcError as exc:
            return types.ErrorData(code=exc.code, message=exc.message)
        finally:
            self._resume(key, scope)
        if answer is None:
            timed_out = trio.current_time() >= scope.deadline
            waited = "no answer came" if timed_out else "the call ended"
            return types.ErrorData(
                code=types.INTERNAL_ERROR,
                message=f"{waited} before the client answered {method}",
            )
        return _result(method, answer)

    def end(self, key: int) -> None:
        """Call `key` is over: stop waiting on its client."""
        asking = self._asking.pop(key, None)
        for scope in asking.scopes if asking else ():
            scope.cancel()

    def _pause(self, key: int, deadline: trio.CancelScope | None) -> _Asking:
        asking = self._asking.get(key)
        if asking is None:
            saved = deadline.deadline if deadline is not None else math.inf
            asking = self._asking[key] = _Asking(deadline, trio.current_time(), saved)
            if deadline is not None:
                deadline.deadline = math.inf
        return asking

    def _resume(self, key: int, scope: trio.CancelScope) -> None:
        """The call's deadline runs again, later by as long as it stood still, once
        none of its requests waits."""
        asking = self._asking.get(key)
        if asking is None:
            return
        asking.scopes.discard(scope)
        if asking.scopes:
            return
        del self._asking[key]
        if asking.deadline is not None:
            paused_for = trio.current_time() - asking.paused_at
            asking.deadline.deadline = asking.saved_deadline + paused_for


def _result(method: str, answer: dict[str, Any]) -> BaseModel:
    if jsontext.depth(answer, MAX_DEPTH) > MAX_DEPTH:
        return types.ErrorData(
            code=types.INVALID_PARAMS,
            message=f"the client's answer to {method} nests deeper than {MAX_DEPTH} levels",
        )
    try:
        result: BaseModel = _RESULTS[method].validate_python(answer)
    except ValidationError as exc:
        first = str(exc).splitlines()[:3]
        return types.ErrorData(
            code=types.INVALID_PARAMS,
            message=f"the client answered {method} with something that is not its "
            f"result: {' '.join(first)[:500]}",
        )
    return result
