"""Calls across the component boundary, for the two functions of our world
(`shims/world.wit`): the guest's `run` export and the host's `host-call` import. Both
take strings and return a string, so these calls convert strings and nothing else,
straight through Wasmtime's C API. The same for the one WASI function the host answers
that a guest calls on every run: the monotonic clock's `now` (`wasm_clock`), which
takes nothing and returns a u64.

wasmtime-py's generic calls read the function's type back from Wasmtime and build
Python objects for it on every call, in both directions: 0.1 to 0.2 ms of a trivial
JavaScript execution whose guest runs in ~0.35 ms (measured in-process on a two-core
VM), on the request path, and again for every tool call. What is done here is what
those calls do for strings, with the types known: Wasmtime still checks each value
against the function's type, so a component whose `run` is not `string -> string`
fails its call with Wasmtime's error rather than misbehaving.

Like `_wasmtime`, this uses wasmtime-py's ctypes bindings (`wasmtime._ffi`), whose
version is pinned; the tests call both functions through the real components.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
from collections.abc import Callable
from ctypes import byref
from typing import Any

import wasmtime
import wasmtime.component
from wasmtime import _ffi as ffi

__all__ = ["StringExport", "StringImport", "U64Import", "add_string_import", "add_u64_import"]

log = logging.getLogger(__name__)

# A host function of the world: two strings in, a string out. It runs in the thread
# running the guest, and whatever it raises traps the guest (see `_call_import`).
StringImport = Callable[[str, str], str]
# A host function that takes nothing and returns a u64, run and trapping alike.
U64Import = Callable[[], int]


class StringExport:
    """A component export of type `func(string) -> string`, called as `(store, text)`."""

    __slots__ = ("_func",)

    def __init__(self, func: wasmtime.component.Func) -> None:
        self._func = func

    def __repr__(self) -> str:
        return "<StringExport>"

    def __call__(self, store: wasmtime.Store, text: str) -> str:
        """Call the export in `store`; raises `wasmtime.WasmtimeError` for a trap."""
        param = ffi.wasmtime_component_val_t()
        param.kind = ffi.WASMTIME_COMPONENT_STRING
        param.of.string = ffi.str_to_capi(text)
        result = ffi.wasmtime_component_val_t()
        try:
            error = ffi.wasmtime_component_func_call(
                byref(self._func._func), store._context(), byref(param), 1, byref(result), 1
            )
        finally:
            ffi.wasmtime_component_val_delete(byref(param))
        if error:
            raise wasmtime.WasmtimeError._from_ptr(error)
        try:
            if result.kind != ffi.WASMTIME_COMPONENT_STRING.value:
                raise wasmtime.WasmtimeError(f"the export returned a value of kind {result.kind}")
            return ffi.to_str(result.of.string)
        finally:
            ffi.wasmtime_component_val_delete(byref(result))


# Every host function registered, by the number Wasmtime hands back with each call; a
# function leaves the table when Wasmtime frees what holds it (`_forget_import`).
_IMPORTS: dict[int, tuple[str, Any]] = {}
_NUMBERS = itertools.count(1)


def add_string_import(linker: wasmtime.component.Linker, name: str, function: StringImport) -> None:
    """Define `name` at the root of `linker` as a host function `func(string, string)
    -> string` answered by `function`.

    The linker holds `function` until it is freed: make it a module-level function, or
    whatever it reaches stays alive as long.
    """
    with linker.root() as root:
        _add_import(root, name, function, _call_import)


def add_u64_import(
    instance: wasmtime.component.LinkerInstance, name: str, function: U64Import
) -> None:
    """Define `name` in `instance` (a linker's root, or an instance in it) as a host
    function `func() -> u64` answered by `function`; held as `add_string_import`'s."""
    _add_import(instance, name, function, _call_u64_import)


def _add_import(
    instance: wasmtime.component.LinkerInstance, name: str, function: Any, callback: Any
) -> None:
    number = next(_NUMBERS)
    _IMPORTS[number] = (name, function)
    encoded = name.encode()
    error = ffi.wasmtime_component_linker_instance_add_func(
        instance.ptr(),
        ctypes.create_string_buffer(encoded),
        len(encoded),
        callback,
        number,
        _forget_import,
    )
    if error:
        _IMPORTS.pop(number, None)
        raise wasmtime.WasmtimeError._from_ptr(error)


@ffi.wasmtime_component_func_callback_t
def _call_import(
    number: int | None, _context: Any, _type: Any, args: Any, nargs: int, results: Any, _n: int
) -> int:
    # Nothing may unwind into Wasmtime from here: a failure becomes an error it turns
    # into a trap of the guest, saying which function failed.
    name = "a host function"
    try:
        name, function = _IMPORTS[number or 0]
        if nargs != 2:
            raise TypeError(f"{name} takes 2 strings, and was given {nargs} values")
        method, params = (_take_string(args[i]) for i in range(2))
        results[0].kind = ffi.WASMTIME_COMPONENT_STRING
        results[0].of.string = ffi.str_to_capi(function(method, params))
        return 0
    except BaseException as exc:
        log.exception("%s failed", name)
        error = wasmtime.WasmtimeError(f"{name} failed: {type(exc).__name__}: {exc}")
        return ctypes.cast(error._consume(), ctypes.c_void_p).value or 0


@ffi.wasmtime_component_func_callback_t
def _call_u64_import(
    number: int | None, _context: Any, _type: Any, _args: Any, nargs: int, results: Any, _n: int
) -> int:
    # As `_call_import`: nothing may unwind into Wasmtime.
    name = "a host function"
    try:
        name, function = _IMPORTS[number or 0]
        if nargs != 0:
            raise TypeError(f"{name} takes nothing, and was given {nargs} values")
        results[0].kind = ffi.WASMTIME_COMPONENT_U64
        results[0].of.u64 = function()
        return 0
    except BaseException as exc:
        log.exception("%s failed", name)
        error = wasmtime.WasmtimeError(f"{name} failed: {type(exc).__name__}: {exc}")
        return ctypes.cast(error._consume(), ctypes.c_void_p).value or 0


def _take_string(value: Any) -> str:
    """The string in a call's argument, whose bytes this call owns and frees (as
    wasmtime-py's own host functions do)."""
    if value.kind != ffi.WASMTIME_COMPONENT_STRING.value:
        raise TypeError(f"expected a string, got a value of kind {value.kind}")
    try:
        return ffi.to_str(value.of.string)
    finally:
        ffi.wasm_byte_vec_delete(byref(value.of.string))


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _forget_import(number: int | None) -> None:
    _IMPORTS.pop(number or 0, None)
