"""The room for calls left going on after their programs answered (`LeftCalls`)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.core.left_calls import LeftCalls


class _Taken:
    """What LeftCalls was given: each call's key, and which were cancelled."""

    def __init__(self, left: LeftCalls) -> None:
        self.left = left
        self.cancelled: list[str] = []

    def take(self, principal: str, key: str, size: int = 0) -> bool:
        return self.left.take(principal, key, size, lambda: self.cancelled.append(key))


def test_a_caller_alone_may_use_all_the_room_until_another_needs_its_share() -> None:
    taken = _Taken(LeftCalls(limit=4, byte_limit=1000))
    for n in range(4):
        assert taken.take("alice", f"a{n}")
    assert not taken.take("alice", "a4")  # all the room
    assert taken.take("bob", "b0") and taken.take("bob", "b1")  # half each, now
    assert taken.cancelled == ["a0", "a1"]  # alice's oldest made room
    assert not taken.take("bob", "b2")  # past bob's share
    assert taken.take("carol", "c0")  # a third each: one of the two holding most
    assert taken.cancelled == ["a0", "a1", "a2"]
    assert (taken.left.count, taken.left.held("alice"), taken.left.held("bob")) == (
        4,
        (1, 0),
        (2, 0),
    )
    taken.left.give_back("alice", "a0")  # cancelled already: no longer counted
    taken.left.give_back("alice", "a3")
    assert taken.left.count == 3 and taken.left.held("alice") == (0, 0)


def test_left_calls_are_bounded_by_their_arguments_bytes_per_caller_share() -> None:
    taken = _Taken(LeftCalls(limit=100, byte_limit=1000))
    assert taken.take("alice", "a0", 400) and taken.take("alice", "a1", 500)
    assert not taken.take("alice", "a2", 101)  # past all the bytes
    assert not taken.take("bob", "b0", 501)  # past half
    assert taken.take("bob", "b0", 300)  # room made: alice's oldest cancelled
    assert taken.cancelled == ["a0"]
    assert (taken.left.count, taken.left.bytes) == (2, 800)
    taken.left.give_back("bob", "b0")
    assert taken.left.held("bob") == (0, 0) and taken.left.bytes == 500


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 400), st.booleans()), max_size=60)
)
def test_left_calls_never_exceed_the_room_and_a_caller_within_its_share_gets_it(
    steps: list[tuple[str, int, bool]],
) -> None:
    """Takes and gives back in any order: the totals stay within both limits and match
    what is held, and a take within the caller's share never fails."""
    left = LeftCalls(limit=8, byte_limit=1000)
    live: dict[int, tuple[str, int]] = {}
    for key, (caller, size, give) in enumerate(steps):
        if give and live:
            oldest = next(iter(live))
            left.give_back(live.pop(oldest)[0], oldest)
            continue
        holders = {who for who, _ in live.values()} | {caller}
        calls, used = left.held(caller)
        within = calls < 8 // len(holders) and used + size <= 1000 // len(holders)
        ok = left.take(caller, key, size, lambda key=key: live.pop(key))
        assert ok == within
        if ok:
            live[key] = (caller, size)
        assert left.count == len(live) <= 8
        assert left.bytes == sum(size for _, size in live.values()) <= 1000
