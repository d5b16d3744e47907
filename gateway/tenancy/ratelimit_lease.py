"""Rate-limit tokens leased from Redis a few at a time, so most requests never wait on Redis.

With several gateway processes the limits live in Redis (:class:`RedisRateLimiter`), and asking it
for every request costs a round trip and the Lua call's CPU on the hot path (about 1.1 ms of an 8-worker
gateway's admission on the GPU host, ``benchmarks/h200``). Here each process takes several tokens
of a bucket in one call (a *lease*) and hands them to that bucket's next requests itself:

- **Never above the limit.** Leased tokens are taken from the shared bucket when leased, so the
  processes together never admit more than the limit allows. What a lease can cost is the other way:
  tokens one process holds are not available to another, and are dropped after ``lease_s`` when
  unused, so a client spread over several processes may be refused a little early near its limit.
  That is bounded by the lease size: a process holds about ``share`` of the burst at most (one
  lease is taken at a time per bucket; requests arriving meanwhile take one token each).
- **Sized by use.** A bucket's first lease is one token (a client seen once pays what it did before);
  a lease used up within half its lifetime makes the next one twice as large, one that outlived
  that makes it half, between 1 and ``share`` of the burst. A bucket whose burst times ``share`` is
  below 2 (the free tier's 5 at the default 0.02) is asked of Redis every time, exactly as before.
- **Refusals are Redis's.** A request is refused only when Redis has no token left for it, with
  Redis's ``Retry-After``; the headers of a request served from a lease report the bucket as Redis
  left it plus the tokens still held here.

Envoy's and Lyft's global rate limit services, and Stripe's limiters, make the same trade: a local
allowance in front of the shared counter.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from gateway.tenancy.ratelimit import Decision, RedisRateLimiter, policy_value
from gateway.tenancy.tiers import RateLimit

__all__ = ["LeasedRateLimiter"]


@dataclass
class _Lease:
    """Tokens of one bucket this process holds."""

    limit: RateLimit
    tokens: int  # left to hand out here
    remaining: int  # what the bucket had left once this lease was taken
    full_at: float  # when the bucket is full again (this process's clock)
    taken_at: float
    size: int  # what the next lease asks for


class LeasedRateLimiter:
    """A :class:`gateway.tenancy.ratelimit.RateLimiter` handing out tokens it leased from Redis.

    Args:
        shared: the limiter every process shares.
        share: the largest lease, as a share of a bucket's burst (0 < share <= 0.5).
        lease_s: how long tokens are held before they are dropped.
        clock: seconds, monotonic (tests pass their own).
        max_buckets: leases kept before the expired ones are dropped.
    """

    def __init__(
        self,
        shared: RedisRateLimiter,
        *,
        share: float = 0.02,
        lease_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        max_buckets: int = 100_000,
    ) -> None:
        if not 0 < share <= 0.5:
            raise ValueError(f"share must be in (0, 0.5], got {share}")
        self.shared = shared
        self._share = share
        self._lease_s = lease_s
        self._clock = clock
        self._max_buckets = max_buckets
        self._leases: dict[str, _Lease] = {}
        # Buckets with a lease being taken: requests meanwhile take one token each, exactly as
        # without leases, so a burst of concurrent requests cannot lease many times over.
        self._leasing: set[str] = set()

    async def hit(self, bucket: str, limit: RateLimit) -> Decision:
        return (await self.hit_all([(bucket, limit)]))[0]

    async def hit_all(self, checks: Sequence[tuple[str, RateLimit]]) -> list[Decision]:
        now = self._clock()
        decisions: list[Decision] = []
        for i, (bucket, limit) in enumerate(checks):
            lease = self._leases.get(bucket)
            if lease is None or not self._holds(lease, limit, now):
                # This bucket and the ones after it: one round trip, in order, as hit_all promises.
                return decisions + await self._lease(checks[i:], now)
            lease.tokens -= 1
            decisions.append(
                Decision(
                    True,
                    limit.burst,
                    lease.remaining + lease.tokens,
                    max(0.0, lease.full_at - now),
                    0.0,
                    policy_value(limit),
                )
            )
        return decisions

    def _holds(self, lease: _Lease, limit: RateLimit, now: float) -> bool:
        return lease.tokens > 0 and lease.limit == limit and now - lease.taken_at < self._lease_s

    async def _lease(self, checks: Sequence[tuple[str, RateLimit]], now: float) -> list[Decision]:
        mine = [bucket for bucket, _ in checks if bucket not in self._leasing]
        wanted = [
            self._next_size(bucket, limit, now) if bucket in mine else 1 for bucket, limit in checks
        ]
        self._leasing.update(mine)
        try:
            decisions = await self.shared.take_all(checks, wanted)
        finally:
            self._leasing.difference_update(mine)
        now = self._clock()
        for (bucket, limit), size, decision in zip(checks, wanted, decisions, strict=False):
            if bucket in mine and decision.allowed and not decision.degraded:
                old = self._leases.get(bucket)
                # A bucket after the one that needed Redis may still hold tokens: they stay held.
                held = old.tokens if old is not None and self._holds(old, limit, now) else 0
                lease = _Lease(
                    limit,
                    held + decision.granted - 1,  # one is this request's
                    decision.remaining,
                    now + decision.reset_s,
                    now,
                    size,
                )
                self._keep(bucket, lease)
        # The caller sees what one request took: the lease is this process's business.
        return [_as_request(d) for d in decisions]

    def _next_size(self, bucket: str, limit: RateLimit, now: float) -> int:
        largest = max(1, int(limit.burst * self._share))
        lease = self._leases.get(bucket)
        if lease is None or lease.limit != limit or largest == 1:
            return 1
        if lease.tokens <= 0 and now - lease.taken_at < self._lease_s / 2:
            return min(largest, lease.size * 2)  # used up quickly: a larger one next
        return max(1, min(largest, lease.size // 2))

    def _keep(self, bucket: str, lease: _Lease) -> None:
        self._leases[bucket] = lease
        if len(self._leases) > self._max_buckets:
            stale = lease.taken_at - self._lease_s
            for key in [k for k, v in self._leases.items() if v.taken_at <= stale]:
                del self._leases[key]

    async def close(self) -> None:
        self._leases.clear()
        await self.shared.close()


def _as_request(decision: Decision) -> Decision:
    if decision.granted <= 1:
        return decision
    # The lease's other tokens are still the client's: they count as remaining.
    return replace(decision, remaining=decision.remaining + decision.granted - 1, granted=1)
