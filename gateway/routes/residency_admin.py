"""Admin API for model residency: list, pin, unpin, preload and evict, behind ``GATEWAY_ADMIN_TOKEN``.

Answers 409 while residency is off (no ``GATEWAY_RESIDENCY_BUDGET_BYTES``): every model then stays
as Triton loaded it, and there is nothing to pin or evict.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request
from fastapi.types import DecoratedCallable
from pydantic import BaseModel, ConfigDict, Field

from gateway.backends.residency import ResidencyManager
from gateway.backends.residency_policy import ModelResidency
from gateway.errors import Conflict
from gateway.protocol.rest import problem_responses
from gateway.tasks.service import InferenceService

from ._deps import get_service

# The auth middleware demands the admin token on every /admin/ path.
router = APIRouter(prefix="/admin/models", tags=["admin"])
_ERRORS = problem_responses(400, 401, 403, 404, 409, 422, 429, 503, 504, 507)
Model = Annotated[str, Path(description="a Triton model name", examples=["efficientnet_lite0"])]


class Residency(BaseModel):
    # Built straight from the manager's ModelResidency records, which carry these same fields.
    model_config = ConfigDict(from_attributes=True)

    model: str
    state: str = Field(description="loaded, loading, unloading or available (loaded on demand)")
    footprint_bytes: int = Field(description="measured at its last load here, else the estimate")
    measured: bool = Field(description="whether footprint_bytes was measured (false: an estimate)")
    pinned: bool
    in_flight: int


class ResidencyTableOut(BaseModel):
    budget_bytes: int
    charged_bytes: int = Field(description="what resident models are charged against the budget")
    measured_bytes: int = Field(
        description="Triton's memory at the last load or eviction, as the meter read it"
    )
    baseline_bytes: int = Field(description="Triton's memory when the gateway started")
    models: list[Residency]


def _out(item: ModelResidency) -> Residency:
    return Residency.model_validate(item)


async def get_residency(request: Request) -> ResidencyManager:
    manager = request.app.state.residency
    if manager is None:
        raise Conflict(
            "model residency is off: set GATEWAY_RESIDENCY_BUDGET_BYTES to load models on demand"
        )
    return manager  # type: ignore[no-any-return]


Manager = Annotated[ResidencyManager, Depends(get_residency)]
Service = Annotated[InferenceService, Depends(get_service)]


async def _known(service: InferenceService, model: str) -> str:
    # Unknown names create no state (a residency entry is per-model memory): 400 or 404 first.
    return await service.catalog.resolve(model)


@router.get(
    "",
    response_model=ResidencyTableOut,
    summary="Every model's residency and the budget",
    responses=_ERRORS,
)
async def list_residency(manager: Manager) -> ResidencyTableOut:
    return ResidencyTableOut(
        budget_bytes=manager.table.budget_bytes,
        charged_bytes=manager.table.used_bytes(),
        measured_bytes=manager.measured_bytes,
        baseline_bytes=manager.baseline_bytes,
        models=[_out(m) for m in manager.models()],
    )


def _action(verb: str, summary: str) -> Callable[[DecoratedCallable], DecoratedCallable]:
    """The route of ``POST /admin/models/{model}/<verb>``: every action answers the model's
    residency after it, with the same errors."""
    return router.post(
        f"/{{model}}/{verb}", response_model=Residency, summary=summary, responses=_ERRORS
    )


@_action("pin", "Never evict this model")
async def pin(model: Model, manager: Manager, service: Service) -> Residency:
    return _out(manager.pin(await _known(service, model), True))


@_action("unpin", "Let this model be evicted again")
async def unpin(model: Model, manager: Manager, service: Service) -> Residency:
    return _out(manager.pin(await _known(service, model), False))


@_action("preload", "Load this model now (evicting LRU models)")
async def preload(model: Model, manager: Manager, service: Service) -> Residency:
    return _out(
        await manager.preload(
            await _known(service, model), service.settings.residency_load_timeout_s
        )
    )


@_action("evict", "Unload this model now (not while pinned or with requests in flight)")
async def evict(model: Model, manager: Manager, service: Service) -> Residency:
    return _out(await manager.evict(await _known(service, model)))
