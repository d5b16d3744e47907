"""Leased rate-limit tokens against a real Redis: several "processes" (limiters) share one bucket,
never admit more than it allows, and most requests are answered without a round trip."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

import pytest

from gateway.tenancy.ratelimit import Decision, RedisRateLimiter
from gateway.tenancy.ratelimit_lease import LeasedRateLimiter
from gateway.tenancy.tiers import RateLimit

pytestmark = pytest.mark.integration

#: one token a minute: no refill within a test, so the burst is all there is
NO_REFILL = 1.0


class _Counted(RedisRateLimiter):
    """The real Redis limiter, counting its round trips and the tokens it granted."""

    round_trips = 0
    granted = 0

    async def take_all(
        self, checks: Sequence[tuple[str, RateLimit]], wanted: Sequence[int]
    ) -> list[Decision]:
        self.round_trips += 1
        decisions = await super().take_all(checks, wanted)
        self.granted += sum(d.granted for d in decisions)
        return decisions


def _prefix() -> str:
    return f"test:{uuid.uuid4().hex}:"  # a fresh namespace: buckets of other tests stay apart


async def test_take_all_grants_what_the_bucket_has_up_to_the_tokens_wanted(redis_url: str) -> None:
    limiter = RedisRateLimiter(redis_url, prefix=_prefix())
    limit = RateLimit(per_minute=NO_REFILL, burst=10)
    try:
        first = (await limiter.take_all([("b", limit)], [6]))[0]
        assert (first.allowed, first.granted, first.remaining) == (True, 6, 4)
        second = (await limiter.take_all([("b", limit)], [6]))[0]
        assert (second.allowed, second.granted, second.remaining) == (True, 4, 0)
        third = (await limiter.take_all([("b", limit)], [6]))[0]
        assert (third.allowed, third.granted) == (False, 0)
        assert third.retry_after_s > 0
    finally:
        await limiter.close()


async def test_processes_sharing_a_bucket_never_admit_more_than_it_holds(redis_url: str) -> None:
    prefix = _prefix()
    shared = [_Counted(redis_url, prefix=prefix) for _ in range(3)]
    leased = [LeasedRateLimiter(s, share=0.1) for s in shared]
    limit = RateLimit(per_minute=NO_REFILL, burst=400)
    admitted = refused_in_a_row = 0
    try:
        for i in range(2_000):
            decision = await leased[i % 3].hit("client", limit)
            admitted += decision.allowed
            refused_in_a_row = 0 if decision.allowed else refused_in_a_row + 1
            if refused_in_a_row == 30:
                break
        assert refused_in_a_row == 30, "the bucket never ran dry"
        # Never above the burst; below it by at most the tokens the other two still hold.
        assert 400 - 2 * 40 <= admitted <= 400, admitted
        round_trips = sum(s.round_trips for s in shared)
        assert round_trips < admitted / 4, (round_trips, admitted)
    finally:
        for limiter in leased:
            await limiter.close()


async def test_a_small_burst_is_asked_of_redis_every_time(redis_url: str) -> None:
    prefix = _prefix()
    shared = [_Counted(redis_url, prefix=prefix) for _ in range(2)]
    leased = [LeasedRateLimiter(s) for s in shared]  # share 0.02 of a burst of 5: under one token
    limit = RateLimit(per_minute=NO_REFILL, burst=5)
    try:
        decisions = [await leased[i % 2].hit("free", limit) for i in range(8)]
        assert [d.allowed for d in decisions] == [True] * 5 + [False] * 3
        assert [d.remaining for d in decisions[:5]] == [4, 3, 2, 1, 0]
        assert sum(s.round_trips for s in shared) == 8
    finally:
        for limiter in leased:
            await limiter.close()


async def test_held_tokens_are_dropped_after_the_lease_time(redis_url: str) -> None:
    now = [0.0]
    shared = _Counted(redis_url, prefix=_prefix())
    leased = LeasedRateLimiter(shared, share=0.5, lease_s=1.0, clock=lambda: now[0])
    limit = RateLimit(per_minute=NO_REFILL, burst=40)
    try:
        for _ in range(4):  # leases of 1, 2 and 4 tokens: the last leaves 3 held
            assert (await leased.hit("b", limit)).allowed
        trips = shared.round_trips
        assert (await leased.hit("b", limit)).allowed
        assert shared.round_trips == trips, "a held token was not used"
        now[0] = 5.0  # past the lease: the 2 still held are dropped, Redis is asked again
        assert (await leased.hit("b", limit)).allowed
        assert shared.round_trips == trips + 1
    finally:
        await leased.close()


async def test_a_request_served_from_a_lease_reports_the_bucket_as_left(redis_url: str) -> None:
    leased = LeasedRateLimiter(RedisRateLimiter(redis_url, prefix=_prefix()), share=0.5)
    limit = RateLimit(per_minute=NO_REFILL, burst=20)
    try:
        remaining = [(await leased.hit("b", limit)).remaining for _ in range(20)]
        assert remaining == list(range(19, -1, -1)), remaining  # one process alone: exact
        refused = await leased.hit("b", limit)
        assert not refused.allowed and refused.headers()["Retry-After"]
    finally:
        await leased.close()


async def test_concurrent_requests_do_not_lease_many_times_over(redis_url: str) -> None:
    shared = _Counted(redis_url, prefix=_prefix())
    leased = LeasedRateLimiter(shared, share=0.1)  # leases of at most 100 tokens
    limit = RateLimit(per_minute=NO_REFILL, burst=1_000)
    try:
        for _ in range(100):  # one request at a time: the lease grows to its largest
            assert (await leased.hit("b", limit)).allowed
        # 200 at once: when the lease runs dry, one of them leases again, the rest take one each.
        answered = await asyncio.gather(*(leased.hit("b", limit) for _ in range(200)))
        assert all(d.allowed for d in answered)
        held = shared.granted - 300  # taken from Redis, not yet handed to a request
        assert 0 <= held <= 2 * 100, held
    finally:
        await leased.close()
