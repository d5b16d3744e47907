"""Gateway configuration: one typed object, read from ``GATEWAY_*`` environment variables.

Every field has a ``DEFAULT_*`` constant so the CLI, the tests and the README quote the same
values. Nothing here is read at import time: :class:`GatewaySettings` reads the environment when
it is instantiated (by the CLI, ``serve`` or a test).
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = [
    "DEFAULT_ADMIN_TOKEN",
    "DEFAULT_HOST",
    "DEFAULT_KEYS_DB",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_IN_FLIGHT_PER_MODEL",
    "DEFAULT_PORT",
    "DEFAULT_STATS_WINDOW_S",
    "DEFAULT_TIER",
    "DEFAULT_TIER_LIMITS",
    "DEFAULT_TRITON_HTTP_URL",
    "DEFAULT_UPSTREAM_TIMEOUT_S",
    "GatewaySettings",
    "RedisFailurePolicy",
    "TierLimit",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_TRITON_HTTP_URL = "127.0.0.1:8000"
DEFAULT_KEYS_DB = Path("gateway_keys.sqlite3")
DEFAULT_ADMIN_TOKEN = ""  # empty: the admin API is switched off
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_IN_FLIGHT_PER_MODEL = 64
DEFAULT_UPSTREAM_TIMEOUT_S = 30.0
DEFAULT_TRITON_POOL_SIZE = 64
DEFAULT_TRITON_HEALTH_TIMEOUT_S = 0.5
DEFAULT_STATS_WINDOW_S = 60.0
DEFAULT_STATS_MAX_SAMPLES = 20_000
DEFAULT_TRITON_STATS_INTERVAL_S = 2.0
DEFAULT_MAX_CLIENT_LABELS = 100
DEFAULT_KEY_CACHE_TTL_S = 5.0
DEFAULT_REDIS_TIMEOUT_S = 0.25
DEFAULT_REDIS_RETRY_AFTER_S = 1.0
DEFAULT_RETRY_AFTER_S = 1
DEFAULT_TIER = "free"


class RedisFailurePolicy(StrEnum):
    """What the rate limiter does while Redis cannot be reached."""

    OPEN = "open"  # admit the request (availability over strict limits)
    CLOSED = "closed"  # refuse with 503 + Retry-After (strict limits over availability)


class TierLimit(BaseModel):
    """A sustained rate plus a burst, applied per (client, model).

    Args:
        per_minute: sustained requests per minute.
        burst: how many requests may arrive back to back before the sustained rate applies.
    """

    model_config = ConfigDict(frozen=True)

    per_minute: float = Field(gt=0)
    burst: int = Field(ge=1)


DEFAULT_TIER_LIMITS: dict[str, TierLimit] = {
    "free": TierLimit(per_minute=10, burst=5),
    "standard": TierLimit(per_minute=100, burst=20),
    "premium": TierLimit(per_minute=1000, burst=100),
}


class GatewaySettings(BaseSettings):
    """Everything the gateway can be told, each field also an env var ``GATEWAY_<FIELD>``.

    Complex fields (``tier_limits``, ``model_aliases``) take JSON in the environment, e.g.
    ``GATEWAY_TIER_LIMITS='{"free": {"per_minute": 10, "burst": 5}}'``.
    """

    model_config = SettingsConfigDict(env_prefix="GATEWAY_", extra="ignore", frozen=True)

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    triton_http_url: str = Field(DEFAULT_TRITON_HTTP_URL, description="host:port of Triton's HTTP endpoint")
    triton_pool_size: int = Field(DEFAULT_TRITON_POOL_SIZE, ge=1)
    triton_health_timeout_s: float = Field(DEFAULT_TRITON_HEALTH_TIMEOUT_S, gt=0)
    triton_stats_interval_s: float = Field(
        DEFAULT_TRITON_STATS_INTERVAL_S, ge=0, description="0 switches polling off"
    )
    keys_db: Path = DEFAULT_KEYS_DB
    key_cache_ttl_s: float = Field(DEFAULT_KEY_CACHE_TTL_S, ge=0)
    admin_token: SecretStr = SecretStr(DEFAULT_ADMIN_TOKEN)
    jwt_secret: SecretStr = SecretStr("")
    jwt_public_key: str = Field("", description="PEM text or a path to a PEM file, for RS256")
    jwt_issuer: str = ""
    jwt_audience: str = ""
    jwt_algorithms: tuple[str, ...] = ("RS256", "HS256")
    redis_url: SecretStr = Field(SecretStr(""), description="empty: rate limits live in this process")
    redis_failure_policy: RedisFailurePolicy = RedisFailurePolicy.OPEN
    redis_timeout_s: float = Field(DEFAULT_REDIS_TIMEOUT_S, gt=0)
    redis_retry_after_s: float = Field(DEFAULT_REDIS_RETRY_AFTER_S, ge=0)
    tier_limits: dict[str, TierLimit] = Field(default_factory=lambda: dict(DEFAULT_TIER_LIMITS))
    default_tier: str = DEFAULT_TIER
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=1)
    max_in_flight_per_model: int = Field(DEFAULT_MAX_IN_FLIGHT_PER_MODEL, ge=1)
    upstream_timeout_s: float = Field(DEFAULT_UPSTREAM_TIMEOUT_S, gt=0)
    retry_after_s: int = Field(DEFAULT_RETRY_AFTER_S, ge=1)
    stats_window_s: float = Field(DEFAULT_STATS_WINDOW_S, gt=0)
    stats_max_samples: int = Field(DEFAULT_STATS_MAX_SAMPLES, ge=100)
    max_client_labels: int = Field(DEFAULT_MAX_CLIENT_LABELS, ge=1)
    classifier_model: str = "image_classifier"
    embedding_model: str = "text_embedding"
    image_generation_model: str = "stable_diffusion"
    model_aliases: dict[str, str] = Field(
        default_factory=dict,
        description='public name -> Triton model, e.g. {"all-MiniLM-L6-v2": "text_embedding"}',
    )
    log_level: str = "info"

    @field_validator("triton_http_url")
    @classmethod
    def _no_scheme(cls, value: str) -> str:
        # tritonclient wants host:port; accept a pasted URL rather than failing later.
        return value.removeprefix("http://").removeprefix("https://").rstrip("/")

    @field_validator("default_tier")
    @classmethod
    def _tier_name(cls, value: str) -> str:
        return value.strip()

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
