"""KServe v2 over REST: server metadata, model metadata/config/readiness and inference, each with and
without ``/versions/{version}``; inference bodies are checked, then sent to Triton re-encoded.

Triton's repository index and statistics extension pass through for the admin credential only (an
API key gets 403), so ``tritonclient``'s ``get_model_repository_index`` and
``get_inference_statistics`` work through the gateway for operators.

Health (``/v2/health/live``, ``/v2/health/ready``) is public and lives with the other probes in
:mod:`gateway.routes.health`. Errors on every ``/v2`` path are KServe's ``{"error": "..."}``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request, Response

from gateway.errors import BadRequest, ModelNotReady
from gateway.protocol.kserve import HEADER_LENGTH, RestBody
from gateway.protocol.rest import KSERVE_ERRORS, kserve_responses
from gateway.tasks.service import InferenceService
from gateway.tenancy.context import CONTEXT_KEY, RequestContext

from ._deps import ADMIN_AUTH, get_context, get_service
from .kserve_lane import response_encoding

router = APIRouter(prefix="/v2", tags=["kserve-v2"])

ModelName = Annotated[str, Path(description="a Triton model name", examples=["efficientnet_lite0"])]
Version = Annotated[
    str,
    Path(
        description="a model version (a positive integer)",
        pattern=r"^[1-9][0-9]{0,18}$",
        examples=["1"],
    ),
]

_INFER_EXAMPLE = {
    "inputs": [
        {"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0.5, 0.25, 0.0, 1.0]}
    ],
    "outputs": [{"name": "output"}],
}
_INFER_DESCRIPTION = """\
The body is checked before anything reaches Triton, and Triton receives the checked request
re-encoded (canonical JSON header, every input in binary), never the bytes sent here:

- JSON is strict: valid UTF-8, no repeated keys, no lone surrogate escapes, no `NaN`/`Infinity`,
  at most 24 levels of nesting;
- each input's `data` holds exactly the elements its `shape` declares, of its `datatype`'s kind
  and range; with the binary tensor extension, `Inference-Header-Content-Length` and every
  `binary_data_size` match the bytes that follow;
- shared memory, sequence parameters and a client-chosen `priority` are refused;
- `Content-Encoding: gzip` or `deflate` bodies are decompressed here under the same size limit
  (413 past it); other encodings get 415.

Each refusal is a 400 naming the field (e.g. `inputs.0.data`): KServe's `{"error": "..."}`, or a
problem document with `field` for a request that sends `Accept: application/problem+json`.

