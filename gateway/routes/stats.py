"""``/v1/stats``: P50/P95/P99 per model and per client over the sliding window, with Triton's split."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from gateway.protocol import problem_responses
from gateway.stats import LatencyTracker

from ._deps import get_tracker

router = APIRouter(prefix="/v1", tags=["stats"])

_EXAMPLE = {
    "window_s": 60.0,
    "models": {
        "efficientnet_lite0": {
            "gateway": {
                "count": 1200,
                "p50_ms": 9.1,
                "p95_ms": 14.2,
                "p99_ms": 19.8,
                "mean_ms": 9.9,
                "max_ms": 31.0,
            },
            "triton": {
                "requests": 1200,
                "queue_mean_ms": 1.2,
                "compute_mean_ms": 7.4,
                "request_mean_ms": 8.9,
            },
        }
    },
    "clients": {
        "key:3f9a0c1b2d4e": {
            "count": 1200,
            "p50_ms": 9.1,
            "p95_ms": 14.2,
            "p99_ms": 19.8,
            "mean_ms": 9.9,
            "max_ms": 31.0,
        }
    },
}


@router.get(
    "/stats",
    summary="Latency quantiles per model and client; Triton's mean queue and compute time per model",
    description=(
        "`gateway` quantiles cover requests the gateway admitted and answered successfully in the last "
        "`window_s` seconds, measured from the first request byte to the last response byte. `triton` "
        "comes from Triton's statistics extension (deltas of its cumulative counters over the same window): "
        "queue = waiting for the dynamic batcher / an instance, compute = running the model."
    ),
    responses={200: {"content": {"application/json": {"example": _EXAMPLE}}}, **problem_responses(401)},
)
async def stats(tracker: Annotated[LatencyTracker, Depends(get_tracker)]) -> dict[str, Any]:
    return tracker.snapshot()
