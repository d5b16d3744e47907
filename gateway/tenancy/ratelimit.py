"""Per (client, model) rate limits with GCRA, in process or atomically in Redis.

GCRA (the generic cell rate algorithm) is a token bucket kept as one number per bucket: the
"theoretical arrival time" (TAT). With emission interval ``T = 60 / per_minute`` and burst ``b``, a
request at time ``now`` is admitted when ``max(TAT, now) + T - now <= b * T``; admitting moves TAT
forward by ``T``. One number means one atomic read-modify-write, which in Redis is a single Lua
script (so every gateway replica shares one limit), and the Redis server's clock is used so replicas'
clocks need not agree.

Redis errors never escape as Redis errors: the limiter follows the configured policy, admitting
(``open``) or raising :class:`gateway.errors.RateLimiterUnavailable` (``closed``), and stops trying
Redis for a short back-off so an outage does not add a timeout to every request.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gateway.errors import RateLimiterUnavailable
from gateway.tenancy.settings import RedisFailurePolicy
from gateway.tenancy.tiers import RateLimit

__all__ = [
    "Decision",
    "InProcessRateLimiter",
    "RateLimiter",
    "RedisRateLimiter",
    "gcra",
    "openai_duration",
    "policy_value",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Decision:
    """The outcome of one rate-limit check.

    Attributes:
        allowed: whether the request may proceed.
        limit: the burst size (requests that may arrive at once).
        remaining: requests still admissible right now.
        reset_s: seconds until the bucket is full again.
        retry_after_s: seconds until a refused request would be admitted (0 when allowed).
        policy: the RateLimit-Policy header value, e.g. ``100;w=60;burst=20``.
        degraded: Redis was unreachable and the request was admitted by the fail-open policy.
        granted: tokens taken from the bucket (1 for a request; up to the number asked for by
            :meth:`RedisRateLimiter.take_all`, which leases several; 0 when refused).
    """

    allowed: bool
    limit: int
    remaining: int
    reset_s: float
    retry_after_s: float
    policy: str
    degraded: bool = False
    granted: int = 1

    def headers(self) -> dict[str, str]:
        """IETF draft RateLimit headers and OpenAI's ``x-ratelimit-*-requests`` ones, which OpenAI
        clients read (plus Retry-After when refused). Only requests are limited, so no ``-tokens``."""
        out = {
            "RateLimit-Limit": str(self.limit),
            "RateLimit-Remaining": str(self.remaining),
            "RateLimit-Reset": str(math.ceil(self.reset_s)),
            "RateLimit-Policy": self.policy,
            "x-ratelimit-limit-requests": str(self.limit),
            "x-ratelimit-remaining-requests": str(self.remaining),
            "x-ratelimit-reset-requests": openai_duration(self.reset_s),
        }
        if not self.allowed:
            out["Retry-After"] = str(max(1, math.ceil(self.retry_after_s)))
        return out


def openai_duration(seconds: float) -> str:
    """A duration as OpenAI's reset headers write it: ``"250ms"``, ``"1s"``, ``"6m0s"``, ``"1h2m3s"``."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    whole = math.ceil(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def policy_value(limit: RateLimit) -> str:
    """The ``RateLimit-Policy`` header value of ``limit``, e.g. ``100;w=60;burst=20``."""
    rate = int(limit.per_minute) if float(limit.per_minute).is_integer() else limit.per_minute
    return f"{rate};w=60;burst={limit.burst}"


def gcra(tat: float, now: float, limit: RateLimit) -> tuple[float, Decision]:
    """One GCRA step.

    Args:
        tat: the stored theoretical arrival time (``0`` for a new bucket).
        now: the current time, same clock as ``tat``.
        limit: the rate and burst.

    Returns:
        ``(new_tat, decision)``; ``new_tat == tat`` when the request is refused.
    """
    interval = 60.0 / limit.per_minute
    window = interval * limit.burst
    base = max(tat, now)
    new_tat = base + interval
    diff = new_tat - now
    if diff > window + 1e-9:
        return tat, Decision(
            False, limit.burst, 0, base - now, diff - window, policy_value(limit), granted=0
        )
    remaining = int((window - diff) / interval + 1e-9)
    return new_tat, Decision(True, limit.burst, remaining, diff, 0.0, policy_value(limit))


class RateLimiter(Protocol):
    """Checks (and consumes) one request's worth of a bucket."""

    async def hit(self, bucket: str, limit: RateLimit) -> Decision: ...

    async def hit_all(self, checks: Sequence[tuple[str, RateLimit]]) -> list[Decision]:
        """Hit each bucket in order until one refuses: the decisions so far, the refusal last
        (buckets after it are not touched). In Redis, one round trip for them all."""
        ...

    async def close(self) -> None: ...


class InProcessRateLimiter:
    """GCRA buckets in a dict: for one gateway process (the embedded default).

    Args:
        max_buckets: buckets kept before the stalest are dropped (a dropped bucket is full again,
            which only ever errs towards admitting).
    """

    def __init__(self, max_buckets: int = 100_000) -> None:
        self._tats: dict[str, float] = {}
        self._max_buckets = max_buckets

    async def hit_all(self, checks: Sequence[tuple[str, RateLimit]]) -> list[Decision]:
        decisions: list[Decision] = []
        for bucket, limit in checks:
            decisions.append(await self.hit(bucket, limit))
            if not decisions[-1].allowed:
                break
        return decisions

    async def hit(self, bucket: str, limit: RateLimit) -> Decision:
        now = time.monotonic()
        new_tat, decision = gcra(self._tats.get(bucket, 0.0), now, limit)
        if decision.allowed:
            self._tats[bucket] = new_tat
            if len(self._tats) > self._max_buckets:
                self._evict(now)
        return decision

    def _evict(self, now: float) -> None:
        # A bucket whose TAT is in the past is full; forgetting it changes nothing.
        for key in [k for k, tat in self._tats.items() if tat <= now]:
            del self._tats[key]

    async def close(self) -> None:
        self._tats.clear()


