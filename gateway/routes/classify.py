"""``/v1/classify``: upload images, get the top-5 ImageNet classes from the classifier ensemble."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, File, UploadFile

from gateway.protocol.rest import (
    INFERENCE_ERRORS,
    ClassifyResponse,
    ClassifyResult,
    ClassPrediction,
)
from gateway.tasks.service import InferenceService
from gateway.tenancy.context import RequestContext
from serving.limits import DEFAULT_LIMITS

from ._deps import get_context, get_service

router = APIRouter(prefix="/v1", tags=["classify"])

_UPLOAD = DEFAULT_LIMITS.image_upload


@router.post(
    "/classify",
    response_model=ClassifyResponse,
    summary="Classify JPEG/PNG images (multipart field 'file', repeat it for up to "
    f"{_UPLOAD.max_count} images)",
    responses=INFERENCE_ERRORS,
)
async def classify(
    file: Annotated[
        list[UploadFile],
        File(
            description=(
                f"1 to {_UPLOAD.max_count} encoded images (JPEG, PNG, GIF, BMP, WebP), each at most "
                f"{_UPLOAD.max_bytes // (1024 * 1024)} MiB"
            )
        ),
    ],
    service: Annotated[InferenceService, Depends(get_service)],
    ctx: Annotated[RequestContext, Depends(get_context)],
) -> ClassifyResponse:
    images = [await f.read() for f in file]
    results = await service.classify(ctx, images)
    return ClassifyResponse(
        model=service.settings.classifier_model,
        results=[
            ClassifyResult(
                filename=f.filename,
                top=[
                    ClassPrediction(label=lab, score=s, class_id=c)
                    for lab, s, c in zip(r.labels, r.scores, r.class_ids, strict=True)
                ],
            )
            for f, r in zip(file, results, strict=True)
        ],
    )
