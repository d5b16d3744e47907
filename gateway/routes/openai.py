"""OpenAI-compatible routes: ``/v1/models``, ``/v1/models/{id}``, ``/v1/embeddings``,
``/v1/images/generations`` and the short-lived image files its ``url`` answers point to.

Errors on these paths are OpenAI's ``{"error": {"message", "type", "param", "code"}}`` (the SDKs
show ``message``). The work is :class:`gateway.openai_tasks.OpenAITasks`; this module only
translates HTTP.
"""

from __future__ import annotations

import base64
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request, Response

from gateway.context import RequestContext
from gateway.errors import NotFound, ServiceUnavailable
from gateway.image_store import ImageStore
from gateway.openai_tasks import IMAGE_FORMATS, OpenAITasks
from gateway.protocol import (
    OPENAI_ERRORS,
    EmbeddingData,
    EmbeddingsRequest,
    EmbeddingsResponse,
    ImageData,
    ImageGenerationRequest,
    ImageGenerationResponse,
    ModelList,
    ModelObject,
    Usage,
    openai_responses,
)

from ._deps import get_context

router = APIRouter(prefix="/v1", tags=["openai"])


async def get_tasks(request: Request) -> OpenAITasks:
    return request.app.state.openai  # type: ignore[no-any-return]


async def get_images(request: Request) -> ImageStore:
    return request.app.state.images  # type: ignore[no-any-return]


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
    return ModelList(data=[ModelObject(id=m.id, created=m.created, state=m.state, footprint_bytes=m.footprint_bytes)
                           for m in await tasks.models(ctx)])


@router.get(
    "/models/{model_id}",
    response_model=ModelObject,
    summary="One model this credential can call",
    responses=openai_responses(401, 404, 503, 504),
)
async def get_model(model_id: Annotated[str, Path(examples=["text_embedding"])], tasks: Tasks, ctx: Context) -> ModelObject:
    model = await tasks.model(ctx, model_id)
    return ModelObject(id=model.id, created=model.created)


@router.post(
    "/embeddings",
    response_model=EmbeddingsResponse,
    summary="Embeddings (OpenAI-compatible): strings or token arrays, float or base64, usage from the tokenizer",
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
    summary="Generate images (OpenAI-compatible): n, size, b64_json or a short-lived url",
    responses=OPENAI_ERRORS,
)
async def image_generations(
    body: ImageGenerationRequest,
    request: Request,
    tasks: Tasks,
    ctx: Context,
    store: Annotated[ImageStore, Depends(get_images)],
) -> ImageGenerationResponse:
    spec = body.to_task()
    images = await tasks.generate_images(ctx, spec)
    if (body.response_format or "b64_json") == "b64_json":
        data = [ImageData(b64_json=base64.b64encode(image).decode("ascii")) for image in images]
    else:
        assert ctx.principal is not None  # behind the auth middleware
        base = tasks.service.settings.public_url.rstrip("/") or str(request.base_url).rstrip("/")
        media_type = IMAGE_FORMATS[spec.output_format][1]
        try:
            tokens = [await store.put(ctx.principal.client_id, image, media_type) for image in images]
        except ValueError as exc:
            raise ServiceUnavailable("the image is larger than the URL store holds; ask for b64_json",
                                     retry_after_s=tasks.service.settings.retry_after_s) from exc
        data = [ImageData(url=f"{base}/v1/images/files/{token}") for token in tokens]
    return ImageGenerationResponse(created=int(time.time()), data=data)


@router.get(
    "/images/files/{token}",
    summary="A generated image behind a `url` answer: for the credential that made it, until it expires",
    response_class=Response,
    responses={200: {"content": {"image/png": {}, "image/jpeg": {}, "image/webp": {}}},
               **openai_responses(401, 404)},
)
async def image_file(
    token: Annotated[str, Path(max_length=64)],
    ctx: Context,
    store: Annotated[ImageStore, Depends(get_images)],
) -> Response:
    assert ctx.principal is not None  # behind the auth middleware
    image = await store.get(ctx.principal.client_id, token)
    if image is None:
        raise NotFound("no such image for this credential (image URLs expire, and only their maker may fetch them)",
                       field="token")
    return Response(image.data, media_type=image.media_type,
                    headers={"Cache-Control": f"private, max-age={store.remaining_s(image)}"})
