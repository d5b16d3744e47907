"""Settings of model residency (load on demand, evict under a memory budget), part of
:class:`gateway.settings.GatewaySettings`; see :mod:`gateway.backends.residency` for what they govern.

Each field is the environment variable ``GATEWAY_<FIELD>``. Residency is off while
``residency_budget_bytes`` is 0: every model stays as Triton loaded it, as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field
from pydantic_settings import NoDecode

from gateway.backends.catalog import ModelNameList
from gateway.env_settings import EnvSettings, count, seconds

__all__ = [
    "DEFAULT_RESIDENCY_ESTIMATE_BYTES",
    "DEFAULT_RESIDENCY_MAX_PENDING_LOADS",
    "ResidencySettings",
]

DEFAULT_RESIDENCY_ESTIMATE_BYTES = 512 * 1024 * 1024
DEFAULT_RESIDENCY_MAX_PENDING_LOADS = 16
DEFAULT_RESIDENCY_LOAD_TIMEOUT_S = 300.0
DEFAULT_RESIDENCY_FAILURE_BACKOFF_S = 5.0


class ResidencySettings(EnvSettings):
    """The ``residency_*`` fields."""

    residency_budget_bytes: int = count(
        0,
        "memory the models of one Triton instance may take together; 0: residency off "
        "(every model stays as Triton loaded it)",
        least=0,
    )
    residency_memory: Literal["process", "gpu"] = Field(
        "process",
        description="what the budget measures: 'process' (RSS of the tritonserver process tree, "
        "CPU, same host) or 'gpu' (Triton's nv_gpu_memory_used_bytes)",
    )
    residency_triton_pid: int = count(
        0,
        "pid of tritonserver for the 'process' meter; 0: the tritonserver process whose "
        "command line names triton_http_url's port",
        least=0,
    )
    residency_metrics_url: str = Field(
        "",
        description="Triton's metrics URL for the 'gpu' meter (default: http://<triton host>:8002/metrics)",
    )
    residency_pinned: Annotated[ModelNameList, NoDecode] = Field(
        (), description="models never evicted (comma-separated in the environment)"
    )
    residency_pin_loaded_at_start: bool = Field(
        True,
        description="pin the models Triton had loaded when the gateway started (the default set)",
    )
    residency_repository: Path | None = Field(
        None,
        description="the model repository, read for estimates (size on disk x 1.25) of unmeasured models",
    )
    residency_default_estimate_bytes: int = count(
        DEFAULT_RESIDENCY_ESTIMATE_BYTES,
        "the charge of an unmeasured model whose files cannot be read",
    )
    residency_footprints_path: Path | None = Field(
        None,
        description="JSON file measured footprints are kept in (default: model_footprints.json next to "
        "the key store)",
    )
    residency_max_pending_loads: int = count(
        DEFAULT_RESIDENCY_MAX_PENDING_LOADS,
        "model loads queued at most; more cold requests get 429",
    )
    residency_max_concurrent_loads: int = count(
        1,
        "Triton loads in progress at once; on a GPU each Python-backend load spends "
        "seconds starting its stub (importing torch), which overlap well across cores",
        most=64,
    )
    residency_load_timeout_s: float = seconds(
        DEFAULT_RESIDENCY_LOAD_TIMEOUT_S, "the deadline of one load or unload"
    )
    residency_failure_backoff_s: float = seconds(
        DEFAULT_RESIDENCY_FAILURE_BACKOFF_S,
        "wait after a failed load before the model is tried again (doubles per failure, at most 300 s)",
    )
