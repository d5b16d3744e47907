"""Rate-limit tiers: what a tier of clients may do (rates, priority, in-flight share) and the default tiers.

``GATEWAY_TIER_LIMITS`` (:class:`gateway.settings.GatewaySettings`) replaces the table; keys and JWT
claims name a tier.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from serving.limits import DEFAULT_LIMITS

__all__ = ["DEFAULT_TIER", "DEFAULT_TIER_LIMITS", "RateLimit", "TierLimit"]

DEFAULT_TIER = "free"


class RateLimit(BaseModel):
    """A sustained rate plus a burst (one GCRA bucket).

    Args:
        per_minute: sustained requests per minute.
        burst: how many requests may arrive back to back before the sustained rate applies.
    """

    model_config = ConfigDict(frozen=True)

    per_minute: float = Field(gt=0, allow_inf_nan=False)
    burst: int = Field(ge=1)


class TierLimit(BaseModel):
    """What a tier may do: its rate per (client, model), across all models, priority and share.

    Args:
        per_minute, burst: the rate per (client, model) (both or neither; neither with no key rate
            either is an unlimited tier: no rate limit at all, usage still metered).
        key_per_minute, key_burst: the rate per client across every model (both or neither; none
            means no cross-model limit).
        priority: the Triton request priority of this tier's requests (1 is served first).
        in_flight_share: the fraction of ``max_in_flight_per_model`` this tier's requests may hold
            together; under overload lower shares are shed first (429), the rest stays for higher tiers.
        max_concurrent: requests of one key in flight at once, across models (429 past it), as
            Stripe's concurrent-requests limiter; ``None``: no such bound.
        max_body_bytes: the largest request body (before decoding) this tier may send, counted while
            it is read, before any parse (413); ``None``: the gateway's ``max_body_bytes``. A body's
            parse runs in the process that serves every tenant, so the lower tiers get less.
        max_inflight_bytes: the body bytes one key may have in flight at once (bodies being received
            plus requests being served), counted as they are read, before any parse (429 past it;
            413 for one body larger than it), as :mod:`gateway.tenancy.inflight_bytes` counts them
            per gateway process; ``None``: no such bound.
    """

    model_config = ConfigDict(frozen=True)

    per_minute: float | None = Field(None, gt=0, allow_inf_nan=False)
    burst: int | None = Field(None, ge=1)
    key_per_minute: float | None = Field(None, gt=0, allow_inf_nan=False)
    key_burst: int | None = Field(None, ge=1)
    priority: int = Field(
        DEFAULT_LIMITS.queue.default_priority_level, ge=1, le=DEFAULT_LIMITS.queue.priority_levels
    )
    in_flight_share: float = Field(1.0, gt=0, le=1, allow_inf_nan=False)
    max_concurrent: int | None = Field(None, ge=1)
    max_body_bytes: int | None = Field(None, ge=1)
    max_inflight_bytes: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _rates_complete(self) -> TierLimit:
        if (self.per_minute is None) != (self.burst is None):
            raise ValueError("per_minute and burst go together")
        if (self.key_per_minute is None) != (self.key_burst is None):
            raise ValueError("key_per_minute and key_burst go together")
        return self

    def model_limit(self) -> RateLimit | None:
        """The per-(client, model) limit, if the tier has one."""
        if self.per_minute is None or self.burst is None:
            return None
        return RateLimit(per_minute=self.per_minute, burst=self.burst)

    def key_limit(self) -> RateLimit | None:
        """The per-client limit across every model, if the tier has one."""
        if self.key_per_minute is None or self.key_burst is None:
            return None
        return RateLimit(per_minute=self.key_per_minute, burst=self.key_burst)

    @property
    def unlimited(self) -> bool:
        """No rate limit of any kind (requests are still metered and still bounded in flight)."""
        return self.model_limit() is None and self.key_limit() is None


DEFAULT_TIER_LIMITS: dict[str, TierLimit] = {
    "free": TierLimit(
        per_minute=10,
        burst=5,
        key_per_minute=20,
        key_burst=10,
        priority=3,
        in_flight_share=0.5,
        max_concurrent=4,
        max_body_bytes=2 * 1024 * 1024,
        max_inflight_bytes=4 * 1024 * 1024,
    ),
    "standard": TierLimit(
        per_minute=100, burst=20, key_per_minute=300, key_burst=50, priority=2, in_flight_share=0.8
    ),
    "premium": TierLimit(
        per_minute=1000,
        burst=100,
        key_per_minute=3000,
        key_burst=300,
        priority=1,
        in_flight_share=1.0,
    ),
    # Contracted volume billed from usage metering (GET /admin/usage): no rate limit.
    "enterprise": TierLimit(priority=1, in_flight_share=1.0),
}
