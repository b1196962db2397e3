"""Counting parses of JavaScript and TypeScript programs where every syntax tree is
made (`js_syntax._parse_program`), whoever asked for it."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from conduit.executors import js_syntax


@dataclass(frozen=True, slots=True)
class Parse:
    code: str
    dialect: str
    on_event_loop_thread: bool  # the main thread, where the tests' Trio loop runs


@dataclass
class Parses:
    made: list[Parse] = field(default_factory=list)

    def of(self, code: str) -> list[Parse]:
        return [parse for parse in self.made if parse.code == code]


def count_parses(monkeypatch: pytest.MonkeyPatch) -> Parses:
    """Record every parse from now on, for the rest of the test."""
    parses = Parses()
    original = js_syntax._parse_program

    def counted(data: bytes, dialect: js_syntax.Dialect) -> object:
        on_main = threading.current_thread() is threading.main_thread()
        parses.made.append(Parse(data.decode("utf-8", "surrogatepass"), dialect, on_main))
        return original(data, dialect)

    monkeypatch.setattr(js_syntax, "_parse_program", counted)
    return parses
