"""What backs each piece of the gateway's state, chosen from the settings: Redis when
``GATEWAY_REDIS_URL`` is set (shared by every replica and worker), else SQLite files or this process.

:func:`gateway.app.create_app` calls these at startup; nothing is opened at import time.
"""

from __future__ import annotations

from gateway.backends.triton import InferenceBackend, TritonHttpBackend
from gateway.backends.triton_settings import TritonProtocol
from gateway.jobs.image_store import ImageStore, MemoryImageStore
from gateway.jobs.store import JobStore
from gateway.jobs.store_sqlite import SqliteJobStore
from gateway.observe.stats_store import RedisSketchStore, SketchStore, SqliteSketchStore
from gateway.settings import GatewaySettings
from gateway.tenancy.ratelimit import InProcessRateLimiter, RateLimiter, RedisRateLimiter
from gateway.tenancy.ratelimit_lease import LeasedRateLimiter
from gateway.tenancy.usage import UsageStore
from gateway.tenancy.usage_store import RedisUsageStore, SqliteUsageStore

__all__ = [
    "build_backend",
    "build_image_store",
    "build_job_store",
    "build_limiter",
    "build_sketch_store",
    "build_usage_store",
]


def build_limiter(settings: GatewaySettings) -> RateLimiter:
    url = settings.redis_url.get_secret_value()
    if not url:
        return InProcessRateLimiter()
    shared = RedisRateLimiter(
        url,
        failure_policy=settings.redis_failure_policy,
        timeout_s=settings.redis_timeout_s,
        retry_after_s=settings.redis_retry_after_s,
        prefix=settings.redis_prefix + "rl:",
    )
    if not settings.rate_limit_lease_share:
        return shared
    return LeasedRateLimiter(
        shared, share=settings.rate_limit_lease_share, lease_s=settings.rate_limit_lease_s
    )


def build_backend(settings: GatewaySettings) -> InferenceBackend:
    if settings.triton_protocol is TritonProtocol.GRPC:
        from gateway.backends.triton_grpc import TritonGrpcBackend

        return TritonGrpcBackend(settings.triton_grpc_url, settings.triton_grpc_channels)
    return TritonHttpBackend(settings.triton_http_url, settings.triton_pool_size)


def build_usage_store(settings: GatewaySettings) -> UsageStore:
    """Where usage counts add up: Redis if configured, else a SQLite file next to the key store."""
    url = settings.redis_url.get_secret_value()
    if url:
        return RedisUsageStore(
            url,
            prefix=settings.redis_prefix,
            timeout_s=settings.redis_timeout_s,
            retention_days=settings.usage_retention_days,
        )
    return SqliteUsageStore(settings.usage_path())


def build_job_store(settings: GatewaySettings) -> JobStore:
    """Where generation jobs live: Redis if configured (every replica), else a SQLite file next to
    the key store."""
    url = settings.redis_url.get_secret_value()
    if url:
        from gateway.jobs.store_redis import RedisJobStore

        return RedisJobStore(
            url,
            settings.job_result_ttl_s,
            prefix=settings.redis_prefix,
            timeout_s=settings.redis_timeout_s,
        )
    return SqliteJobStore(settings.jobs_path(), settings.job_result_ttl_s)


def build_image_store(settings: GatewaySettings) -> ImageStore:
    """Where images behind ``url`` answers wait: Redis if configured (every replica serves them),
    else memory."""
    url = settings.redis_url.get_secret_value()
    if url:
        from gateway.jobs.image_store import RedisImageStore

        return RedisImageStore(
            url,
            settings.image_url_ttl_s,
            settings.image_url_max_bytes,
            prefix=settings.redis_prefix,
            timeout_s=settings.redis_timeout_s,
        )
    return MemoryImageStore(settings.image_url_ttl_s, settings.image_url_max_bytes)


def build_sketch_store(settings: GatewaySettings) -> SketchStore | None:
    """Where processes share latency sketches: Redis if configured, else ``stats_db``, else nowhere."""
    url = settings.redis_url.get_secret_value()
    if url:
        return RedisSketchStore(
            url, prefix=settings.redis_prefix, timeout_s=settings.redis_timeout_s
        )
    if settings.stats_db is not None:
        return SqliteSketchStore(settings.stats_db)
    return None
