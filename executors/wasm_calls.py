"""Calls across the component boundary, for the two functions of our world
(`shims/world.wit`): the guest's `run` export and the host's `host-call` import, both
of strings; and for the one WASI function the host answers that a guest calls on every
run: the monotonic clock's `now` (`wasm_clock`), which takes nothing and returns a u64.

They go through wasmtime-py's public component API, which reads each function's type
back from Wasmtime on every call. Calls straight through the C API, with the types
known, took 4 to 7% off a trivial execution or a loop of tool calls, end to end: not
enough to reach into wasmtime-py's private parts for.

What this module adds is the contract of the host functions: whatever one raises
traps the guest with a message naming it. wasmtime-py turns a `WasmtimeError` raised by
a host function into a trap, but keeps any other exception in a process-wide global
and raises it from whichever call next traps, in any thread; so a host function here
raises nothing else.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import wasmtime
import wasmtime.component

__all__ = [
    "GuestEnded",
    "StringExport",
    "StringImport",
    "U64Import",
    "add_string_import",
    "add_u64_import",
]

log = logging.getLogger(__name__)

# A host function of the world: two strings in, a string out. It runs in the thread
# running the guest, and whatever it raises traps the guest.
StringImport = Callable[[str, str], str]
# A host function that takes nothing and returns a u64, run and trapping alike.
U64Import = Callable[[], int]


class GuestEnded(Exception):
    """Raised by a host function to end the guest's run on purpose: it traps the guest,
    and nothing is logged."""


class StringExport:
    """A component export of type `func(string) -> string`, called as `(store, text)`."""

    __slots__ = ("_func",)

    def __init__(self, func: wasmtime.component.Func) -> None:
        self._func = func

    def __repr__(self) -> str:
        return "<StringExport>"

    def __call__(self, store: wasmtime.Store, text: str) -> str:
        """Call the export in `store`; raises `wasmtime.WasmtimeError` for a trap, or
        for an export of another type (Wasmtime checks each value)."""
        answer = self._func(store, text)
        if not isinstance(answer, str):
            raise wasmtime.WasmtimeError(f"the export returned {type(answer).__name__}, not str")
        return answer


def add_string_import(linker: wasmtime.component.Linker, name: str, function: StringImport) -> None:
    """Define `name` at the root of `linker` as a host function `func(string, string)
    -> string` answered by `function`.

    The linker holds `function` until it is freed: make it a module-level function, or
    whatever it reaches stays alive as long.
    """
    with linker.root() as root:
        root.add_func(name, _trapping(name, str, lambda _store, *strings: function(*strings)))


def add_u64_import(
    instance: wasmtime.component.LinkerInstance, name: str, function: U64Import
) -> None:
    """Define `name` in `instance` (a linker's root, or an instance in it) as a host
    function `func() -> u64` answered by `function`; held as `add_string_import`'s."""
    instance.add_func(name, _trapping(name, int, lambda _store: function()))


def _trapping(name: str, returns: type, function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, raising only the `WasmtimeError` that traps the guest (logged), also
    when it returns something other than `returns`."""

    def call(*args: Any) -> Any:
        try:
            answer = function(*args)
            if not isinstance(answer, returns) or isinstance(answer, bool):
                raise TypeError(f"it returned {type(answer).__name__}, not {returns.__name__}")
            return answer
        except GuestEnded:
            raise wasmtime.WasmtimeError(f"{name} ended the run") from None
        except BaseException as exc:
            log.exception("%s failed", name)
            raise wasmtime.WasmtimeError(f"{name} failed: {type(exc).__name__}: {exc}") from None

    return call
