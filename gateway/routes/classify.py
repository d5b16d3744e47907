"""``/v1/classify``: upload images, get the top-5 ImageNet classes from the classifier ensemble."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, File, UploadFile

from gateway.context import RequestContext
from gateway.errors import BadRequest
from gateway.protocol import INFERENCE_ERRORS, ClassifyResponse, ClassifyResult, ClassPrediction
from gateway.service import InferenceService

from ._deps import get_context, get_service

router = APIRouter(prefix="/v1", tags=["classify"])

_MAX_FILES = 8  # the classifier's max_batch_size


@router.post(
    "/classify",
    response_model=ClassifyResponse,
    summary="Classify JPEG/PNG images (multipart field 'file', repeat it for up to 8 images)",
    responses=INFERENCE_ERRORS,
)
async def classify(
    file: Annotated[list[UploadFile], File(description="one or more encoded images (JPEG, PNG)")],
    service: Annotated[InferenceService, Depends(get_service)],
    ctx: Annotated[RequestContext, Depends(get_context)],
) -> ClassifyResponse:
    if len(file) > _MAX_FILES:
        raise BadRequest(f"{len(file)} files sent; at most {_MAX_FILES} per request", field="file")
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
