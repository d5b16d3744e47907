"""Gateway configuration: one typed object, read from ``GATEWAY_*`` environment variables.

Every field has a ``DEFAULT_*`` constant so the CLI, the tests and the README quote the same
values. Each room's fields (and their constants) live in that room, as a mixin this object composes:
:mod:`gateway.http.connection_settings`, :mod:`gateway.tenancy.settings`,
:mod:`gateway.backends.triton_settings`, :mod:`gateway.backends.residency_settings`,
:mod:`gateway.jobs.settings`, :mod:`gateway.observe.settings`; here are the process's own (where it
listens, how many workers, the shared Redis, image URLs). Nothing here is read at import time:
:class:`GatewaySettings` reads the environment when it is instantiated (by the CLI, ``serve`` or a
test).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from pydantic import Field, SecretStr

from gateway.backends.residency_settings import ResidencySettings
from gateway.backends.triton_settings import TritonSettings
from gateway.env_settings import count, seconds
from gateway.http.connection_settings import ConnectionSettings
from gateway.jobs.settings import JobSettings
from gateway.observe.settings import ObserveSettings
from gateway.tenancy.settings import TenancySettings

__all__ = [
    "DEFAULT_GRPC_PORT",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "DEFAULT_WORKERS",
    "GatewaySettings",
    "usable_cores",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_GRPC_PORT = 0  # 0: no gRPC entry (``inferctl up`` opens one on 8081)
DEFAULT_GRPC_MAX_CONCURRENT_RPCS = 1024
DEFAULT_REDIS_PREFIX = "gw:"
DEFAULT_STATE_SYNC_INTERVAL_S = 0.2
DEFAULT_WORKERS = 0  # 0: automatic, see GatewaySettings.worker_count
DEFAULT_IMAGE_URL_TTL_S = 600.0
# Half the default deadline: a generation estimated past it becomes a job rather than risk a 504.
DEFAULT_IMAGE_ASYNC_AFTER_S = 15.0
DEFAULT_IMAGE_URL_MAX_BYTES = 256 * 1024 * 1024


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


class GatewaySettings(
    JobSettings,
    ResidencySettings,
    ConnectionSettings,
    TritonSettings,
    TenancySettings,
    ObserveSettings,
):
    """Everything the gateway can be told, each field also an env var ``GATEWAY_<FIELD>``.

    Complex fields (``tier_limits``, ``model_aliases``) take JSON in the environment, e.g.
    ``GATEWAY_TIER_LIMITS='{"free": {"per_minute": 10, "burst": 5}}'``.
    """

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    grpc_port: int = count(
        DEFAULT_GRPC_PORT,
        "port of the KServe v2 gRPC entry (same host); 0: none",
        least=0,
        most=65535,
    )
    grpc_max_concurrent_rpcs: int = count(
        DEFAULT_GRPC_MAX_CONCURRENT_RPCS, "gRPC calls served at once; more are refused"
    )
    redis_url: SecretStr = Field(
        SecretStr(""),
        description="shared store for API keys, canary weights and rate limits; empty: SQLite + this process",
    )
    redis_prefix: str = Field(
        DEFAULT_REDIS_PREFIX, min_length=1, description="namespace of every Redis key"
    )
    state_sync_interval_s: float = seconds(
        DEFAULT_STATE_SYNC_INTERVAL_S,
        "how often each process checks Redis for changed keys / canary weights",
        most=1.0,
    )
    workers: int = count(DEFAULT_WORKERS, "gateway processes; 0: automatic", least=0, most=256)
    public_url: str = Field(
        "",
        description="the gateway's external base URL, for image URLs; empty: the request's own Host",
    )
    image_url_ttl_s: float = seconds(DEFAULT_IMAGE_URL_TTL_S, "how long an image URL is served")
    image_async_after_s: float = seconds(
        DEFAULT_IMAGE_ASYNC_AFTER_S,
        "an image generation estimated to take longer is answered as a job (202 + its URL), not held "
        "until the deadline",
    )
    image_url_max_bytes: int = count(
        DEFAULT_IMAGE_URL_MAX_BYTES, "bytes of generated images kept for URLs (oldest go first)"
    )
    log_level: str = "info"
    gc_freeze: bool = Field(
        True,
        description="exempt what is alive once a worker's app is built from the garbage collector "
        "(gc.freeze): full collections then walk only what serving created (gateway.observe.gc_pauses)",
    )

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
