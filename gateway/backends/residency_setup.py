"""The residency manager the gateway settings ask for: its meter, its configuration, its Triton client."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from gateway.backends.residency import ResidencyManager
from gateway.backends.residency_memory import (
    GpuMetricsMeter,
    MemoryMeter,
    ProcessTreeMeter,
    find_triton_pid,
)
from gateway.backends.residency_policy import ResidencyConfig
from gateway.backends.residency_settings import ResidencySettings
from gateway.backends.residency_triton import TritonRepository

__all__ = ["build_residency"]


def build_residency(
    settings: ResidencySettings, triton_http_url: str, keys_db: Path, registry: CollectorRegistry
) -> ResidencyManager | None:
    """The manager the settings ask for (``None`` while ``residency_budget_bytes`` is 0).

    Raises:
        ValueError: the 'process' meter cannot find the tritonserver process (Triton on another
            host: use the 'gpu' meter).
    """
    if not settings.residency_budget_bytes:
        return None
    host, _, port = triton_http_url.rpartition(":")
    meter: MemoryMeter
    if settings.residency_memory == "gpu":
        meter = GpuMetricsMeter(settings.residency_metrics_url or f"http://{host}:8002/metrics")
    else:
        pid = settings.residency_triton_pid or find_triton_pid(int(port))
        if not pid:
            raise ValueError(
                "GATEWAY_RESIDENCY_MEMORY=process needs the tritonserver process serving port "
                f"{port} on this host; set GATEWAY_RESIDENCY_TRITON_PID, or use the 'gpu' meter"
            )
        meter = ProcessTreeMeter(pid)
    config = ResidencyConfig(
        budget_bytes=settings.residency_budget_bytes,
        pinned=settings.residency_pinned,
        pin_loaded_at_start=settings.residency_pin_loaded_at_start,
        repository=settings.residency_repository,
        default_estimate_bytes=settings.residency_default_estimate_bytes,
        footprints_path=settings.residency_footprints_path
        or keys_db.parent / "model_footprints.json",
        max_pending_loads=settings.residency_max_pending_loads,
        max_concurrent_loads=settings.residency_max_concurrent_loads,
        failure_backoff_s=settings.residency_failure_backoff_s,
    )
    repository = TritonRepository(triton_http_url, settings.residency_load_timeout_s)
    return ResidencyManager(config, repository, meter, registry)
