"""The executor registry: which runtimes exist, which is each language's default.

`serve` starts every executor's background work in a nursery the registry owns; an
executor that cannot start is reported unavailable with its reason, never fatal to the
daemon. `pick` chooses the executor for a request or says precisely why none fits, and
`pick_ready` first waits, within a bound, for the one it wants to finish starting.

With no executor named, a program that uses what its language's default lacks (the
executor's `lacks(code, syntax, language)` says so: `Intl` on wasm-js, or TypeScript
whose types do not simply erase) goes to another available executor for the language,
when the configuration has one; a named executor always runs it. A session (no program
yet) does not go to an executor that runs only part of its language (`partly`: wasm-js
and TypeScript). A parse made to tell is kept in the request's `SyntaxMemo` for the
program's later readers. An executor may also name a `successor` for the programs it
was chosen for that turn out to compute for long (wasm-js: deno, see `wasm_moves`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import trio

from conduit.core.errors import ExecutorUnavailable, InvalidParams, RpcError
from conduit.executors.base import Executor, ExecutorInfo
from conduit.executors.syntax_memo import SyntaxMemo

__all__ = ["ExecutorRegistry"]

log = logging.getLogger("conduit.executors")

# Every executor Conduit has; one the configuration does not enable is reported as
# unavailable (and says how to enable it) rather than unknown.
KNOWN_EXECUTORS = {
    "deno": ("typescript", "javascript"),
    "wasm-python": ("python",),
    "wasm-js": ("javascript", "typescript"),
    "pyodide": ("python",),
}

# Programs up to this size are read for what they use on the event loop (parsing
# 4 KiB of JavaScript takes well under a millisecond); larger ones in a worker thread,
# since 1 MiB takes over half a second.
_INLINE_READ_CHARS = 4096
# Reading holds the GIL: a second thread would only take turns with the first.
_READ_THREADS = trio.CapacityLimiter(1)


class ExecutorRegistry:
    """Executors by name, plus the default executor for each language."""

    def __init__(self, executors: Iterable[Executor], defaults: Mapping[str, str]) -> None:
        self._executors = {executor.name: executor for executor in executors}
        self._defaults = dict(defaults)

    def __repr__(self) -> str:
        return f"<ExecutorRegistry {sorted(self._executors)}>"

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run every executor's background work until cancelled.

        Starts the executors side by side and calls `task_status.started()` once each
        has said it is started: a Wasmtime component loads while Deno's pool fills,
        rather than after it. An executor reports a runtime it cannot use through
        `info()` rather than by raising.
        """
        async with trio.open_nursery() as nursery:
            async with trio.open_nursery() as starting:
                for executor in self._executors.values():
                    starting.start_soon(nursery.start, executor.serve)
            task_status.started()

    async def wait_ready(self) -> None:
        """Wait until every executor that prepares in the background (building a
        component) has finished preparing, successfully or not."""
        for executor in self._executors.values():
            wait = getattr(executor, "wait_ready", None)
            if wait is not None:
                await wait()

    def preparing(self) -> list[str]:
        """The executors still preparing in the background (see `wait_ready`)."""
        return [e.name for e in self._executors.values() if getattr(e, "preparing", False)]

    def unready_reason(self) -> str | None:
        """Why a program in some language of the executors' could not run now (its
        default executor and any stand-in unavailable); None if every one could."""
        languages = {language for e in self._executors.values() for language in e.languages}
        if not languages:
            return "no executor is enabled"
        for language in sorted(languages):
            try:
                self.pick(language)
            except RpcError as exc:
                return f"{language}: {exc}"
        return None

    def set_defaults(self, defaults: Mapping[str, str]) -> None:
        """Replace the language -> executor defaults (a configuration reload)."""
        self._defaults = dict(defaults)

    def pick(
        self,
        language: str,
        name: str | None = None,
        *,
        code: str = "",
        syntax: SyntaxMemo | None = None,
    ) -> Executor:
        """The executor for `language` (or the one named) to run `code`; raises a wire
        error if none can.

        With no name, an unavailable default (one still building its component on a
        first start, say) gives way to another available executor for the language,
        and so does a default that lacks what `code` uses; a named executor is used or
        refused, never substituted. Raises `InvalidParams` for an unknown executor or
        one that does not run `language`, `ExecutorUnavailable` for one that is
        disabled or cannot run now. `syntax` is the request's memo of the program's parse.
        """
        lacking = self._lacking(language, name, code, SyntaxMemo() if syntax is None else syntax)
        return self._pick(self._candidates(language, name, lacking))

    async def pick_ready(
        self,
        language: str,
        name: str | None = None,
        *,
        within_s: float,
        code: str = "",
        syntax: SyntaxMemo | None = None,
    ) -> Executor:
        """`pick`, but the executor it wants that is still starting (loading or building
        its component, probing its runtime) is waited for, up to `within_s`, before it
        is refused or another stands in for it: the first request after a start is the
        usual case under socket activation. One that failed is not waited for.

        Raises as `pick` does; `ExecutorUnavailable` says which of disabled, failed or
        not ready within `within_s` it was.
        """
        syntax = SyntaxMemo() if syntax is None else syntax
        lacking = await self._lacking_off_loop(language, name, code, syntax)
        candidates = self._candidates(language, name, lacking)
        wanted = candidates[0]
        wait_ready = getattr(wanted, "wait_ready", None)
        if wanted.unavailable_reason is None or wait_ready is None:
            return self._pick(candidates)
        syntax.forget()  # not held through the wait (see `SyntaxMemo`)
        with trio.move_on_after(within_s) as waiting:
            await wait_ready()
        return self._pick(candidates, late_after_s=within_s if waiting.cancelled_caught else None)

    def successor(
        self,
        language: str,
        name: str | None,
        picked: Executor,
        code: str,
        syntax: SyntaxMemo | None = None,
    ) -> tuple[Executor, float] | None:
        """Where a program `picked` was chosen for moves if it computes for long, and
        after how much CPU time (the executor's `moves_to` and `moves(code)`); None
        when the request named its executor, or that one has failed (one still
        starting is waited for as the program moves: see `wait_for`)."""
        moves = getattr(picked, "moves", None)
        if name is not None or moves is None:
            return None
        successor = self._executors.get(getattr(picked, "moves_to", ""))
        if successor is None or language not in successor.languages:
            return None
        if successor.unavailable_reason is not None and not getattr(successor, "preparing", False):
            return None  # one still starting is waited for as the program moves
        after_s = moves(code, syntax)
        return None if after_s is None else (successor, after_s)

    def ready(self, name: str) -> bool:
        """Whether executor `name` can take jobs now."""
        executor = self._executors.get(name)
        return executor is not None and executor.unavailable_reason is None

    async def wait_for(self, name: str, within_s: float) -> bool:
        """Whether executor `name` can take jobs, once it has finished starting or
        `within_s` has passed, whichever comes first."""
        wait_ready = getattr(self._executors.get(name), "wait_ready", None)
        if not self.ready(name) and wait_ready is not None:
            with trio.move_on_after(within_s):
                await wait_ready()
        return self.ready(name)

    def _candidates(self, language: str, name: str | None, lacking: set[str]) -> list[Executor]:
        """Who may run the program, in order of preference: the named executor alone;
        else the default (after those that have what it lacks), then the others."""
        chosen_name = name or self._defaults.get(language)
        if chosen_name is None:
            raise InvalidParams(
                f"invalid params: no executor is configured for {language}",
                {"field": "language", "reason": "no executor configured"},
            )
        chosen = self._executors.get(chosen_name)
        others = [
            e for e in self._executors.values() if e is not chosen and language in e.languages
        ]
        if chosen is None:
            if name is not None or not others or chosen_name not in KNOWN_EXECUTORS:
                raise _disabled_error(chosen_name)
            # A default the configuration leaves out (disabled, not misspelt): the
            # others stand in, as for one that is unavailable.
            fitting = [e for e in others if e.name not in lacking]
            return [*fitting, *(e for e in others if e.name in lacking)]
        if language not in chosen.languages:
            raise InvalidParams(
                f"invalid params: executor {chosen_name!r} runs "
                f"{', '.join(sorted(chosen.languages))}, not {language}",
                {"field": "executor", "reason": f"does not run {language}"},
            )
        if name is not None:
            return [chosen]
        if chosen.name not in lacking:
            return [chosen, *others]
        fitting = [e for e in others if e.name not in lacking]
        return [*fitting, chosen, *(e for e in others if e.name in lacking)]

    def _pick(self, candidates: list[Executor], *, late_after_s: float | None = None) -> Executor:
        """The first available candidate; else the error for the first, which is the
        one wanted (`late_after_s`: it was waited for that long and is still starting)."""
        for executor in candidates:
            if executor.unavailable_reason is None:
                if executor is not candidates[0]:
                    log.debug("%s stands in for %s", executor.name, candidates[0].name)
                return executor
        wanted = candidates[0]
        reason = wanted.unavailable_reason or "unavailable"
        if late_after_s is not None:
            raise ExecutorUnavailable(
                f"executor {wanted.name!r} is still starting and was not ready within "
                f"{late_after_s:g} s; retry in a few seconds (`conduit doctor` shows what "
                "it is doing)",
                {"executor": wanted.name, "state": "starting", "reason": reason},
            )
        raise ExecutorUnavailable(
            f"executor {wanted.name!r} is unavailable: {reason}; `conduit doctor` says what to fix",
            {"executor": wanted.name, "state": "failed", "reason": reason},
        )

    def _lacking(self, language: str, name: str | None, code: str, syntax: SyntaxMemo) -> set[str]:
        """The executors for `language` that lack what `code` uses (`lacks(code,
        syntax, language)` says what); none when the request names its executor,
        which then runs the program as it is. With no program (a session's, whose
        steps are yet to come), those that run only part of the language (`partly`)."""
        if name is not None:
            return set()
        lacking = set()
        for executor in self._executors.values():
            if language not in executor.languages:
                continue
            if not code:
                if language in getattr(executor, "partly", ()):
                    lacking.add(executor.name)
                continue
            lacks = getattr(executor, "lacks", None)
            if lacks is not None and lacks(code, syntax, language):
                lacking.add(executor.name)
        return lacking

    async def _lacking_off_loop(
        self, language: str, name: str | None, code: str, syntax: SyntaxMemo
    ) -> set[str]:
        """`_lacking`, in a worker thread for a program large enough to hold the event
        loop up while it is read."""
        if len(code) <= _INLINE_READ_CHARS:
            return self._lacking(language, name, code, syntax)
        return await trio.to_thread.run_sync(
            self._read, language, name, code, syntax, limiter=_READ_THREADS
        )

    def _read(self, language: str, name: str | None, code: str, syntax: SyntaxMemo) -> set[str]:
        """`_lacking`, and whether an executor that may be picked would let the program
        move (`successor`, which then finds it in `syntax`): all that is read of a
        large program before it runs, read at once off the event loop."""
        lacking = self._lacking(language, name, code, syntax)
        if name is None:
            for executor in self._executors.values():
                moves = getattr(executor, "moves", None)
                if moves is not None and language in executor.languages:
                    moves(code, syntax)
        return lacking

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

    def describing(self) -> dict[str, str]:
        """For each language, the executor whose limits its programs meet, for a
        model writing one: the default's, unless that runs only part of the language
        (`partly`: wasm-js and TypeScript) and a configured executor runs the rest."""
        described = {}
        for language, name in self._defaults.items():
            chosen = self._executors.get(name)
            whole = [
                e.name
                for e in self._executors.values()
                if language in e.languages and language not in getattr(e, "partly", ())
            ]
            partial = chosen is not None and language in getattr(chosen, "partly", ())
            described[language] = whole[0] if partial and whole else name
        return described

    def packages(self, name: str) -> dict[str, str]:
        """The versions of the packages executor `name` installed for its programs
        beyond its language's own library, by package name; {} for none or no such
        executor."""
        executor = self._executors.get(name)
        return executor.info().packages if executor is not None else {}


def _disabled_error(name: str) -> InvalidParams | ExecutorUnavailable:
    """The error for an executor the configuration does not run: disabled, or unknown."""
    if name in KNOWN_EXECUTORS:
        return ExecutorUnavailable(
            f"executor {name!r} is {_disabled(name)}; executors/list shows what is available",
            {"executor": name, "state": "disabled", "reason": _disabled(name)},
        )
    return InvalidParams(
        f"invalid params: unknown executor {name!r}; executors/list shows the executors",
        {"field": "executor", "reason": "unknown executor"},
    )


def _disabled(name: str) -> str:
    section = name.replace("-", "_")
    return f"disabled in the configuration (set executors.{section}.enabled = true)"
