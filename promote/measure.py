"""Fixed closed-loop load against one Triton model version: latency percentiles and throughput.

The load comes from the platform's one load generator (:mod:`loadtest.loadgen`); percentiles follow
the platform's one definition (:mod:`serving.quantiles`), so the gate compares the same P99 that
``/v1/stats`` and the benchmarks report.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from loadtest.loadgen import LoadResult, LoadSpec, TritonTarget
from loadtest.loadgen import run_load as run_spec

__all__ = ["LoadResult", "LoadShape", "run_load"]


@dataclass(frozen=True)
class LoadShape:
    """How hard and how long: ``concurrency`` requests in flight for ``warmup_s`` (not measured),
    then ``duration_s``."""

    concurrency: int = 8
    duration_s: float = 5.0
    warmup_s: float = 0.0


def run_load(
    url: str,
    model: str,
    inputs: Mapping[str, np.ndarray],
    *,
    version: str = "",
    shape: LoadShape = LoadShape(),
) -> LoadResult:
    """Keep ``shape.concurrency`` requests of ``inputs`` (one request, batch axis first) in flight
    for ``shape.warmup_s`` (not measured), then ``shape.duration_s``."""
    request = {name: np.ascontiguousarray(array) for name, array in inputs.items()}
    target = TritonTarget(
        url=url,
        model=model,
        model_version=version,
        inputs=(request,),
        name=f"{model} version {version or 'latest'}",
    )
    return run_spec(
        LoadSpec(
            target=target,
            concurrency=shape.concurrency,
            duration_s=shape.duration_s,
            warmup_s=shape.warmup_s,
        )
    )
