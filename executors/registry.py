"""The executor registry: which runtimes exist, which is each language's default.

`serve` starts every executor's background work in a nursery the registry owns; an
executor that cannot start is reported unavailable with its reason, never fatal to the
daemon. `pick` chooses the executor for a request or says precisely why none fits.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import trio

from conduit.daemon.errors import ExecutorUnavailable, InvalidParams
from conduit.executors.base import Executor, ExecutorInfo

__all__ = ["ExecutorRegistry"]

log = logging.getLogger("conduit.executors")

# Every executor Conduit has; one the configuration does not enable is reported as
# unavailable (and says how to enable it) rather than unknown.
KNOWN_EXECUTORS = {
    "deno": ("typescript", "javascript"),
    "wasm-python": ("python",),
    "wasm-js": ("javascript",),
    "pyodide": ("python",),
}


class ExecutorRegistry:
    """Executors by name, plus the default executor for each language."""

    def __init__(self, executors: Iterable[Executor], defaults: Mapping[str, str]) -> None:
        self._executors = {executor.name: executor for executor in executors}
        self._defaults = dict(defaults)

    def __repr__(self) -> str:
        return f"<ExecutorRegistry {sorted(self._executors)}>"

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run every executor's background work until cancelled.

        Starts the executors one after another and calls `task_status.started()` once
        each has said it is started; an executor reports a runtime it cannot use
        through `info()` rather than by raising.
        """
        async with trio.open_nursery() as nursery:
            for executor in self._executors.values():
                await nursery.start(executor.serve)
            task_status.started()

    async def wait_ready(self) -> None:
        """Wait until every executor that prepares in the background (building a
        component) has finished preparing, successfully or not."""
        for executor in self._executors.values():
            wait = getattr(executor, "wait_ready", None)
            if wait is not None:
                await wait()

    def set_defaults(self, defaults: Mapping[str, str]) -> None:
        """Replace the language -> executor defaults (a configuration reload)."""
        self._defaults = dict(defaults)

    def pick(self, language: str, name: str | None = None) -> Executor:
        """The executor for `language` (or the one named); raises a wire error if none.

        With no name, an unavailable default (one still building its component on a
        first start, say) gives way to another available executor for the language;
        a named executor is used or refused, never substituted.
        """
        chosen = name or self._defaults.get(language)
        if chosen is None:
            raise InvalidParams(
                f"invalid params: no executor is configured for {language}",
                {"field": "language", "reason": "no executor configured"},
            )
        executor = self._executors.get(chosen)
        if executor is None:
            self._raise_missing(chosen)
        if language not in executor.languages:
            raise InvalidParams(
                f"invalid params: executor {chosen!r} runs "
                f"{', '.join(sorted(executor.languages))}, not {language}",
                {"field": "executor", "reason": f"does not run {language}"},
            )
        reason = executor.unavailable_reason
        if reason is None:
            return executor
        if name is None:
            fallback = self._fallback(language, executor)
            if fallback is not None:
                return fallback
        raise ExecutorUnavailable(
            f"executor {chosen!r} is unavailable: {reason}; run `conduit doctor`",
            {"executor": chosen, "reason": reason},
        )

    async def pick_ready(
        self, language: str, name: str | None = None, *, within_s: float
    ) -> Executor:
        """`pick`, but a chosen executor that is still getting ready (loading or building
        its component, probing its runtime) is waited for, up to `within_s`, before it
        is refused or another stands in for it: the first request after a start is the
        usual case under socket activation. One that failed is not waited for.
        """
        chosen = self._executors.get(name or self._defaults.get(language) or "")
        wait_ready = getattr(chosen, "wait_ready", None)
        if chosen is not None and wait_ready is not None and chosen.unavailable_reason:
            with trio.move_on_after(within_s):
                await wait_ready()
        return self.pick(language, name)

    def _fallback(self, language: str, default: Executor) -> Executor | None:
        """Another available executor for `language`, while its default is unavailable."""
        for executor in self._executors.values():
            runs_it = executor is not default and language in executor.languages
            if runs_it and executor.unavailable_reason is None:
                log.debug("%s is unavailable; %s runs %s", default.name, executor.name, language)
                return executor
        return None

    def _raise_missing(self, name: str) -> None:
        if name in KNOWN_EXECUTORS:
            raise ExecutorUnavailable(
                f"executor {name!r} is {_disabled(name)}; executors/list shows what is available",
                {"executor": name, "reason": _disabled(name)},
            )
        raise InvalidParams(
            f"invalid params: unknown executor {name!r}; executors/list shows the executors",
            {"field": "executor", "reason": "unknown executor"},
        )

    def infos(self, *, configured_only: bool = False) -> list[ExecutorInfo]:
        """A snapshot of every known executor, including those the configuration leaves
        out (reported unavailable), unless `configured_only`."""
        infos = [executor.info() for executor in self._executors.values()]
        if configured_only:
            return infos
        for name, languages in KNOWN_EXECUTORS.items():
            if name not in self._executors:
                infos.append(ExecutorInfo(name, languages, available=False, reason=_disabled(name)))
        return infos

    def defaults(self) -> dict[str, str]:
        return dict(self._defaults)


def _disabled(name: str) -> str:
    section = name.replace("-", "_")
    return f"disabled in the configuration (set executors.{section}.enabled = true)"
