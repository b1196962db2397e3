"""A runner thread's priority (`thread_priority`): lowered for background work and
raised again where the probe allows it, never touched where it does not. Each test
runs in a thread of its own, so the test runner's thread keeps its priority."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from conduit.executors import thread_priority
from conduit.executors.thread_priority import BACKGROUND_INCREMENT


def nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def in_thread(body: Callable[[], list[int]]) -> list[int]:
    seen: list[int] = []
    thread = threading.Thread(target=lambda: seen.extend(body()))
    thread.start()
    thread.join()
    return seen


def test_background_lowers_and_foreground_restores_a_remembered_thread() -> None:
    def body() -> list[int]:
        base = nice()
        thread_priority.remember()
        thread_priority.background()
        lowered = nice()
        thread_priority.foreground()
        return [base, lowered, nice()]

    base, lowered, restored = in_thread(body)
    expected = base + BACKGROUND_INCREMENT if thread_priority.available() else base
    assert lowered == min(expected, 19)
    assert restored == base


def test_a_thread_not_remembered_is_left_alone() -> None:
    def body() -> list[int]:
        base = nice()
        thread_priority.background()
        return [base, nice()]

    base, after = in_thread(body)
    assert after == base


def test_forget_restores_and_stops_managing_the_thread() -> None:
    def body() -> list[int]:
        base = nice()
        thread_priority.remember()
        thread_priority.background()
        thread_priority.forget()
        restored = nice()
        thread_priority.background()  # no longer managed: a no-op
        return [base, restored, nice()]

    base, restored, after = in_thread(body)
    assert restored == base and after == base


def test_the_probe_leaves_the_calling_thread_alone() -> None:
    def body() -> list[int]:
        base = nice()
        thread_priority.available.cache_clear()
        thread_priority.available()
        return [base, nice()]

    base, after = in_thread(body)
    assert after == base
