"""A clock a test moves by hand, for code that takes one as a callable."""

from __future__ import annotations


class HandClock:
    """Says `now`, which the test sets or moves on."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
