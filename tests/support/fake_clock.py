"""A clock the test moves by hand: pass it where code takes a ``clock() -> float``."""

from __future__ import annotations

__all__ = ["FakeClock"]


class FakeClock:
    """Returns ``now``; a test sets or advances ``now`` itself.

    Args:
        now: the first reading (seconds on whatever clock the code under test expects).
    """

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
