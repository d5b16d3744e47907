"""OpenAI-compatible routes: ``/v1/models``, ``/v1/models/{id}``, ``/v1/embeddings``,
``/v1/images/generations`` (a long one answered as a job: 202) and the signed, expiring image files
its ``url`` answers point to (no API key needed: :mod:`gateway.jobs.image_urls`).

Errors on these paths are OpenAI's ``{"error": {"message", "type", "param", "code"}}`` (the SDKs
show ``message``). The work is :class:`gateway.tasks.openai.OpenAITasks`; this module only
translates HTTP.
"""

from __future__ import annotations

import base64
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request, Response
from fastapi.responses import JSONResponse

from gateway.errors import NotFound, ServiceUnavailable
from gateway.jobs.image_store import ImageStore
from gateway.jobs.protocol import ImageJob
from gateway.jobs.service import ImageJobs
from gateway.protocol.rest import (
    OPENAI_ERRORS,
    EmbeddingData,
    EmbeddingsRequest,
    EmbeddingsResponse,
    ImageGenerationRequest,
    ImageGenerationResponse,
    ModelList,
    ModelObject,
    Usage,
    openai_responses,
)
from gateway.tasks.openai import OpenAITasks
from gateway.tasks.openai_inputs import IMAGE_FORMATS
from gateway.tenancy.context import RequestContext

from ._deps import app_state, get_context, get_jobs
from ._images import Expires, Signature, Signer, b64_data, image_responses, url_data
from ._pooled_json import PooledJsonRoute

# Embeddings inputs and image prompts can be megabytes of JSON: decoded off the loop when big.
router = APIRouter(prefix="/v1", tags=["openai"], route_class=PooledJsonRoute)


get_tasks = app_state("openai")
get_images = app_state("images")


Tasks = Annotated[OpenAITasks, Depends(get_tasks)]
Context = Annotated[RequestContext, Depends(get_context)]


@router.get(
    "/models",
    response_model=ModelList,
    summary="Models this credential can call (pipeline steps such as tokenizers are not listed)",
    responses=openai_responses(401, 503, 504),
    response_model_exclude_none=True,
)
async def list_models(tasks: Tasks, ctx: Context) -> ModelList:
    return ModelList(
        data=[
            ModelObject(
                id=m.id, created=m.created, state=m.state, footprint_bytes=m.footprint_bytes
            )
            for m in await tasks.models(ctx)
        ]
    )


@router.get(
    "/models/{model_id}",
    response_model=ModelObject,
    summary="One model this credential can call",
    responses=openai_responses(401, 404, 503, 504),
)
async def get_model(
    model_id: Annotated[str, Path(examples=["text_embedding"])], tasks: Tasks, ctx: Context
) -> ModelObject:
    model = await tasks.model(ctx, model_id)
    return ModelObject(id=model.id, created=model.created)


@router.post(
    "/embeddings",
    response_model=EmbeddingsResponse,
    summary="Embeddings (OpenAI-compatible): strings or token arrays, float or base64, usage from "
    "the tokenizer",
    responses=OPENAI_ERRORS,
)
async def embeddings(body: EmbeddingsRequest, tasks: Tasks, ctx: Context) -> EmbeddingsResponse:
    result = await tasks.embed(ctx, body.model, body.inputs(), body.dimensions)
    vectors = result.vectors
    if body.encoding_format == "base64":
        # Little-endian float32, exactly what the OpenAI SDKs decode.
        encoded: list[list[float] | str] = [
            base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") for row in vectors
        ]
    else:
        encoded = [row.tolist() for row in vectors]
    return EmbeddingsResponse(
        data=[EmbeddingData(index=i, embedding=v) for i, v in enumerate(encoded)],
        model=body.model,
        usage=Usage(prompt_tokens=result.tokens, total_tokens=result.tokens),
    )


@router.post(
    "/images/generations",
    response_model=ImageGenerationResponse,
    response_model_exclude_none=True,
    summary="Generate images (OpenAI-compatible): n, size, b64_json or a signed, expiring url",
    description="Answers 200 with the images, or, when the generation is estimated to take longer than "
    "`GATEWAY_IMAGE_ASYNC_AFTER_S` (or the request sends `Prefer: respond-async`), 202 with the queued job "
    "(as `POST /v1/images/jobs` answers) and `Location` naming it. `url` answers are signed and expire: they "
    "open without the API key.",
    responses={
        202: {
            "model": ImageJob,
            "description": "queued as a job: poll `Location`, then its `/result`",
        },
        **OPENAI_ERRORS,
    },
)
async def image_generations(
    body: ImageGenerationRequest,
    request: Request,
    tasks: Tasks,
    ctx: Context,
    store: Annotated[ImageStore, Depends(get_images)],
    signer: Signer,
    jobs: Annotated[ImageJobs, Depends(get_jobs)],
) -> ImageGenerationResponse | JSONResponse:
    triton_model, spec = await tasks.resolve_image(ctx, body.to_task())
    asked_async = "respond-async" in request.headers.get("prefer", "").lower()
    if asked_async or tasks.runs_long(triton_model, spec):
        job = await jobs.submit(ctx, spec, body.response_format or "b64_json", None)
        headers = {"Location": f"/v1/images/jobs/{job.id}"}
        if asked_async:
            headers["Preference-Applied"] = "respond-async"
        return JSONResponse(
            ImageJob.model_validate(jobs.document(job)).model_dump(mode="json"),
            status_code=202,
            headers=headers,
        )
    images = await tasks.generate_images(ctx, spec)
    if (body.response_format or "b64_json") == "b64_json":
        data = b64_data(images)
    else:
        assert ctx.principal is not None  # behind the auth middleware
        settings = tasks.service.settings
        media_type = IMAGE_FORMATS[spec.output_format][1]
        try:
            tokens = [
                await store.put(ctx.principal.client_id, image, media_type) for image in images
            ]
        except ValueError as exc:
            raise ServiceUnavailable(
                "the image is larger than the URL store holds; ask for b64_json",
                retry_after_s=settings.retry_after_s,
            ) from exc
        paths = (f"/v1/images/files/{token}" for token in tokens)
        data = url_data(request, settings, signer, paths, settings.image_url_ttl_s)
    return ImageGenerationResponse(created=int(time.time()), data=data)


@router.get(
    "/images/files/{token}",
    summary="A generated image behind a `url` answer: no API key, the URL's signature, until it expires",
    description="The URL is signed (`expires`, `signature`: an HMAC over its path and expiry); an "
    "altered one answers 403, an expired one 410, both as problem+json.",
    response_class=Response,
    responses=image_responses(404),
)
async def image_file(
    request: Request,
    token: Annotated[str, Path(max_length=64)],
    store: Annotated[ImageStore, Depends(get_images)],
    signer: Signer,
    expires: Expires = None,
    signature: Signature = None,
) -> Response:
    when = signer.check(request.url.path, expires, signature)
    image = await store.get(None, token)
    if image is None:
        raise NotFound(
            "this image is no longer kept (the store drops the oldest images when full)",
            field="token",
        )
    return Response(
        image.data,
        media_type=image.media_type,
        headers={"Cache-Control": f"private, max-age={signer.remaining_s(when)}"},
    )
