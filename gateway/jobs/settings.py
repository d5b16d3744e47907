"""Settings of generation jobs and their callbacks, part of :class:`gateway.settings.GatewaySettings`.

A mixin of its own because the job and callback knobs are many and belong together; each field is
still the environment variable ``GATEWAY_<FIELD>``, and ``GatewaySettings`` is the one object code
reads them from.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator

from gateway.env_settings import EnvSettings, count, seconds
from gateway.jobs.callback_policy import AllowedOrigin

__all__ = ["JobSettings"]

DEFAULT_JOB_WORKERS = 1
DEFAULT_JOB_TIMEOUT_S = 600.0
DEFAULT_JOB_RESULT_TTL_S = 3600.0
DEFAULT_JOB_LEASE_S = 15.0
DEFAULT_JOB_HEARTBEAT_S = 1.0
DEFAULT_JOB_POLL_INTERVAL_S = 0.5
DEFAULT_JOB_MAX_ATTEMPTS = 3
DEFAULT_CALLBACK_TIMEOUT_S = 5.0
DEFAULT_CALLBACK_MAX_ATTEMPTS = 5
DEFAULT_CALLBACK_BACKOFF_S = 2.0


class JobSettings(EnvSettings):
    """The ``job_*`` and ``callback_*`` fields (and ``jobs_db``); see :mod:`gateway.jobs.runner` and
    :mod:`gateway.jobs.callback_policy` and :mod:`gateway.jobs.callback_sender` for what they govern."""

    jobs_db: Path | None = Field(
        None,
        description="SQLite file of generation jobs when there is no Redis (default: "
        "gateway_jobs.sqlite3 next to keys_db)",
    )
    job_workers: int = count(
        DEFAULT_JOB_WORKERS,
        "generation jobs each gateway process runs at once; 0: this process accepts and serves jobs "
        "but runs none (other replicas do)",
        least=0,
        most=64,
    )
    job_timeout_s: float = seconds(
        DEFAULT_JOB_TIMEOUT_S,
        "a job's deadline once it runs (Triton gets what is left of it); a job that cannot start "
        "(Triton unavailable, the model busy) fails this long after it was submitted",
        most=86_400,
    )
    job_result_ttl_s: float = seconds(
        DEFAULT_JOB_RESULT_TTL_S,
        "how long a finished job and its images are kept",
        most=30 * 86_400,
    )
    job_lease_s: float = seconds(
        DEFAULT_JOB_LEASE_S,
        "a running job is taken over by another worker this long after its worker stopped renewing",
        most=3600,
    )
    job_heartbeat_s: float = seconds(
        DEFAULT_JOB_HEARTBEAT_S,
        "how often a worker renews its lease and checks whether its job was cancelled elsewhere",
        most=60,
    )
    job_poll_interval_s: float = seconds(
        DEFAULT_JOB_POLL_INTERVAL_S, "how often an idle worker looks for queued jobs", most=60
    )
    job_max_attempts: int = count(
        DEFAULT_JOB_MAX_ATTEMPTS, "times a job is started before a lost worker fails it", most=100
    )
    callback_allow: tuple[str, ...] = Field(
        (),
        description='origins job callbacks may go to, as JSON: ["https://hooks.example.com", '
        '"https://*.example.org:8443"]; empty: callbacks are off',
    )
    callback_private_networks: tuple[str, ...] = Field(
        (),
        description="CIDRs allow-listed hosts may resolve to although not public, e.g. "
        '["10.20.0.0/16"]; an allow-list entry that is an IP literal is allowed as it is',
    )
    callback_secret: SecretStr = Field(
        SecretStr(""),
        description="the HMAC-SHA256 key callbacks are signed with (required with callback_allow)",
    )
    callback_timeout_s: float = seconds(
        DEFAULT_CALLBACK_TIMEOUT_S, "one delivery attempt, resolving included", most=60
    )
    callback_max_attempts: int = count(DEFAULT_CALLBACK_MAX_ATTEMPTS, most=20)
    callback_backoff_s: float = seconds(
        DEFAULT_CALLBACK_BACKOFF_S, "wait before the second attempt; doubles after each", most=300
    )

    @field_validator("callback_allow")
    @classmethod
    def _callback_origins(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for entry in value:
            AllowedOrigin.parse(entry)  # raises ValueError naming the entry
        return value

    @field_validator("callback_private_networks")
    @classmethod
    def _callback_networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for cidr in value:
            ipaddress.ip_network(cidr, strict=False)
        return value

    @model_validator(mode="after")
    def _callback_secret_set(self) -> JobSettings:
        if self.callback_allow and len(self.callback_secret.get_secret_value()) < 16:
            raise ValueError(
                "callback_allow needs callback_secret (at least 16 characters) to sign callbacks"
            )
        return self