Without a version, the gateway's traffic split (canary weights) or Triton's version policy picks one;
`/versions/{version}` runs exactly that version.
"""


_INFER_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Triton's response",
        "content": {
            "application/json": {
                "example": {
                    "model_name": "tiny_linear",
                    "model_version": "1",
                    "outputs": [
                        {"name": "output", "datatype": "FP32", "shape": [1, 2], "data": [1.1, 0.6]}
                    ],
                }
            }
        },
    },
    **KSERVE_ERRORS,
}
_INFER_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"type": "object"}, "example": _INFER_EXAMPLE},
            "application/octet-stream": {
                "schema": {"type": "string", "format": "binary"},
                "description": "binary tensor extension: JSON header of "
                "Inference-Header-Content-Length bytes, then tensors",
            },
        },
    }
}
_INFO_ERRORS = kserve_responses(401, 403, 404, 503, 504)


@router.get(
    "",
    summary="Server metadata (KServe v2): name, version, the extensions served here",
    responses=kserve_responses(401, 503, 504),
)
async def server_metadata(
    service: Annotated[InferenceService, Depends(get_service)],
    ctx: Annotated[RequestContext, Depends(get_context)],
) -> dict[str, Any]:
    return await service.server_metadata(ctx)


async def _infer(request: Request, name: str, version: str) -> Response:
    # Only ``request`` is injected and the state read directly: each FastAPI dependency costs time
    # per call. The unversioned path's traffic does not come here (kserve_lane.InferLane).
    service: InferenceService = request.app.state.service
    ctx: RequestContext = request.scope[CONTEXT_KEY]
    body = RestBody(await request.body(), request.headers.get(HEADER_LENGTH))
    raw = await service.infer_v2(
        ctx,
        name,
        body,
        version=version,
        accept_encoding=response_encoding(request.headers.get("accept-encoding", "")),
    )
    return Response(content=raw.body, headers=raw.headers)


@router.post(
    "/models/{name}/infer",
    summary="Run inference (KServe v2): the body is checked strictly, then sent to Triton re-encoded",
    description=_INFER_DESCRIPTION,
    response_class=Response,
    responses=_INFER_RESPONSES,
    openapi_extra=_INFER_BODY,
)
async def infer(name: ModelName, request: Request) -> Response:
    return await _infer(request, name, "")


@router.post(
    "/models/{name}/versions/{version}/infer",
    summary="Run inference on one version of a model (KServe v2)",
    description=_INFER_DESCRIPTION,
    response_class=Response,
    responses=_INFER_RESPONSES,
    openapi_extra=_INFER_BODY,
)
async def infer_version(name: ModelName, version: Version, request: Request) -> Response:
    return await _infer(request, name, version)


Service = Annotated[InferenceService, Depends(get_service)]
Context = Annotated[RequestContext, Depends(get_context)]


# -- operator reads (the admin credential): Triton's repository index and statistics extension ----------
# Declared before ``/models/{name}``, which would otherwise take ``/models/stats`` for a model's metadata.

_ADMIN_READ_ERRORS = kserve_responses(400, 401, 403, 404, 503, 504)
_ADMIN_READ = (
    "Needs the admin credential (`Authorization: Bearer <GATEWAY_ADMIN_TOKEN>`); an API key gets "
    "403."
)


@router.post(
    "/repository/index",
    summary="Triton's model repository index (admin credential)",
    description=_ADMIN_READ
    + ' The body may be empty or `{"ready": true}` (READY models only), as on Triton.',
    responses=_ADMIN_READ_ERRORS,
    openapi_extra=ADMIN_AUTH,
)
async def repository_index(
    request: Request, service: Service, ctx: Context
) -> list[dict[str, Any]]:
    raw = await request.body()
    try:
        document = json.loads(raw) if raw.strip() else {}
    except ValueError as exc:
        raise BadRequest(
            'the body must be empty or a JSON object such as {"ready": true}', field="body"
        ) from exc
    if (
        not isinstance(document, dict)
        or set(document) - {"ready"}
        or not isinstance(document.get("ready", False), bool)
    ):
        raise BadRequest('the body may only hold "ready": true or false', field="ready")
    return await service.repository_index(ctx, ready_only=document.get("ready", False))


@router.get(
    "/models/stats",
    summary="Triton's inference statistics of every model (admin credential)",
    description=_ADMIN_READ,
    responses=_ADMIN_READ_ERRORS,
    openapi_extra=ADMIN_AUTH,
)
async def all_statistics(service: Service, ctx: Context) -> dict[str, Any]:
    return {"model_stats": await service.statistics(ctx)}


@router.get(
    "/models/{name}/stats",
    summary="Triton's inference statistics of one model (admin credential)",
    description=_ADMIN_READ,
    responses=_ADMIN_READ_ERRORS,
    openapi_extra=ADMIN_AUTH,
)
async def statistics(name: ModelName, service: Service, ctx: Context) -> dict[str, Any]:
    return {"model_stats": await service.statistics(ctx, name)}


@router.get(
    "/models/{name}/versions/{version}/stats",
    summary="Triton's inference statistics of one model version (admin credential)",
    description=_ADMIN_READ,
    responses=_ADMIN_READ_ERRORS,
    openapi_extra=ADMIN_AUTH,
)
async def version_statistics(
    name: ModelName, version: Version, service: Service, ctx: Context
) -> dict[str, Any]:
    return {"model_stats": await service.statistics(ctx, name, version)}


@router.get("/models/{name}", summary="Model metadata (KServe v2)", responses=_INFO_ERRORS)
async def metadata(name: ModelName, service: Service, ctx: Context) -> dict[str, Any]:
    return await service.model_metadata(ctx, name)


@router.get(
    "/models/{name}/versions/{version}",
    summary="Metadata of one model version (KServe v2)",
    responses=_INFO_ERRORS,
)
async def version_metadata(
    name: ModelName, version: Version, service: Service, ctx: Context
) -> dict[str, Any]:
    return await service.model_metadata(ctx, name, version)


@router.get(
    "/models/{name}/config",
    summary="Model configuration (Triton's model configuration extension)",
    responses=_INFO_ERRORS,
)
async def config(name: ModelName, service: Service, ctx: Context) -> dict[str, Any]:
    return await service.model_config(ctx, name)


@router.get(
    "/models/{name}/versions/{version}/config",
    summary="Configuration of one model version",
    responses=_INFO_ERRORS,
)
async def version_config(
    name: ModelName, version: Version, service: Service, ctx: Context
) -> dict[str, Any]:
    return await service.model_config(ctx, name, version)


async def _ready(
    service: InferenceService, ctx: RequestContext, name: str, version: str
) -> Response:
    if not await service.model_ready(ctx, name, version):
        shown = f"version {version} of model '{name}'" if version else f"model '{name}'"
        raise ModelNotReady(f"{shown} is not ready", retry_after_s=service.settings.retry_after_s)
    return Response(status_code=200)


@router.get(
    "/models/{name}/ready",
    summary="Model readiness (KServe v2)",
    responses=kserve_responses(401, 403, 404, 503),
)
async def ready(name: ModelName, service: Service, ctx: Context) -> Response:
    return await _ready(service, ctx, name, "")


@router.get(
    "/models/{name}/versions/{version}/ready",
    summary="Readiness of one model version (KServe v2)",
    responses=kserve_responses(401, 403, 404, 503),
)
async def version_ready(
    name: ModelName, version: Version, service: Service, ctx: Context
) -> Response:
    return await _ready(service, ctx, name, version)
