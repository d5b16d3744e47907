"""Gateway configuration: one typed object, read from ``GATEWAY_*`` environment variables.

Every field has a ``DEFAULT_*`` constant so the CLI, the tests and the README quote the same
values. Nothing here is read at import time: :class:`GatewaySettings` reads the environment when
it is instantiated (by the CLI, ``serve`` or a test).
"""

from __future__ import annotations

import math
import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from gateway.backends.catalog import model_name_problem
from gateway.backends.model_breaker import DEFAULT_BREAKER_FAILURES
from gateway.backends.model_healer import DEFAULT_HEAL_LOAD_TIMEOUT_S, DEFAULT_HEAL_MAX_BACKOFF_S
from gateway.backends.residency_settings import ResidencySettings
from gateway.jobs.settings import JobSettings
from gateway.tenancy.tiers import DEFAULT_TIER, DEFAULT_TIER_LIMITS, TierLimit
from serving.readiness import parse_model_list

__all__ = [
    "DEFAULT_ADMIN_TOKEN",
    "DEFAULT_HOST",
    "DEFAULT_KEYS_DB",
    "DEFAULT_BODY_TIMEOUT_S",
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_KEEP_ALIVE_TIMEOUT_S",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_CONNECTIONS_PER_PEER",
    "DEFAULT_ACCEPT_RATE_PER_S",
    "DEFAULT_ACCEPT_BURST",
    "DEFAULT_MAX_HEADER_BYTES",
    "DEFAULT_MAX_HEADER_COUNT",
    "DEFAULT_MAX_REQUESTS_PER_CONNECTION",
    "DEFAULT_MAX_IN_FLIGHT_PER_MODEL",
    "DEFAULT_IN_FLIGHT_RESERVE",
    "DEFAULT_MODEL_INDEX_MIN_REFRESH_S",
    "DEFAULT_MODEL_INDEX_TTL_S",
    "DEFAULT_GRPC_PORT",
    "DEFAULT_PORT",
    "DEFAULT_READY_CACHE_S",
    "DEFAULT_READY_TIMEOUT_S",
    "DEFAULT_STATS_WINDOW_S",
    "DEFAULT_TRITON_GRPC_URL",
    "DEFAULT_TRITON_HTTP_URL",
    "DEFAULT_WORKERS",
    "DEFAULT_UPSTREAM_TIMEOUT_S",
    "GatewaySettings",
    "RedisFailurePolicy",
    "TritonProtocol",
    "usable_cores",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_GRPC_PORT = 0  # 0: no gRPC entry (``inferctl up`` opens one on 8081)
DEFAULT_GRPC_MAX_CONCURRENT_RPCS = 1024
DEFAULT_TRITON_HTTP_URL = "127.0.0.1:8000"
DEFAULT_TRITON_GRPC_URL = "127.0.0.1:8001"
DEFAULT_TRITON_GRPC_CHANNELS = 4
DEFAULT_REDIS_PREFIX = "gw:"
DEFAULT_STATE_SYNC_INTERVAL_S = 0.2
DEFAULT_WORKERS = 0  # 0: automatic, see GatewaySettings.worker_count
DEFAULT_KEYS_DB = Path("gateway_keys.sqlite3")
DEFAULT_ADMIN_TOKEN = ""  # empty: the admin API is switched off
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
#: worker processes per gateway process that parse big KServe v2 REST bodies (gateway.protocol.kserve.ParsePool)
DEFAULT_PARSE_WORKERS = 2
#: the smallest parse (RestBody.work_bytes) sent to a worker process: ~2.5 ms of JSON on 2 cores
DEFAULT_PARSE_PROCESS_MIN_BYTES = 64 * 1024
DEFAULT_MAX_IN_FLIGHT_PER_MODEL = 64
#: the share of each in-flight bound kept for the highest tier (Stripe's fleet load shedder keeps 20%)
DEFAULT_IN_FLIGHT_RESERVE = 0.2
# Connection limits (gateway/http/limits.py). 32 KiB of headers holds a large JWT many times over.
DEFAULT_MAX_HEADER_BYTES = 32 * 1024
DEFAULT_MAX_HEADER_COUNT = 100
DEFAULT_HEADER_TIMEOUT_S = 10.0
# A 16 MiB body at 4 Mbit/s takes about 35 s.
DEFAULT_BODY_TIMEOUT_S = 60.0
DEFAULT_MAX_CONNECTIONS = 1024
# One address: a client, or a proxy in front of the gateway (raise it to max_connections there).
DEFAULT_MAX_CONNECTIONS_PER_PEER = 256
# New connections per second from one address, and how many may come back to back (gateway/http/accept_rate.py).
DEFAULT_ACCEPT_RATE_PER_S = 200.0
DEFAULT_ACCEPT_BURST = 400
DEFAULT_KEEP_ALIVE_TIMEOUT_S = 5.0
DEFAULT_MAX_REQUESTS_PER_CONNECTION = 10_000
DEFAULT_UPSTREAM_TIMEOUT_S = 30.0
DEFAULT_TRITON_POOL_SIZE = 64
DEFAULT_TRITON_HEALTH_TIMEOUT_S = 0.5
DEFAULT_STATS_WINDOW_S = 60.0
DEFAULT_STATS_BUCKET_S = 5.0
DEFAULT_STATS_MAX_SERIES = 1000
DEFAULT_STATS_PUBLISH_INTERVAL_S = 1.0
DEFAULT_USAGE_FLUSH_INTERVAL_S = 1.0
DEFAULT_USAGE_RETENTION_DAYS = 400
DEFAULT_TRITON_STATS_INTERVAL_S = 2.0
DEFAULT_MAX_CLIENT_LABELS = 100
DEFAULT_KEY_CACHE_TTL_S = 5.0
DEFAULT_REDIS_TIMEOUT_S = 0.25
DEFAULT_REDIS_RETRY_AFTER_S = 1.0
DEFAULT_RETRY_AFTER_S = 1
DEFAULT_IMAGE_URL_TTL_S = 600.0
# Half the default deadline: a generation estimated past it becomes a job rather than risk a 504.
DEFAULT_IMAGE_ASYNC_AFTER_S = 15.0
DEFAULT_IMAGE_URL_MAX_BYTES = 256 * 1024 * 1024
DEFAULT_MODEL_INDEX_TTL_S = 5.0
DEFAULT_MODEL_INDEX_MIN_REFRESH_S = 1.0
# /readyz: how long one answer is reused, and the deadline of each readiness call / synthetic inference.
DEFAULT_READY_CACHE_S = 5.0
DEFAULT_READY_TIMEOUT_S = 5.0


def usable_cores(cgroup_cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """Cores this process may use: its CPU affinity, capped by a cgroup v2 CPU quota.

    In a container with a CPU limit the affinity still lists every core of the node; the quota
    (``cpu.max``: ``"200000 100000"`` is 2 CPUs) is what the process really gets.
    """
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = cgroup_cpu_max.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass  # no cgroup v2 quota here: the affinity is the answer
    return cores


class RedisFailurePolicy(StrEnum):
    """What the rate limiter does while Redis cannot be reached."""

    OPEN = "open"  # admit the request (availability over strict limits)
    CLOSED = "closed"  # refuse with 503 + Retry-After (strict limits over availability)


class TritonProtocol(StrEnum):
    """How the gateway talks to Triton (clients always reach the gateway over HTTP)."""

    HTTP = "http"  # tritonclient.http.aio, pooled connections
    GRPC = "grpc"  # tritonclient.grpc.aio, a few channels used in turn


class GatewaySettings(JobSettings, ResidencySettings):
    """Everything the gateway can be told, each field also an env var ``GATEWAY_<FIELD>``.

    Complex fields (``tier_limits``, ``model_aliases``) take JSON in the environment, e.g.
    ``GATEWAY_TIER_LIMITS='{"free": {"per_minute": 10, "burst": 5}}'``.
    """

    model_config = SettingsConfigDict(env_prefix="GATEWAY_", extra="ignore", frozen=True)

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    grpc_port: int = Field(
        DEFAULT_GRPC_PORT,
        ge=0,
        le=65535,
        description="port of the KServe v2 gRPC entry (same host); 0: none",
    )
    grpc_max_concurrent_rpcs: int = Field(
        DEFAULT_GRPC_MAX_CONCURRENT_RPCS,
        ge=1,
        description="gRPC calls served at once; more are refused",
    )
    triton_http_url: str = Field(
        DEFAULT_TRITON_HTTP_URL, description="host:port of Triton's HTTP endpoint"
    )
    triton_grpc_url: str = Field(
        DEFAULT_TRITON_GRPC_URL, description="host:port of Triton's gRPC endpoint"
    )
    triton_protocol: TritonProtocol = Field(
        TritonProtocol.HTTP, description="gateway -> Triton transport"
    )
    triton_pool_size: int = Field(DEFAULT_TRITON_POOL_SIZE, ge=1)
    triton_grpc_channels: int = Field(
        DEFAULT_TRITON_GRPC_CHANNELS,
        ge=1,
        le=64,
        description="gRPC channels to Triton, used in turn",
    )
    triton_health_timeout_s: float = Field(DEFAULT_TRITON_HEALTH_TIMEOUT_S, gt=0)
    triton_stats_interval_s: float = Field(
        DEFAULT_TRITON_STATS_INTERVAL_S, ge=0, description="0 switches polling off"
    )
    keys_db: Path = DEFAULT_KEYS_DB
    key_cache_ttl_s: float = Field(DEFAULT_KEY_CACHE_TTL_S, ge=0)
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
    redis_url: SecretStr = Field(
        SecretStr(""),
        description="shared store for API keys, canary weights and rate limits; empty: SQLite + this process",
    )
    redis_prefix: str = Field(
        DEFAULT_REDIS_PREFIX, min_length=1, description="namespace of every Redis key"
    )
    state_sync_interval_s: float = Field(
        DEFAULT_STATE_SYNC_INTERVAL_S,
        gt=0,
        le=1.0,
        description="how often each process checks Redis for changed keys / canary weights",
    )
    workers: int = Field(
        DEFAULT_WORKERS, ge=0, le=256, description="gateway processes; 0: automatic"
    )
    redis_failure_policy: RedisFailurePolicy = RedisFailurePolicy.OPEN
    redis_timeout_s: float = Field(DEFAULT_REDIS_TIMEOUT_S, gt=0)
    redis_retry_after_s: float = Field(DEFAULT_REDIS_RETRY_AFTER_S, ge=0)
    tier_limits: dict[str, TierLimit] = Field(default_factory=lambda: dict(DEFAULT_TIER_LIMITS))
    default_tier: str = DEFAULT_TIER
    server_timing: bool = Field(
        True,
        description="send authenticated callers a Server-Timing header with the gateway's stages",
    )
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=1)
    parse_workers: int = Field(
        DEFAULT_PARSE_WORKERS,
        ge=0,
        le=64,
        description="processes that parse big KServe v2 REST bodies and decode big OpenAI JSON bodies off the "
        "serving process; 0: a thread (KServe) or the loop (OpenAI)",
    )
    parse_process_min_bytes: int = Field(
        DEFAULT_PARSE_PROCESS_MIN_BYTES,
        ge=0,
        description="bodies whose parse weighs at least this many bytes of JSON go to a parse process",
    )
    max_header_bytes: int = Field(
        DEFAULT_MAX_HEADER_BYTES, ge=1024, description="request line plus headers"
    )
    max_header_count: int = Field(DEFAULT_MAX_HEADER_COUNT, ge=1)
    header_timeout_s: float = Field(
        DEFAULT_HEADER_TIMEOUT_S,
        gt=0,
        description="from a request's first byte to the end of its headers",
    )
    body_timeout_s: float = Field(
        DEFAULT_BODY_TIMEOUT_S,
        gt=0,
        description="from the end of the headers to the last byte of the body",
    )
    max_connections: int = Field(
        DEFAULT_MAX_CONNECTIONS,
        ge=1,
        description="open connections; past it an idle one is closed, else 429",
    )
    max_connections_per_peer: int = Field(
        DEFAULT_MAX_CONNECTIONS_PER_PEER,
        ge=1,
        description="open connections from one peer address; past it its longest idle one is closed, else 429",
    )
    accept_rate_per_s: float = Field(
        DEFAULT_ACCEPT_RATE_PER_S,
        ge=0,
        allow_inf_nan=False,
        description="new connections per second from one peer address (0: no limit); past it and the "
        "burst a canned 429 before any parsing",
    )
    accept_burst: int = Field(
        DEFAULT_ACCEPT_BURST,
        ge=1,
        description="new connections one peer address may open back to back",
    )
    keep_alive_timeout_s: float = Field(DEFAULT_KEEP_ALIVE_TIMEOUT_S, gt=0)
    max_requests_per_connection: int = Field(DEFAULT_MAX_REQUESTS_PER_CONNECTION, ge=1)
    max_in_flight_per_model: int = Field(DEFAULT_MAX_IN_FLIGHT_PER_MODEL, ge=1)
    in_flight_reserve: float = Field(
        DEFAULT_IN_FLIGHT_RESERVE,
        ge=0,
        lt=1,
        allow_inf_nan=False,
        description="share of each model's in-flight bound only the highest tier may use (503 for the others)",
    )
    upstream_timeout_s: float = Field(
        DEFAULT_UPSTREAM_TIMEOUT_S,
        gt=0,
        le=3600,
        description="each request's deadline; Triton gets what is left of it as the request timeout",
    )
    retry_after_s: int = Field(DEFAULT_RETRY_AFTER_S, ge=1)
    stats_window_s: float = Field(DEFAULT_STATS_WINDOW_S, gt=0, le=86_400)
    stats_bucket_s: float = Field(
        DEFAULT_STATS_BUCKET_S,
        gt=0,
        description="time resolution of the stats window (one sketch per bucket)",
    )
    stats_max_series: int = Field(
        DEFAULT_STATS_MAX_SERIES,
        ge=1,
        description="(model, client) pairs per time bucket before new clients are counted as _other",
    )
    stats_publish_interval_s: float = Field(
        DEFAULT_STATS_PUBLISH_INTERVAL_S,
        gt=0,
        description="how often a process shares its latency sketches",
    )
    usage_db: Path | None = Field(
        None,
        description="SQLite file of usage counts when there is no Redis (default: gateway_usage.sqlite3 "
        "next to keys_db)",
    )
    usage_flush_interval_s: float = Field(
        DEFAULT_USAGE_FLUSH_INTERVAL_S,
        gt=0,
        le=60,
        description="how often a process adds its usage counts to the store",
    )
    usage_retention_days: int = Field(
        DEFAULT_USAGE_RETENTION_DAYS, ge=1, description="days of usage Redis keeps"
    )
    stats_db: Path | None = Field(
        None,
        description="SQLite file the gateway processes of one host share latency sketches through when "
        "there is no Redis (several workers); unset with no Redis: each process reports its own traffic",
    )
    max_client_labels: int = Field(DEFAULT_MAX_CLIENT_LABELS, ge=1)
    classifier_model: str = "image_classifier"
    embedding_model: str = "text_embedding"
    image_generation_model: str = "stable_diffusion"
    model_aliases: dict[str, str] = Field(
        default_factory=dict,
        description='public name -> Triton model, e.g. {"all-MiniLM-L6-v2": "text_embedding"}',
    )
    model_index_ttl_s: float = Field(
        DEFAULT_MODEL_INDEX_TTL_S, gt=0, description="how long Triton's model list is trusted"
    )
    model_index_min_refresh_s: float = Field(
        DEFAULT_MODEL_INDEX_MIN_REFRESH_S,
        ge=0,
        description="an unknown model name re-reads Triton's model list at most this often",
    )
    ready_models: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        description="Triton models /readyz requires: each READY and answering one synthetic inference "
        "(comma-separated in the environment); empty: Triton's server readiness only",
    )
    ready_cache_s: float = Field(
        DEFAULT_READY_CACHE_S, ge=0, description="how long a /readyz answer is reused"
    )
    breaker_failures: int = Field(
        DEFAULT_BREAKER_FAILURES,
        ge=1,
        description="internal errors in a row that open a model's circuit breaker (a dead worker opens it at once)",
    )
    heal_max_backoff_s: float = Field(
        DEFAULT_HEAL_MAX_BACKOFF_S,
        gt=0,
        description="longest wait between two reloads of a model being healed",
    )
    heal_load_timeout_s: float = Field(
        DEFAULT_HEAL_LOAD_TIMEOUT_S,
        gt=0,
        description="deadline of one model reload through Triton's repository API",
    )
    ready_timeout_s: float = Field(
        DEFAULT_READY_TIMEOUT_S,
        gt=0,
        description="deadline of each /readyz call to Triton (synthetic inference too)",
    )
    public_url: str = Field(
        "",
        description="the gateway's external base URL, for image URLs; empty: the request's own Host",
    )
    image_url_ttl_s: float = Field(
        DEFAULT_IMAGE_URL_TTL_S, gt=0, description="how long an image URL is served"
    )
    image_async_after_s: float = Field(
        DEFAULT_IMAGE_ASYNC_AFTER_S,
        gt=0,
        description="an image generation estimated to take longer is answered as a job (202 + its URL), not held "
        "until the deadline",
    )
    image_url_max_bytes: int = Field(
        DEFAULT_IMAGE_URL_MAX_BYTES,
        ge=1,
        description="bytes of generated images kept for URLs (oldest go first)",
    )
    log_level: str = "info"
    dev_insecure: bool = Field(
        False,
        description="development only: serve although a secret is empty or a placeholder (a warning is "
        "logged); see gateway/tenancy/secret_policy.py",
    )

    @model_validator(mode="after")
    def _stats_buckets(self) -> GatewaySettings:
        buckets = self.stats_window_s / self.stats_bucket_s
        if not 1 <= buckets <= 1440:
            raise ValueError(
                "stats_window_s / stats_bucket_s must be between 1 and 1440 (time buckets per window)"
            )
        return self

    @field_validator("triton_http_url", "triton_grpc_url")
    @classmethod
    def _no_scheme(cls, value: str) -> str:
        # tritonclient wants host:port; accept a pasted URL rather than failing later.
        for scheme in ("http://", "https://", "grpc://"):
            value = value.removeprefix(scheme)
        return value.rstrip("/")

    @field_validator("ready_models", mode="before")
    @classmethod
    def _ready_model_list(cls, value: object) -> object:
        # The environment gives "a,b" (what a ConfigMap shared with Triton's probe holds) or a JSON list.
        return tuple(parse_model_list(value)) if isinstance(value, str) else value

    @field_validator("ready_models")
    @classmethod
    def _ready_model_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            problem = model_name_problem(name)
            if problem:
                raise ValueError(problem)
        return tuple(dict.fromkeys(value))

    @field_validator("model_aliases")
    @classmethod
    def _alias_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in (*value, *value.values()):
            problem = model_name_problem(name)
            if problem:
                raise ValueError(problem)
        return value

    @field_validator("default_tier")
    @classmethod
    def _tier_name(cls, value: str) -> str:
        return value.strip()

    @property
    def shared(self) -> bool:
        """Whether state is shared through Redis (keys, canary weights, rate limits)."""
        return bool(self.redis_url.get_secret_value())

    def worker_count(self, cores: int | None = None) -> int:
        """How many gateway processes to run.

        ``workers`` when set. Automatic (0): one per usable core when Redis is configured, else one,
        because without Redis rate limits and canary weights live in each process: several processes
        would multiply every limit and could disagree on weights. One as well with a residency budget
        (its LRU lives in the process).

        Args:
            cores: usable cores (default: :func:`usable_cores`).

        Raises:
            ValueError: more than one worker asked for without Redis, or with a residency budget.
        """
        if self.workers > 1 and not self.shared:
            raise ValueError(
                f"workers={self.workers} needs GATEWAY_REDIS_URL: without Redis, rate limits and canary "
                "weights live in each process, so several workers would multiply every limit"
            )
        if self.workers > 1 and self.residency_budget_bytes:
            raise ValueError(
                f"workers={self.workers} with GATEWAY_RESIDENCY_BUDGET_BYTES: which models are loaded, and "
                "the loads in flight, live in one gateway process; several would each evict for themselves"
            )
        if self.workers:
            return self.workers
        if not self.shared or self.residency_budget_bytes:
            return 1
        return max(1, cores if cores is not None else usable_cores())

    def jobs_path(self) -> Path:
        """The SQLite jobs file: ``jobs_db``, else next to the key store."""
        return self.jobs_db or self.keys_db.parent / "gateway_jobs.sqlite3"

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
