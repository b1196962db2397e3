"""The budget of runners executions leave behind: per principal and in total."""

from __future__ import annotations

from conduit.executors.wasm_lingering import LingerBudget


def test_a_fresh_budget_admits_and_counts_nothing() -> None:
    budget = LingerBudget(max_threads=4)
    assert budget.refusal("alice", 128) is None
    assert budget.statistics().threads == 0


def _refusal_after(budget: LingerBudget, charged: list[str], asking: str) -> str:
    """What `budget` tells `asking` once each of `charged` has a 64 MB runner lingering."""
    for principal in charged:
        budget.charge(principal, 64)
    refusal = budget.refusal(asking, 64)
    assert refusal is not None
    return refusal


def test_the_total_thread_cap_refuses_everyone_until_a_runner_finishes() -> None:
    budget = LingerBudget(max_threads=2, max_threads_per_principal=2)
    refusal = _refusal_after(budget, ["alice", "bob"], "carol")
    assert "executor's" in refusal and "try again" in refusal
    budget.release("alice", 64)
    assert budget.refusal("carol", 64) is None
    assert budget.statistics().threads == 1


def test_one_principal_cannot_take_the_whole_budget() -> None:
    budget = LingerBudget(max_threads=10, max_threads_per_principal=2)
    assert "caller's" in _refusal_after(budget, ["alice", "alice"], "alice")
    assert budget.refusal("bob", 64) is None


def test_memory_is_capped_per_principal_and_in_total() -> None:
    budget = LingerBudget(max_threads=10, max_memory_mb=1000, max_memory_mb_per_principal=300)
    budget.charge("alice", 256)
    assert budget.refusal("alice", 128) is not None  # 384 MB > 300 for alice
    assert budget.refusal("bob", 128) is None
    budget.charge("bob", 700)
    assert budget.refusal("carol", 64) is not None  # 1020 MB > 1000 in all
    budget.release("bob", 700)
    budget.release("alice", 256)
    assert budget.statistics() == budget.statistics().__class__(0, 0, 0)


def test_anonymous_jobs_share_one_principal() -> None:
    budget = LingerBudget(max_threads=10, max_threads_per_principal=1)
    budget.charge(None, 64)
    assert budget.refusal(None, 64) is not None
    budget.release(None, 64)
    assert budget.refusal(None, 64) is None


def test_an_execution_larger_than_a_callers_share_runs_once_nothing_of_it_lingers() -> None:
    """The caps bound what lingers, not how large one execution may be: the limits
    allow more memory than a caller's share (refused as "busy" forever otherwise)."""
    budget = LingerBudget(max_threads=10, max_memory_mb=2048, max_memory_mb_per_principal=512)
    assert budget.refusal("alice", 1024) is None
    assert budget.refusal("alice", 2048) is None
    budget.charge("alice", 64)
    assert "caller's" in (budget.refusal("alice", 1024) or "")
    budget.charge("bob", 2000)
    assert "executor's" in (budget.refusal("carol", 64) or "")
