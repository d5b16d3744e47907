"""Liveness, readiness (ready only when Triton is) and Prometheus metrics."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.errors import UpstreamUnavailable
from gateway.protocol import Health, problem_responses
from gateway.service import InferenceService
from gateway.stats import LatencyTracker

from ._deps import get_service, get_tracker

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="Liveness: the gateway process is up")
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Health,
    summary="Readiness: Triton is reachable and ready",
    responses=problem_responses(503),
)
async def readyz(service: Annotated[InferenceService, Depends(get_service)]) -> Health:
    if not await service.ready():
        raise UpstreamUnavailable("Triton is not ready", retry_after_s=service.settings.retry_after_s)
    return Health(status="ready", triton=service.settings.triton_http_url)


@router.get("/v2/health/live", summary="KServe v2 liveness", tags=["kserve-v2"], status_code=200)
async def v2_live() -> Response:
    return Response(status_code=200)


@router.get(
    "/v2/health/ready",
    summary="KServe v2 readiness (Triton's)",
    tags=["kserve-v2"],
    responses=problem_responses(503),
)
async def v2_ready(service: Annotated[InferenceService, Depends(get_service)]) -> Response:
    if not await service.ready():
        raise UpstreamUnavailable("Triton is not ready", retry_after_s=service.settings.retry_after_s)
    return Response(status_code=200)


@router.get(
    "/metrics",
    summary="Prometheus metrics (histograms of gateway latency per model and client)",
    response_class=Response,
    responses={
        200: {
            "content": {CONTENT_TYPE_LATEST: {"example": "gateway_request_duration_seconds_bucket{...} 42"}}
        }
    },
)
async def metrics(tracker: Annotated[LatencyTracker, Depends(get_tracker)]) -> Response:
    return Response(generate_latest(tracker.registry), media_type=CONTENT_TYPE_LATEST)
