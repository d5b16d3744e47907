"""Which keys ignore a Retry-After (unit tests of :class:`RetryAfterWatch`, on a fake clock)."""

from __future__ import annotations

from gateway.tenancy.refusals import RetryAfterWatch
from tests.support.fake_clock import FakeClock


def test_the_first_429_holds_nothing_a_second_within_its_wait_holds_the_rest() -> None:
    clock = FakeClock(100.0)
    watch = RetryAfterWatch(hold_max_s=10.0, clock=clock)
    assert watch.note("a", 30.0) == 0.0  # told: not yet ignored
    clock.now += 4.0
    assert watch.note("a", 30.0) == 10.0  # 26 s of the wait left, held at most 10
    assert watch.note("b", 5.0) == 0.0  # another key is its own


def test_a_key_that_waited_its_retry_after_out_is_not_held() -> None:
    clock = FakeClock(100.0)
    watch = RetryAfterWatch(hold_max_s=10.0, clock=clock)
    watch.note("a", 3.0)
    clock.now += 3.5
    assert watch.note("a", 3.0) == 0.0
    clock.now += 1.0
    assert watch.note("a", 3.0) == 2.0  # 2 s of the last wait left
