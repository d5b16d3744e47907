"""Admin API for canary routing: per-model version weights, behind ``GATEWAY_ADMIN_TOKEN``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, ConfigDict, Field

from gateway.errors import NotFound
from gateway.protocol import problem_responses
from gateway.traffic import TrafficSplit

# The auth middleware demands the admin token on every /admin/ path.
router = APIRouter(prefix="/admin/traffic", tags=["admin"])
_ERRORS = problem_responses(400, 401, 403, 404, 422)
Model = Annotated[str, Path(description="a Triton model name", examples=["efficientnet_lite0"])]


class TrafficWeights(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"versions": {"1": 0.9, "2": 0.1}}]})

    versions: dict[str, float] = Field(min_length=1, description="version -> share of traffic")


class TrafficTable(BaseModel):
    models: dict[str, dict[str, float]] = Field(description="model -> version -> normalised share")


async def get_traffic(request: Request) -> TrafficSplit:
    return request.app.state.traffic  # type: ignore[no-any-return]


Traffic = Annotated[TrafficSplit, Depends(get_traffic)]


@router.get("", response_model=TrafficTable, summary="Current version weights", responses=_ERRORS)
async def list_traffic(traffic: Traffic) -> TrafficTable:
    return TrafficTable(models=traffic.snapshot())


@router.put("/{model}", response_model=TrafficTable, summary="Pin a model's traffic to versions by weight",
            responses=_ERRORS)
async def set_traffic(model: Model, body: TrafficWeights, traffic: Traffic) -> TrafficTable:
    traffic.set(model, body.versions)
    return TrafficTable(models=traffic.snapshot())


@router.delete("/{model}", status_code=204, summary="Unpin a model (Triton picks the version again)",
               responses=_ERRORS)
async def clear_traffic(model: Model, traffic: Traffic) -> None:
    if not traffic.clear(model):
        raise NotFound(f"no traffic weights are set for model '{model}'", field="model")
