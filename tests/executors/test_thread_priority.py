"""A runner thread's scheduling (`thread_priority`): idle-class for background work and
back where the probe allows it, hurried back from another thread, never touched where
the probe fails or the thread runs under a policy of its own. Each test changes only
threads of its own, so the test runner's thread keeps its scheduling."""

from __future__ import annotations

import os
import resource
import threading
from collections.abc import Callable

import pytest

from conduit.executors import thread_priority

pytestmark = pytest.mark.skipif(
    not hasattr(os, "SCHED_IDLE"), reason="scheduling policies are Linux's"
)


def policy(thread_id: int = 0) -> int:
    return os.sched_getscheduler(thread_id)


def in_thread(body: Callable[[], list[int]]) -> list[int]:
    seen: list[int] = []
    thread = threading.Thread(target=lambda: seen.extend(body()))
    thread.start()
    thread.join()
    return seen


def idle_if_available() -> int:
    return os.SCHED_IDLE if thread_priority.available() else os.SCHED_OTHER


def test_the_probe_finds_the_idle_class_can_be_left_here() -> None:
    # The suite runs where threads may leave SCHED_IDLE (root, or RLIMIT_NICE 20): the
    # rest of this file then checks real changes, not the no-op.
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    if os.geteuid() == 0 or soft == resource.RLIM_INFINITY or soft >= 20:
        assert thread_priority.available()


def test_background_idles_a_managed_thread_and_restore_takes_it_out() -> None:
    def body() -> list[int]:
        priority = thread_priority.manage()
        before = policy()
        thread_priority.background()
        lowered = policy()
        priority.restore()
        restored = policy()
        thread_priority.release()
        return [before, lowered, restored]

    assert in_thread(body) == [os.SCHED_OTHER, idle_if_available(), os.SCHED_OTHER]


def test_lowering_yields_the_cpu_to_the_thread_its_answer_woke(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The kernel does not preempt a thread for lowering itself: the event loop woken
    # by the answer would wait behind it for the next tick unless it yields.
    yields: list[int] = []
    monkeypatch.setattr(os, "sched_yield", lambda: yields.append(policy()))

    def body() -> list[int]:
        thread_priority.background()  # not managed: no change, no yield
        unmanaged = len(yields)
        thread_priority.manage()
        thread_priority.background()
        thread_priority.release()
        return [unmanaged, *yields]

    expected = [0, os.SCHED_IDLE] if thread_priority.available() else [0]
    assert in_thread(body) == expected


def test_a_thread_not_managed_is_left_alone() -> None:
    def body() -> list[int]:
        thread_priority.background()
        return [policy()]

    assert in_thread(body) == [os.SCHED_OTHER]


def test_release_restores_and_stops_managing_the_thread() -> None:
    def body() -> list[int]:
        thread_priority.manage()
        thread_priority.background()
        thread_priority.release()
        released = policy()
        thread_priority.background()  # no longer managed: nothing happens
        return [released, policy()]

    assert in_thread(body) == [os.SCHED_OTHER, os.SCHED_OTHER]


def test_hurry_takes_a_thread_out_at_once_and_keeps_it_out_until_restore() -> None:
    lowered, hurried, restored = threading.Event(), threading.Event(), threading.Event()
    handle: list[thread_priority.ThreadPriority] = []
    seen: list[int] = []

    def runner() -> None:
        handle.append(thread_priority.manage())
        thread_priority.background()
        lowered.set()
        hurried.wait()
        thread_priority.background()  # hurried: stays out of the idle class
        seen.append(policy())
        handle[0].restore()
        thread_priority.background()  # restored: may be lowered again
        seen.append(policy())
        thread_priority.release()
        restored.set()

    thread = threading.Thread(target=runner)
    thread.start()
    lowered.wait()
    idle = policy(thread.native_id or 0)
    handle[0].hurry()
    after_hurry = policy(thread.native_id or 0)
    hurried.set()
    thread.join()
    assert restored.is_set()
    assert [idle, after_hurry] == [idle_if_available(), os.SCHED_OTHER]
    assert seen == [os.SCHED_OTHER, idle_if_available()]
    assert not handle[0].lowered


def test_a_thread_under_a_policy_of_its_own_is_left_alone() -> None:
    def body() -> list[int]:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        thread_priority.manage()
        thread_priority.background()
        seen = policy()
        thread_priority.release()
        return [seen, policy()]

    assert in_thread(body) == [os.SCHED_BATCH, os.SCHED_BATCH]


def test_nothing_changes_where_the_probe_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(thread_priority, "available", lambda: False)

    def body() -> list[int]:
        priority = thread_priority.manage()
        thread_priority.background()
        seen = policy()
        priority.hurry()
        thread_priority.release()
        return [seen, policy()]

    assert in_thread(body) == [os.SCHED_OTHER, os.SCHED_OTHER]


def test_the_probe_leaves_the_calling_thread_alone() -> None:
    def body() -> list[int]:
        thread_priority.available.cache_clear()
        thread_priority.available()
        return [policy()]

    assert in_thread(body) == [os.SCHED_OTHER]
