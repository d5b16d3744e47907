"""``/v1/stats``: P50/P95/P99 per model and per client over the window, with Triton's split."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from gateway.observe.stats import LatencyTracker
from gateway.protocol.rest import problem_responses
from gateway.routes.stats_report import stats_document
from gateway.tenancy.context import RequestContext

from ._deps import get_context, get_tracker

router = APIRouter(prefix="/v1", tags=["stats"])

_SUMMARY = {
    "count": 1200,
    "p50_ms": 9.1,
    "p95_ms": 14.2,
    "p99_ms": 19.8,
    "mean_ms": 9.9,
    "max_ms": 31.0,
}
_EXAMPLE = {
    "scope": "key:3f9a0c1b2d4e",
    "window_s": 60.0,
    "bucket_s": 5.0,
    "relative_error": 0.01,
    "complete": True,
    "models": {
        "efficientnet_lite0": {
            "gateway": _SUMMARY,
            "triton": {"queue_mean_ms": 1.2, "compute_mean_ms": 7.4, "request_mean_ms": 8.9},
        }
    },
    "clients": {"key:3f9a0c1b2d4e": _SUMMARY},
}


@router.get(
    "/stats",
    summary="Latency quantiles per model and client; Triton's mean queue and compute time per model",
    description=(
        "`gateway` quantiles cover requests the gateway admitted and answered successfully in the last "
        "`window_s` seconds (the window advances in steps of `bucket_s`, so up to `window_s + bucket_s`), "
        "measured from the first request byte to the last response byte, over every gateway worker and "
        "replica sharing the stats store (Redis when configured; other processes' figures are up to two "
        "`GATEWAY_STATS_PUBLISH_INTERVAL_S` old; `complete` is false when the store could not be "
        "read). P50/P95/P99 are the values at rank floor(q * (count - 1)) of the sorted latencies, "
        "reported within a relative error of `relative_error` (1%, a DDSketch); count, mean and "
        "max are exact.\n\n"
        "**Who sees what**: an API key or JWT sees only its own traffic (its figures per model it called, "
        "and Triton's mean queue/compute time for those models); the admin credential sees every model, "
        "every client (`clients`), every model x client pair (`model_clients`) and Triton's request counts; "
        "past `GATEWAY_STATS_MAX_SERIES` pairs in one time bucket, further clients are counted together as "
        "`_other`, which only the admin sees. "
        "`triton` comes from Triton's statistics extension (deltas of its cumulative counters over the "
        "window, as last polled by the answering process): queue = waiting for the dynamic batcher / an "
        "instance, compute = running the model."
    ),
    responses={
        200: {"content": {"application/json": {"example": _EXAMPLE}}},
        **problem_responses(401),
    },
)
async def stats(
    tracker: Annotated[LatencyTracker, Depends(get_tracker)],
    ctx: Annotated[RequestContext, Depends(get_context)],
) -> dict[str, Any]:
    if ctx.principal is None:  # behind the auth middleware: a wiring bug, not a client error
        raise RuntimeError("/v1/stats reached without a principal")
    return await stats_document(tracker, ctx.principal)
