"""Admin API for canary routing: per-model version weights, behind ``GATEWAY_ADMIN_TOKEN``.

With Redis configured, a change made here is stored there and reaches every replica and worker
within ``GATEWAY_STATE_SYNC_INTERVAL_S``; without it, it applies to this process only.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path
from pydantic import BaseModel, ConfigDict, Field

from gateway.backends.catalog import check_model_name
from gateway.errors import NotFound
from gateway.protocol.rest import problem_responses
from gateway.tasks.service import InferenceService
from gateway.tenancy.traffic import MAX_VERSIONS, MAX_WEIGHT, TrafficSplit

from ._deps import app_state, get_service

# The auth middleware demands the admin token on every /admin/ path.
router = APIRouter(prefix="/admin/traffic", tags=["admin"])
_ERRORS = problem_responses(400, 401, 403, 404, 409, 422, 503, 504)
Weight = Annotated[float, Field(ge=0, le=MAX_WEIGHT, allow_inf_nan=False)]
Model = Annotated[str, Path(description="a Triton model name", examples=["efficientnet_lite0"])]


class TrafficWeights(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"versions": {"1": 0.9, "2": 0.1}},
                {"versions": {"1": 0.9, "model:image_classifier__canary": 0.1}},
            ]
        },
    )

    versions: dict[str, Weight] = Field(
        min_length=1,
        max_length=MAX_VERSIONS,
        description=(
            "version -> relative weight (finite, 0 to 1e6, at least one positive); every version with a "
            "positive weight must be READY in Triton (409 otherwise). A key `model:<name>` sends that share "
            "to another model instead (a canary pipeline beside an ensemble; it answers under its own name)"
        ),
    )


class TrafficTable(BaseModel):
    models: dict[str, dict[str, float]] = Field(description="model -> version -> normalised share")


get_traffic = app_state("traffic")


Traffic = Annotated[TrafficSplit, Depends(get_traffic)]


@router.get("", response_model=TrafficTable, summary="Current version weights", responses=_ERRORS)
async def list_traffic(traffic: Traffic) -> TrafficTable:
    return TrafficTable(models=traffic.snapshot())


class Outcome(BaseModel):
    answered: int = Field(description="requests the target answered (client errors included)")
    failed: int = Field(
        description="requests that failed there: the target's error, a timeout, or not served"
    )


class TrafficOutcomes(BaseModel):
    model: str
    weights: dict[str, float] = Field(description="target -> normalised share (empty: unpinned)")
    outcomes: dict[str, Outcome] = Field(
        description="target -> requests routed there since the weights were set (every replica's, "
        "with Redis; each replica adds its counts within GATEWAY_STATE_SYNC_INTERVAL_S)"
    )


@router.get(
    "/{model}",
    response_model=TrafficOutcomes,
    summary="A model's weights and what they routed",
    responses=_ERRORS,
)
async def model_traffic(model: Model, traffic: Traffic) -> TrafficOutcomes:
    check_model_name(model)
    counts = await traffic.outcomes(model)
    return TrafficOutcomes(
        model=model,
        weights=traffic.snapshot().get(model, {}),
        outcomes={t: Outcome(**c) for t, c in counts.items()},
    )


@router.put(
    "/{model}",
    response_model=TrafficTable,
    summary="Pin a model's traffic to versions by weight",
    responses=_ERRORS,
)
async def set_traffic(
    model: Model,
    body: TrafficWeights,
    traffic: Traffic,
    service: Annotated[InferenceService, Depends(get_service)],
) -> TrafficTable:
    await service.pin_traffic(model, body.versions)
    return TrafficTable(models=traffic.snapshot())


@router.delete(
    "/{model}",
    status_code=204,
    summary="Unpin a model (Triton picks the version again)",
    responses=_ERRORS,
)
async def clear_traffic(model: Model, traffic: Traffic) -> None:
    if not await traffic.remove(check_model_name(model)):
        raise NotFound(f"no traffic weights are set for model '{model}'", field="model")
