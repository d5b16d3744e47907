"""Liveness, readiness (Triton and every model in ``GATEWAY_READY_MODELS`` READY and answering) and
Prometheus metrics (behind the metrics token)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.errors import UpstreamUnavailable
from gateway.observe.stats import LatencyTracker
from gateway.protocol.rest import Health, kserve_responses, problem_responses
from gateway.tasks.service import InferenceService

from ._deps import get_service, get_tracker

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="Liveness: the gateway process is up")
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Health,
    summary="Readiness: Triton is ready, and so is every model the gateway must serve",
    description=(
        "Ready when Triton is, and every model in `GATEWAY_READY_MODELS` is READY and answered one small "
        "synthetic inference (batch 1, zeros, a tiny PNG or a short text). The answer is reused for "
        "`GATEWAY_READY_CACHE_S` seconds. A 503 names each model that is not ready and why."
    ),
    responses=problem_responses(503),
)
async def readyz(service: Annotated[InferenceService, Depends(get_service)]) -> Health:
    state = await service.readiness.check()
    if not state.ready:
        raise UpstreamUnavailable(state.describe(), retry_after_s=service.settings.retry_after_s)
    return Health(
        status="ready", triton=service.settings.triton_http_url, models=list(state.checked)
    )


@router.get("/v2/health/live", summary="KServe v2 liveness", tags=["kserve-v2"], status_code=200)
async def v2_live() -> Response:
    return Response(status_code=200)


@router.get(
    "/v2/health/ready",
    summary="KServe v2 readiness (Triton's)",
    tags=["kserve-v2"],
    responses=kserve_responses(503),
)
async def v2_ready(service: Annotated[InferenceService, Depends(get_service)]) -> Response:
    if not await service.ready():
        raise UpstreamUnavailable(
            "Triton is not ready", retry_after_s=service.settings.retry_after_s
        )
    return Response(status_code=200)


@router.get(
    "/metrics",
    summary="Prometheus metrics (histograms of gateway latency per model and client)",
    description=(
        "Needs `Authorization: Bearer <GATEWAY_METRICS_TOKEN>` (or the admin token): the series name every "
        "model and client. Label values are bounded: models only once admitted (known to Triton), "
        "clients capped at `GATEWAY_MAX_CLIENT_LABELS` (the rest are `_other`)."
    ),
    response_class=Response,
    responses={
        200: {
            "content": {
                CONTENT_TYPE_LATEST: {"example": "gateway_request_duration_seconds_bucket{...} 42"}
            }
        },
        **problem_responses(401, 403),
    },
)
async def metrics(tracker: Annotated[LatencyTracker, Depends(get_tracker)]) -> Response:
    return Response(tracker.metrics_text(), media_type=CONTENT_TYPE_LATEST)
