"""Trio's worker threads, kept for the life of the process where Trio allows it.

A sandboxed worker's bwrap runs with `--die-with-parent`: bwrap asks the kernel
(`PR_SET_PDEATHSIG`) to kill it when its parent goes, and to the kernel the parent is
the thread that started it, not the process. Trio starts processes from its worker
threads (`trio.lowlevel.open_process`), and a worker thread idle for 10 s exits: a
sandboxed worker started from a thread that then idled was killed 10 s later (an idle
Deno-only daemon replaced its whole pool every 10 s, and a program running in a worker
then came back "killed by signal SIGKILL").

Trio has no public way to keep its threads. `keep_worker_threads` sets its thread
cache's idle timeout (a private setting of Trio 0.35, which the daemon pins) so that an
idle thread waits for work for as long as the process lives; there are only ever as
many as once ran at the same time. Where that setting is not found (another Trio), it
says so, and sandboxes are started without `--die-with-parent` (`os_sandbox`): their
workers then end with their pipes once the daemon is gone.
"""

from __future__ import annotations

import importlib
import logging

__all__ = ["keep_worker_threads"]

log = logging.getLogger(__name__)

_CACHE_MODULE = "trio._core._thread_cache"
_SETTING = "IDLE_TIMEOUT"
# `threading.Lock.acquire(timeout=-1)`: no timeout at all.
_FOREVER = -1


def keep_worker_threads() -> bool:
    """Keep Trio's worker threads until the process ends; whether that was possible."""
    try:
        cache = importlib.import_module(_CACHE_MODULE)
    except ImportError:
        cache = None
    current = getattr(cache, _SETTING, None)
    if type(current) not in (int, float):
        log.warning(
            "this Trio has no %s.%s: sandboxed workers are not tied to the daemon's life "
            "(they end with their pipes once it is gone)",
            _CACHE_MODULE,
            _SETTING,
        )
        return False
    setattr(cache, _SETTING, _FOREVER)
    return True
