"""Settings of tenancy (API keys and their cache, the admin and metrics credentials, JWTs, tiers and
rate limits, admission, usage metering, the secret policy), part of
:class:`gateway.settings.GatewaySettings`.

Each field is the environment variable ``GATEWAY_<FIELD>``; ``GATEWAY_TIER_LIMITS`` takes JSON, e.g.
``GATEWAY_TIER_LIMITS='{"free": {"per_minute": 10, "burst": 5}}'``.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from pydantic import Field, SecretStr, field_validator

from gateway.env_settings import EnvSettings, count, seconds
from gateway.tenancy.tiers import DEFAULT_TIER, DEFAULT_TIER_LIMITS, TierLimit

__all__ = [
    "DEFAULT_ADMIN_TOKEN",
    "DEFAULT_IN_FLIGHT_RESERVE",
    "DEFAULT_KEYS_DB",
    "DEFAULT_KEY_CACHE_TTL_S",
    "DEFAULT_MAX_IN_FLIGHT_PER_MODEL",
    "DEFAULT_RATE_LIMIT_LEASE_S",
    "DEFAULT_RATE_LIMIT_LEASE_SHARE",
    "DEFAULT_REDIS_RETRY_AFTER_S",
    "DEFAULT_REDIS_TIMEOUT_S",
    "DEFAULT_RETRY_AFTER_S",
    "DEFAULT_USAGE_FLUSH_INTERVAL_S",
    "DEFAULT_USAGE_RETENTION_DAYS",
    "RedisFailurePolicy",
    "TenancySettings",
]

DEFAULT_KEYS_DB = Path("gateway_keys.sqlite3")
DEFAULT_ADMIN_TOKEN = ""  # empty: the admin API is switched off
DEFAULT_MAX_IN_FLIGHT_PER_MODEL = 64
#: the share of each in-flight bound kept for the highest tier (Stripe's fleet load shedder keeps 20%)
DEFAULT_IN_FLIGHT_RESERVE = 0.2
DEFAULT_KEY_CACHE_TTL_S = 5.0
DEFAULT_REDIS_TIMEOUT_S = 0.25
DEFAULT_REDIS_RETRY_AFTER_S = 1.0
DEFAULT_RETRY_AFTER_S = 1
DEFAULT_RATE_LIMIT_LEASE_SHARE = 0.02
DEFAULT_RATE_LIMIT_LEASE_S = 1.0
DEFAULT_USAGE_FLUSH_INTERVAL_S = 1.0
DEFAULT_USAGE_RETENTION_DAYS = 400


class RedisFailurePolicy(StrEnum):
    """What the rate limiter does while Redis cannot be reached."""

    OPEN = "open"  # admit the request (availability over strict limits)
    CLOSED = "closed"  # refuse with 503 + Retry-After (strict limits over availability)


class TenancySettings(EnvSettings):
    """The key, credential, ``jwt_*``, ``redis_failure_policy``/``redis_*_s``, ``rate_limit_lease_*``,
    tier, in-flight,
    ``usage_*`` fields and ``dev_insecure``."""

    keys_db: Path = DEFAULT_KEYS_DB
    key_cache_ttl_s: float = seconds(DEFAULT_KEY_CACHE_TTL_S, zero=True)
    admin_token: SecretStr = SecretStr(DEFAULT_ADMIN_TOKEN)
    metrics_token: SecretStr = Field(
        SecretStr(""),
        description="bearer credential for /metrics (the admin token works too); "
        "empty with no admin token: /metrics is off",
    )
    jwt_secret: SecretStr = SecretStr("")
    jwt_public_key: str = Field("", description="PEM text or a path to a PEM file, for RS256")
    jwt_issuer: str = ""
    jwt_audience: str = ""
    jwt_algorithms: tuple[str, ...] = ("RS256", "HS256")
    redis_failure_policy: RedisFailurePolicy = RedisFailurePolicy.OPEN
    redis_timeout_s: float = seconds(DEFAULT_REDIS_TIMEOUT_S)
    redis_retry_after_s: float = seconds(DEFAULT_REDIS_RETRY_AFTER_S, zero=True)
    rate_limit_lease_share: float = Field(
        DEFAULT_RATE_LIMIT_LEASE_SHARE,
        ge=0,
        le=0.5,
        allow_inf_nan=False,
        description="with Redis: the largest share of a bucket's burst one process leases at once "
        "(gateway/tenancy/ratelimit_lease.py); 0: ask Redis for every request",
    )
    rate_limit_lease_s: float = seconds(
        DEFAULT_RATE_LIMIT_LEASE_S,
        "how long a process holds leased tokens before dropping them",
        most=60,
    )
    tier_limits: dict[str, TierLimit] = Field(default_factory=lambda: dict(DEFAULT_TIER_LIMITS))
    default_tier: str = DEFAULT_TIER
    max_in_flight_per_model: int = count(DEFAULT_MAX_IN_FLIGHT_PER_MODEL)
    in_flight_reserve: float = Field(
        DEFAULT_IN_FLIGHT_RESERVE,
        ge=0,
        lt=1,
        allow_inf_nan=False,
        description="share of each model's in-flight bound only the highest tier may use (503 for "
        "the others)",
    )
    retry_after_s: int = count(DEFAULT_RETRY_AFTER_S)
    usage_db: Path | None = Field(
        None,
        description="SQLite file of usage counts when there is no Redis (default: gateway_usage.sqlite3 "
        "next to keys_db)",
    )
    usage_flush_interval_s: float = seconds(
        DEFAULT_USAGE_FLUSH_INTERVAL_S,
        "how often a process adds its usage counts to the store",
        most=60,
    )
    usage_retention_days: int = count(DEFAULT_USAGE_RETENTION_DAYS, "days of usage Redis keeps")
    dev_insecure: bool = Field(
        False,
        description="development only: serve although a secret is empty or a placeholder (a warning is "
        "logged); see gateway/tenancy/secret_policy.py",
    )

    @field_validator("default_tier")
    @classmethod
    def _tier_name(cls, value: str) -> str:
        return value.strip()

    def usage_path(self) -> Path:
        """The SQLite usage file: ``usage_db``, else next to the key store."""
        return self.usage_db or self.keys_db.parent / "gateway_usage.sqlite3"

    def tier_limit(self, tier: str) -> TierLimit:
        """The limit for ``tier``, falling back to the default tier for unknown names.

        Args:
            tier: a tier name as stored on a key or a JWT claim.

        Returns:
            The configured :class:`TierLimit`.
        """
        return (
            self.tier_limits.get(tier)
            or self.tier_limits.get(self.default_tier)
            or DEFAULT_TIER_LIMITS["free"]
        )
