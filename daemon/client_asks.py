"""Requests the daemon sends to an MCP client, and the answers it waits for.

An upstream tool may ask the client that called it for something mid-call: a model's
completion (`sampling/createMessage`) or the user's input (`elicitation/create`).
Conduit passes such a request on to the client whose call it belongs to (see
`mcp_notifications.open_upstream_relay`) and waits for the answer, which the client
sends back on the same connection (or, over HTTP, in a POST of its own) as a JSON-RPC
response with the request's id.

`AskTable` is one peer's half of that: it numbers the requests, sends them, and hands
each answer to the task waiting for it. An answer with an id it did not send, or for
a request no longer waited for, is dropped: a client cannot answer another's request,
nor one that was never made. A peer has at most `MAX_WAITING` requests waiting at a
time; past that a request fails at once rather than queue behind a client that
answers nothing.

Resource handling: nothing to close. A waiting task is cancelled by its caller's
scope (the upstream call's end); its entry goes with it.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from conduit.core.errors import InternalError, Overloaded, RpcError

__all__ = ["MAX_WAITING", "AskTable", "declared_answers", "undeclared"]

# Each is an upstream call waiting on a person or a model; more than a few at once
# from one client is a runaway upstream, not a workflow.
MAX_WAITING = 8
# The most of a client's error message passed on.
_MAX_MESSAGE_CHARS = 1024
# The requests a client answers, by the capability it declares for them.
_METHODS = {"sampling": "sampling/createMessage", "elicitation": "elicitation/create"}


class _Waiting:
    __slots__ = ("answer", "done")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.answer: dict[str, Any] = {}


class AskTable:
    """One peer's requests in flight to it, by id."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._waiting: dict[str, _Waiting] = {}
        self._closed: str | None = None

    def __len__(self) -> int:
        """The requests still waiting for the peer's answer."""
        return sum(not waiting.done.is_set() for waiting in self._waiting.values())

    async def ask(
        self,
        send: Callable[[dict[str, Any]], Awaitable[object]],
        method: str,
        params: dict[str, Any],
    ) -> dict[str, Any]:
        """Send request `method` with `send` and return the client's `result`.

        Raises `RpcError`: the client's own error (its code and message), `Overloaded`
        when `MAX_WAITING` requests already wait, `InternalError` for an answer with
        neither a result object nor an error. Waits until answered or cancelled.
        """
        if self._closed is not None:
            raise InternalError(f"the client cannot answer {method}: {self._closed}")
        if len(self._waiting) >= MAX_WAITING:
            raise Overloaded(
                f"overloaded: {MAX_WAITING} requests already wait for this client's answer"
            )
        # A string no client request id needs to be unique against: ids are per direction.
        ident = f"conduit-{next(self._ids)}"
        waiting = self._waiting[ident] = _Waiting()
        try:
            await send({"jsonrpc": "2.0", "id": ident, "method": method, "params": params})
            await waiting.done.wait()
        finally:
            del self._waiting[ident]
        return _result(method, waiting.answer)

    def answer(self, message: dict[str, Any]) -> bool:
        """Hand a response from the client to the request it answers; False (and
        dropped) if no request with its id is waiting."""
        ident = message.get("id")
        waiting = self._waiting.get(ident) if isinstance(ident, str) else None
        if waiting is None or waiting.done.is_set():
            return False
        waiting.answer = message
        waiting.done.set()
        return True

    def close(self, reason: str) -> None:
        """No answer can come any more (`reason`): fail what waits, and what is asked."""
        self._closed = reason
        for waiting in self._waiting.values():
            waiting.answer = {"error": {"code": InternalError.code, "message": reason}}
            waiting.done.set()


def declared_answers(capabilities: dict[str, Any]) -> dict[str, frozenset[str]]:
    """The requests a client answers, from the capabilities it declared in
    `initialize`, each with the sub-capabilities declared for it (`tools` and `context`
    for sampling, `form` and `url` for elicitation; an empty elicitation is `form`)."""
    answers = {}
    for capability, method in _METHODS.items():
        declared = capabilities.get(capability)
        if isinstance(declared, dict):
            subs = frozenset(name for name, value in declared.items() if isinstance(value, dict))
            if capability == "elicitation" and not subs & {"form", "url"}:
                subs |= {"form"}
            answers[method] = subs
    return answers


def undeclared(answers: dict[str, frozenset[str]], method: str, params: dict[str, Any]) -> str:
    """What of request `method` with `params` the client did not declare it answers
    (MCP forbids sending it), or "" if nothing."""
    if method not in answers:
        return f"{method} (it did not declare the capability)"
    declared = answers[method]
    if method == "elicitation/create":
        mode = params.get("mode", "form")
        return "" if mode in declared else f"{mode!r}-mode elicitation"
    if (params.get("tools") or params.get("toolChoice")) and "tools" not in declared:
        return "sampling with tools"
    if params.get("includeContext", "none") != "none" and "context" not in declared:
        return "sampling with includeContext"
    return ""


def _result(method: str, answer: dict[str, Any]) -> dict[str, Any]:
    error = answer.get("error")
    if isinstance(error, dict):
        failure = RpcError.from_wire(error)
        failure.message = failure.message[:_MAX_MESSAGE_CHARS]
        raise failure
    result = answer.get("result")
    if not isinstance(result, dict):
        raise InternalError(
            f"the client answered {method} with neither a result object nor an error"
        )
    return result
