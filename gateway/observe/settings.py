"""Settings of what the gateway measures (the latency stats window and its sharing, Triton's
statistics polling, Server-Timing, client labels), part of :class:`gateway.settings.GatewaySettings`.

Each field is the environment variable ``GATEWAY_<FIELD>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import Field, model_validator

from gateway.env_settings import EnvSettings, count, seconds

__all__ = [
    "DEFAULT_MAX_CLIENT_LABELS",
    "DEFAULT_STATS_BUCKET_S",
    "DEFAULT_STATS_MAX_SERIES",
    "DEFAULT_STATS_PUBLISH_INTERVAL_S",
    "DEFAULT_STATS_WINDOW_S",
    "DEFAULT_TRITON_STATS_INTERVAL_S",
    "ObserveSettings",
]

DEFAULT_TRITON_STATS_INTERVAL_S = 2.0
DEFAULT_STATS_WINDOW_S = 60.0
DEFAULT_STATS_BUCKET_S = 5.0
DEFAULT_STATS_MAX_SERIES = 1000
DEFAULT_STATS_PUBLISH_INTERVAL_S = 1.0
DEFAULT_MAX_CLIENT_LABELS = 100


class ObserveSettings(EnvSettings):
    """The ``stats_*`` fields, ``triton_stats_interval_s``, ``server_timing`` and ``max_client_labels``."""

    server_timing: bool = Field(
        True,
        description="send authenticated callers a Server-Timing header with the gateway's stages",
    )
    triton_stats_interval_s: float = seconds(
        DEFAULT_TRITON_STATS_INTERVAL_S, "0 switches polling off", zero=True
    )
    stats_window_s: float = seconds(DEFAULT_STATS_WINDOW_S, most=86_400)
    stats_bucket_s: float = seconds(
        DEFAULT_STATS_BUCKET_S, "time resolution of the stats window (one sketch per bucket)"
    )
    stats_max_series: int = count(
        DEFAULT_STATS_MAX_SERIES,
        "(model, client) pairs per time bucket before new clients are counted as _other",
    )
    stats_publish_interval_s: float = seconds(
        DEFAULT_STATS_PUBLISH_INTERVAL_S, "how often a process shares its latency sketches"
    )
    stats_db: Path | None = Field(
        None,
        description="SQLite file the gateway processes of one host share latency sketches through when "
        "there is no Redis (several workers); unset with no Redis: each process reports its own traffic",
    )
    max_client_labels: int = count(DEFAULT_MAX_CLIENT_LABELS)

    @model_validator(mode="after")
    def _stats_buckets(self) -> Self:
        buckets = self.stats_window_s / self.stats_bucket_s
        if not 1 <= buckets <= 1440:
            raise ValueError(
                "stats_window_s / stats_bucket_s must be between 1 and 1440 (time buckets per window)"
            )
        return self
