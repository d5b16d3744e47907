"""OpenAI-compatible routes: ``/v1/models``, ``/v1/embeddings``, ``/v1/images/generations``."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends

from gateway.context import RequestContext
from gateway.errors import BadRequest
from gateway.protocol import (
    INFERENCE_ERRORS,
    EmbeddingData,
    EmbeddingsRequest,
    EmbeddingsResponse,
    ImageData,
    ImageGenerationRequest,
    ImageGenerationResponse,
    ModelCard,
    ModelList,
    Usage,
    problem_responses,
)
from gateway.service import InferenceService

from ._deps import get_context, get_service

router = APIRouter(prefix="/v1", tags=["openai"])

_MAX_EMBEDDING_INPUTS = 64


@router.get(
    "/models",
    response_model=ModelList,
    summary="Models this credential may use",
    responses=problem_responses(401, 503, 504),
)
async def list_models(
    service: Annotated[InferenceService, Depends(get_service)],
    ctx: Annotated[RequestContext, Depends(get_context)],
) -> ModelList:
    models = await service.list_models(ctx)
    return ModelList(data=[ModelCard(id=m.name, version=m.version, state=m.state) for m in models])


@router.post(
    "/embeddings",
    response_model=EmbeddingsResponse,
    summary="Text embeddings (OpenAI-compatible), from the text_embedding model",
    responses=INFERENCE_ERRORS,
)
async def embeddings(
    body: EmbeddingsRequest,
    service: Annotated[InferenceService, Depends(get_service)],
    ctx: Annotated[RequestContext, Depends(get_context)],
) -> EmbeddingsResponse:
    texts = body.texts()
    if len(texts) > _MAX_EMBEDDING_INPUTS:
        raise BadRequest(
            f"input holds {len(texts)} strings; at most {_MAX_EMBEDDING_INPUTS} per request", field="input"
        )
    vectors = await service.embed(ctx, body.model, texts)
    # Word count as a stand-in for tokens: the tokenizer runs inside Triton and does not report it.
    tokens = sum(len(t.split()) for t in texts)
    return EmbeddingsResponse(
        data=[EmbeddingData(index=i, embedding=v) for i, v in enumerate(vectors)],
        model=body.model,
        usage=Usage(prompt_tokens=tokens, total_tokens=tokens),
    )


@router.post(
    "/images/generations",
    response_model=ImageGenerationResponse,
    summary="Generate an image (OpenAI-compatible), from the stable_diffusion model",
    responses=INFERENCE_ERRORS,
)
async def image_generations(
    body: ImageGenerationRequest,
    service: Annotated[InferenceService, Depends(get_service)],
    ctx: Annotated[RequestContext, Depends(get_context)],
) -> ImageGenerationResponse:
    width, height = body.dimensions()
    image = await service.generate_image(
        ctx,
        body.prompt,
        model=body.model,
        width=width,
        height=height,
        negative_prompt=body.negative_prompt,
        steps=body.steps,
        guidance=body.guidance_scale,
        seed=body.seed,
    )
    return ImageGenerationResponse(created=int(time.time()), data=[ImageData(b64_json=image)])
