"""Wasmtime's C API where wasmtime-py offers no public way to it: the one module that
reaches into wasmtime-py's private `wasmtime._ffi`, for two things:

- the pooling allocator (`use_pooling_allocator`, see `_wasmtime.new_engine`): without
  it, an execution arriving a moment after the last (as an agent's do) takes a quarter
  to nearly half longer end to end, and 8 clients finish a fifth fewer realistic
  programs a second; executions sent back to back gain nothing from it (the pool's
  reset then competes with the next one for the CPU);
- a store's epoch-deadline callback (`deadline_callback`, `set_deadline_callback`),
  through which each store decides at every tick, on its guest's thread, whether the
  guest goes on (`_wasmtime.Interrupt`): stores then share their executor's engine,
  and a guest back from a wait takes a CPU slot again before it runs on (`wasm_slots`).
  It buys no speed on its own; it is what holds computing guests to the CPU slots.
  Without it, guests under load share the cores and each is charged the others'
  time: sixteen programs computing 0.7 s each with a 5 s timeout on two cores all
  time out, where with it all finish.

`AVAILABLE` says whether callers may use it: only with the wasmtime version pinned in
pyproject.toml (private names change without notice), with every name it uses present,
and unless the environment sets `CONDUIT_PUBLIC_APIS_ONLY`. Otherwise each caller takes
its public path (the tests run both), and why is logged once:

- instances map fresh memory for each execution (no pool), which is slower;
- each runner has an engine of its own, whose epoch moves only to stop its store's
  guest: the ticker's thread checks each execution's deadline and limits, and a stop
  takes effect as promptly as with the callback. But guests that compute are not
  held to the CPU slots (`wasm_slots`: no tick reaches their threads).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import logging
import os
from collections.abc import Callable
from typing import Any

import wasmtime

try:
    from wasmtime import _ffi as ffi
except ImportError:  # a wasmtime-py that moved it
    ffi = None

__all__ = [
    "AVAILABLE",
    "CONTINUE",
    "PINNED_VERSION",
    "PUBLIC_ONLY_ENV",
    "UNAVAILABLE_REASON",
    "DeadlineFunction",
    "deadline_callback",
    "new_error",
    "set_deadline_callback",
    "use_pooling_allocator",
]

log = logging.getLogger(__name__)

# The version in pyproject.toml: the only one whose private names were checked.
PINNED_VERSION = "50.0.1"
# Set (to anything but "" or "0") to take the public paths.
PUBLIC_ONLY_ENV = "CONDUIT_PUBLIC_APIS_ONLY"

# What this module takes from `wasmtime._ffi`.
FFI_NAMES = (
    "wasmtime_context_t",
    "wasmtime_error_new",
    "wasmtime_pooling_allocation_config_new",
    "wasmtime_pooling_allocation_config_delete",
    "wasmtime_pooling_allocation_strategy_set",
    "wasmtime_store_epoch_deadline_callback",
    "wasmtime_update_deadline_kind_t",
)
# The pooling allocator's settings `use_pooling_allocator` takes, each set by
# `wasmtime_pooling_allocation_config_<name>_set`.
POOL_SETTINGS = (
    "total_component_instances",
    "max_core_instances_per_component",
    "total_core_instances",
    "max_memories_per_component",
    "total_memories",
    "max_tables_per_component",
    "total_tables",
    "max_memory_size",
    "total_stacks",
    "linear_memory_keep_resident",
    "table_keep_resident",
    "max_unused_warm_slots",
)
# The deadline callback's answer that lets the guest run on (wasmtime.h).
CONTINUE = 0


def _unavailable_reason() -> str | None:
    """Why the private paths are not to be used, or None if they may be."""
    if os.environ.get(PUBLIC_ONLY_ENV, "") not in ("", "0"):
        return f"{PUBLIC_ONLY_ENV} is set"
    version = importlib.metadata.version("wasmtime")
    if version != PINNED_VERSION:
        return f"wasmtime is {version}, not {PINNED_VERSION}"
    if ffi is None:
        return "wasmtime has no _ffi module"
    wanted = [*FFI_NAMES, *(f"wasmtime_pooling_allocation_config_{s}_set" for s in POOL_SETTINGS)]
    missing = [name for name in wanted if not hasattr(ffi, name)]
    return f"wasmtime lacks {', '.join(missing)}" if missing else None


UNAVAILABLE_REASON = _unavailable_reason()
# Read at each use (tests turn it off to run the public paths).
AVAILABLE = UNAVAILABLE_REASON is None
if not AVAILABLE:
    log.warning(
        "using wasmtime's public API only (%s): executions run slower, and guests "
        "that compute are not held to the CPU slots",
        UNAVAILABLE_REASON,
    )


# -- the pooling allocator -----------------------------------------------------------


def use_pooling_allocator(config: wasmtime.Config, **settings: int) -> None:
    """Make `config`'s engines allocate instances from a pool; each of `settings` (names
    from `POOL_SETTINGS`) sets that bound of the pool."""
    pool = ffi.wasmtime_pooling_allocation_config_new()
    try:
        for name, value in settings.items():
            getattr(ffi, f"wasmtime_pooling_allocation_config_{name}_set")(pool, value)
        ffi.wasmtime_pooling_allocation_strategy_set(config.ptr(), pool)
    finally:
        ffi.wasmtime_pooling_allocation_config_delete(pool)


# -- the epoch-deadline callback -----------------------------------------------------

# `(context, data, delta, kind) -> error`: called on the guest's thread when the store's
# epoch deadline passes; it sets `delta[0]` (ticks to the next call) and `kind[0]`
# (`CONTINUE`) and returns 0, or returns an error from `new_error`, which traps.
DeadlineFunction = Callable[[Any, Any, Any, Any], int]


@functools.cache
def _deadline_type() -> Any:
    return ctypes.CFUNCTYPE(
        ctypes.c_size_t,
        ctypes.POINTER(ffi.wasmtime_context_t),
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_uint64),
        ctypes.POINTER(ffi.wasmtime_update_deadline_kind_t),
    )


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _no_finalizer(_data: int | None) -> None:
    return None


def deadline_callback(function: DeadlineFunction) -> Any:
    """`function` as Wasmtime calls it; keep the result alive while a store uses it."""
    return _deadline_type()(function)


def set_deadline_callback(store: wasmtime.Store, callback: Any) -> None:
    """Have `store` call `callback` (from `deadline_callback`) when its deadline passes."""
    ffi.wasmtime_store_epoch_deadline_callback(store.ptr(), callback, None, _no_finalizer)


def new_error(message: str) -> int:
    """An error for Wasmtime to take over (a callback's answer that traps the guest)."""
    return ctypes.cast(ffi.wasmtime_error_new(message.encode()), ctypes.c_void_p).value or 0
