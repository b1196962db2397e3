"""asyncio for the wasm-python guest, which has no sockets: an event loop without a
self-pipe.

asyncio's selector event loop makes a socket pair at start, to be woken from other
threads or signal handlers; WASI has no `socketpair`, so `asyncio.run` failed with
PermissionError. The guest has neither threads nor signals to wake it, so the loop
does without: it wakes on its own timers and on the host's answers alone.

`install` patches `asyncio.selector_events` whenever it is imported: the guest
imports asyncio at build time (see PRELOADED), and the patch goes with it into every
instance. Where a platform does give a socket pair, the loop keeps it.
"""

import importlib.machinery
import sys

PATCHED_MODULE = "asyncio.selector_events"


def _without_self_pipe(module):
    loop = module.BaseSelectorEventLoop
    make, close = loop._make_self_pipe, loop._close_self_pipe

    def _make_self_pipe(self):
        try:
            make(self)
        except OSError:
            self._ssock = self._csock = None

    def _close_self_pipe(self):
        if self._ssock is not None:
            close(self)

    loop._make_self_pipe = _make_self_pipe
    loop._close_self_pipe = _close_self_pipe


class _PatchingLoader:
    """Runs a module with its own loader, then `patch` on it."""

    def __init__(self, loader, patch):
        self._loader = loader
        self._patch = patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._patch(module)


class _Finder:
    """Finds PATCHED_MODULE as the path finder does, with a patching loader."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != PATCHED_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader, _without_self_pipe)
        return spec


def install():
    sys.meta_path.insert(0, _Finder())
