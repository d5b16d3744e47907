"""Refused requests cost a rate-limit token too, so no key makes the gateway work for free.

A request a client key sent that was answered 4xx without taking a token (a malformed body, an
unknown model name under a tier without a limit across models) takes one afterwards
(:class:`RefusalCharge`, called by :mod:`gateway.http.middleware`); once the key's bucket is empty
its next requests are refused 429 before any work (the body is not even read) until the bucket has room.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from gateway.errors import RateLimited
from gateway.settings import GatewaySettings
from gateway.tenancy.admission import key_bucket
from gateway.tenancy.context import Principal, RequestContext
from gateway.tenancy.ratelimit import Decision, RateLimiter

__all__ = ["RefusalCharge", "RetryAfterWatch", "refusal_bucket"]


def refusal_bucket(client_id: str) -> str:
    """The bucket a client's refused requests draw on when its tier has no limit across models
    (``!`` is no model name)."""
    return f"{client_id}:!"


#: answers that cost no token afterwards: 401 has no key to charge, 429 was the limit speaking
_UNCHARGED = frozenset({401, 429})
#: keys remembered as out of tokens before the memory is emptied
_MAX_BLOCKED = 100_000


class RefusalCharge:
    """Charges refused requests a rate-limit token, and refuses a key whose tokens they used up.

    The token comes from the key's bucket across all models when its tier has that limit (the
    bucket admitted requests take from), else from :func:`refusal_bucket` at the tier's per-model
    rate. When a charge finds the bucket empty, the key is refused in this process without asking
    the limiter again until the bucket has room (checking is a dict lookup, so the hot path pays
    nothing for it).

    Args:
        settings: the tiers.
        limiter: the rate limiter, or ``None`` before the app has started.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        settings: GatewaySettings,
        limiter: Callable[[], RateLimiter | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self._limiter = limiter
        self._clock = clock
        self._blocked: dict[str, tuple[float, Decision]] = {}

    def refusal(self, principal: Principal) -> RateLimited | None:
        """The 429 for a key whose refused requests used up its tokens, else ``None``."""
        blocked = self._blocked.get(principal.client_id)
        if blocked is None:
            return None
        until, decision = blocked
        left = until - self._clock()
        if left <= 0:
            del self._blocked[principal.client_id]
            return None
        return RateLimited(
            f"rate limit exceeded by refused requests (tier '{principal.tier}'); refused requests cost "
            "a token too",
            retry_after_s=left,
            headers={**decision.headers(), "Retry-After": str(max(1, math.ceil(left)))},
        )

    async def charge(self, ctx: RequestContext, status: int) -> None:
        """Take a token for a request answered ``status`` if it was refused without taking one."""
        principal = ctx.principal
        limiter = self._limiter()
        if (
            ctx.charged
            or principal is None
            or principal.kind == "admin"
            or limiter is None
            or not 400 <= status < 500
            or status in _UNCHARGED
        ):
            return
        tier = self.settings.tier_limit(principal.tier)
        key_limit = tier.key_limit()
        limit = key_limit or tier.model_limit()
        if limit is None:
            return  # an unlimited tier
        bucket = (
            key_bucket(principal.client_id)
            if key_limit is not None
            else refusal_bucket(principal.client_id)
        )
        ctx.charged = True
        decision = await limiter.hit(bucket, limit)
        if not decision.allowed or decision.remaining == 0:
            # Empty now: the next request would be refused; until a token is back, refuse it here.
            wait = (
                decision.retry_after_s
                if not decision.allowed
                else (decision.reset_s - (limit.burst - 1) * 60.0 / limit.per_minute)
            )
            if len(self._blocked) > _MAX_BLOCKED:
                self._blocked.clear()
            self._blocked[principal.client_id] = (self._clock() + max(wait, 0.0), decision)


class RetryAfterWatch:
    """Which keys send again before the ``Retry-After`` of their last 429 has passed.

    Such a key's connection is then not read for the rest of that wait
    (:mod:`gateway.http.read_hold`): its closed loop of refused requests stops costing the event loop.

    Args:
        hold_max_s: the longest hold, whatever the ``Retry-After`` said.
        clock: monotonic seconds.
    """

    def __init__(self, hold_max_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.hold_max_s = hold_max_s
        self._clock = clock
        self._told: dict[str, float] = {}  # client id -> when its last Retry-After ends

    def note(self, client_id: str, retry_after_s: float) -> float:
        """Record a 429 telling ``client_id`` to wait ``retry_after_s``; the seconds to hold its
        connection (0: it had not been told to wait, or its wait was over)."""
        now = self._clock()
        told = self._told.get(client_id, 0.0)
        if len(self._told) > _MAX_BLOCKED:
            self._told.clear()
        self._told[client_id] = max(told, now + retry_after_s)
        return min(told - now, self.hold_max_s) if told > now else 0.0