# KEYS: the buckets, in order; ARGV: interval_us, burst and tokens wanted of each in turn. A bucket
# grants what it has, up to the tokens wanted (GCRA with a cost: TAT moves forward one interval per
# token), and refuses only when it has none. Each bucket's answer is {allowed, remaining, reset_us,
# retry_after_us, granted}, all in one flat list; the first refusal ends it. Wanting one token is
# exactly the one-request GCRA of :func:`gcra`.
_GCRA_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out = {}
for i, key in ipairs(KEYS) do
  local interval = tonumber(ARGV[3 * i - 2])
  local burst = tonumber(ARGV[3 * i - 1])
  local wanted = tonumber(ARGV[3 * i])
  local tat = tonumber(redis.call('GET', key) or '0')
  if tat < now then tat = now end
  local window = interval * burst
  local free = math.floor((window - (tat - now)) / interval)
  if free < 1 then
    for _, v in ipairs({0, 0, tat - now, tat + interval - now - window, 0}) do out[#out + 1] = v end
    return out
  end
  local taken = math.min(wanted, free)
  local diff = tat + taken * interval - now
  redis.call('SET', key, string.format('%.0f', tat + taken * interval), 'PX', math.ceil(diff / 1000) + 1000)
  for _, v in ipairs({1, free - taken, diff, 0, taken}) do out[#out + 1] = v end
end
return out
"""


class RedisRateLimiter:
    """GCRA in Redis, one Lua script per request's checks, shared by every replica using the same Redis.

    Args:
        url: a ``redis://`` URL.
        failure_policy: admit (``open``) or refuse (``closed``) while Redis is unreachable.
        timeout_s: connect and command timeout; keeps an outage from stalling requests.
        retry_after_s: after a failure, skip Redis for this long (and tell refused clients to wait it).
        prefix: key namespace, so several deployments can share one Redis.
    """

    def __init__(
        self,
        url: str,
        *,
        failure_policy: RedisFailurePolicy = RedisFailurePolicy.OPEN,
        timeout_s: float = 0.25,
        retry_after_s: float = 1.0,
        prefix: str = "gw:rl:",
    ) -> None:
        import redis.asyncio as aioredis  # the gateway extra provides it; imported only when used

        self._redis = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry_on_timeout=False
        )
        self._script = self._redis.register_script(_GCRA_LUA)
        self._policy = failure_policy
        self._retry_after_s = retry_after_s
        self._prefix = prefix
        self._down_until = 0.0
        self._timeout_s = timeout_s

    @property
    def available(self) -> bool:
        """False during the back-off that follows a Redis failure."""
        return time.monotonic() >= self._down_until

    async def hit(self, bucket: str, limit: RateLimit) -> Decision:
        return (await self.hit_all([(bucket, limit)]))[0]

    async def hit_all(self, checks: Sequence[tuple[str, RateLimit]]) -> list[Decision]:
        return await self.take_all(checks, [1] * len(checks))

    async def take_all(
        self, checks: Sequence[tuple[str, RateLimit]], wanted: Sequence[int]
    ) -> list[Decision]:
        """:meth:`hit_all` taking up to ``wanted[i]`` tokens from bucket ``i`` (at least one, or
        it refuses): how :class:`gateway.tenancy.ratelimit_lease.LeasedRateLimiter` leases tokens.
        Each decision's ``granted`` says how many were taken."""
        if not self.available:
            return [self._on_failure(limit) for _, limit in checks]
        args: list[int] = []
        for (_, limit), count in zip(checks, wanted, strict=True):
            args += [int(60_000_000 / limit.per_minute), limit.burst, max(1, count)]
        try:
            # The client's own socket timeout covers I/O; wait_for also bounds reconnect loops.
            flat = await asyncio.wait_for(
                self._script(keys=[self._prefix + bucket for bucket, _ in checks], args=args),
                timeout=self._timeout_s * 2,
            )
        except Exception as exc:  # any Redis/socket failure takes the configured policy
            self._down_until = time.monotonic() + self._retry_after_s
            log.warning(
                "rate limiter: Redis unavailable (%s); policy=%s",
                type(exc).__name__,
                self._policy.value,
            )
            return [self._on_failure(limit) for _, limit in checks]
        return [
            Decision(
                allowed=bool(flat[i]),
                limit=limit.burst,
                remaining=int(flat[i + 1]),
                reset_s=int(flat[i + 2]) / 1e6,
                retry_after_s=int(flat[i + 3]) / 1e6,
                policy=policy_value(limit),
                granted=int(flat[i + 4]),
            )
            for i, (_, limit) in zip(range(0, len(flat), 5), checks, strict=False)
        ]

    def _on_failure(self, limit: RateLimit) -> Decision:
        if self._policy is RedisFailurePolicy.CLOSED:
            raise RateLimiterUnavailable(
                "rate limiter store (Redis) is unreachable and the failure policy is 'closed'",
                retry_after_s=max(1.0, self._retry_after_s),
            )
        return Decision(
            True, limit.burst, limit.burst, 0.0, 0.0, policy_value(limit), degraded=True
        )

    async def ping(self) -> bool:
        """Whether Redis answers now (for readiness details)."""
        try:
            return bool(await asyncio.wait_for(self._redis.ping(), timeout=self._timeout_s * 2))
        except Exception:  # a probe: any failure means "no"
            return False

    async def close(self) -> None:
        await self._redis.aclose()
