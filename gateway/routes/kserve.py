"""KServe v2 inference protocol, passed through to Triton (JSON and the binary tensor extension)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request, Response

from gateway.context import CONTEXT_KEY, RequestContext
from gateway.errors import ModelNotReady
from gateway.protocol import INFERENCE_ERRORS, problem_responses
from gateway.service import InferenceService

from ._deps import get_context, get_service

router = APIRouter(prefix="/v2/models", tags=["kserve-v2"])

ModelName = Annotated[str, Path(description="a Triton model name", examples=["efficientnet_lite0"])]

_INFER_EXAMPLE = {
    "inputs": [{"name": "input", "shape": [1, 3, 224, 224], "datatype": "FP32", "data": [0.0]}],
    "outputs": [{"name": "logits"}],
}


@router.post(
    "/{name}/infer",
    summary="Run inference (KServe v2), forwarded to Triton unchanged",
    response_class=Response,
    responses={
        200: {
            "description": "Triton's response, unchanged",
            "content": {
                "application/json": {
                    "example": {
                        "model_name": "efficientnet_lite0",
                        "outputs": [
                            {"name": "logits", "datatype": "FP32", "shape": [1, 1000], "data": [0.1]}
                        ],
                    }
                }
            },
        },
        **INFERENCE_ERRORS,
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"type": "object"}, "example": _INFER_EXAMPLE},
                "application/octet-stream": {
                    "schema": {"type": "string", "format": "binary"},
                    "description": "binary tensor extension: JSON header of Inference-Header-Content-Length bytes, then tensors",
                },
            },
        }
    },
)
async def infer(name: ModelName, request: Request) -> Response:
    # The hot path: only ``request`` is injected and the state read directly, because each FastAPI
    # dependency costs time per call and this route carries the inference traffic.
    service: InferenceService = request.app.state.service
    ctx: RequestContext = request.scope[CONTEXT_KEY]
    body = await request.body()
    raw = await service.infer_raw(ctx, name, body, dict(request.headers))
    return Response(content=raw.body, headers=raw.headers)


@router.get(
    "/{name}", summary="Model metadata (KServe v2)", responses=problem_responses(401, 403, 404, 503, 504)
)
async def metadata(
    name: ModelName,
    service: Annotated[InferenceService, Depends(get_service)],
    ctx: Annotated[RequestContext, Depends(get_context)],
) -> dict[str, Any]:
    return await service.model_metadata(ctx, name)


@router.get(
    "/{name}/ready", summary="Model readiness (KServe v2)", responses=problem_responses(401, 403, 503)
)
async def ready(
    name: ModelName,
    service: Annotated[InferenceService, Depends(get_service)],
    ctx: Annotated[RequestContext, Depends(get_context)],
) -> Response:
    if not await service.model_ready(ctx, name):
        raise ModelNotReady(f"model '{name}' is not ready", retry_after_s=service.settings.retry_after_s)
    return Response(status_code=200)
