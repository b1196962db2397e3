"""Choosing an executor: defaults, names, and the fallback while a default is unavailable.

Unit tests of the registry's choice alone: the executors here are stand-ins that only
report availability (every executor itself is tested with its real runtime elsewhere).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from conduit.daemon.errors import ExecutorUnavailable, InvalidParams
from conduit.executors.base import ExecutorInfo
from conduit.executors.registry import ExecutorRegistry


@dataclass
class StandIn:
    name: str
    languages: frozenset[str]
    available: bool = True
    reason: str | None = field(default=None)

    @property
    def unavailable_reason(self) -> str | None:
        return None if self.available else (self.reason or "being built")

    def info(self) -> ExecutorInfo:
        reason = self.unavailable_reason
        return ExecutorInfo(self.name, tuple(self.languages), reason is None, reason=reason)


def registry(*, wasm_js_available: bool) -> tuple[ExecutorRegistry, StandIn, StandIn]:
    deno = StandIn("deno", frozenset({"javascript", "typescript"}))
    wasm_js = StandIn("wasm-js", frozenset({"javascript"}), available=wasm_js_available)
    chosen = ExecutorRegistry([deno, wasm_js], {"javascript": "wasm-js", "typescript": "deno"})  # type: ignore[list-item]
    return chosen, deno, wasm_js


def test_the_default_runs_its_language() -> None:
    chosen, _, wasm_js = registry(wasm_js_available=True)
    assert chosen.pick("javascript") is wasm_js


def test_an_unavailable_default_gives_way_to_another_executor_for_the_language() -> None:
    chosen, deno, wasm_js = registry(wasm_js_available=False)
    assert chosen.pick("javascript") is deno
    wasm_js.available = True  # its component is built: the default is back
    assert chosen.pick("javascript") is wasm_js


def test_a_named_executor_is_never_substituted() -> None:
    chosen, _, _ = registry(wasm_js_available=False)
    with pytest.raises(ExecutorUnavailable, match="being built"):
        chosen.pick("javascript", "wasm-js")


def test_no_fallback_when_nothing_else_runs_the_language() -> None:
    python = StandIn("wasm-python", frozenset({"python"}), available=False)
    chosen = ExecutorRegistry([python], {"python": "wasm-python"})  # type: ignore[list-item]
    with pytest.raises(ExecutorUnavailable):
        chosen.pick("python")


def test_an_executor_that_does_not_run_the_language_is_refused() -> None:
    chosen, _, _ = registry(wasm_js_available=True)
    with pytest.raises(InvalidParams, match="not typescript"):
        chosen.pick("typescript", "wasm-js")
