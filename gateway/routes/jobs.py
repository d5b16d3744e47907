"""Image generation as jobs: ``/v1/images/jobs`` (submit, list), ``/v1/images/jobs/{id}`` (poll,
delete), ``.../result`` (the images, as ``/v1/images/generations`` answers), ``.../images/{k}`` (one
image, for ``url`` results) and ``.../cancel``.

Errors are OpenAI's ``{"error": {...}}`` (these are ``/v1/images/*`` paths). The work is
:class:`gateway.jobs.service.ImageJobs` and :class:`gateway.jobs.runner.JobRunner`; this module only
translates HTTP.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response

from gateway.errors import NotFound
from gateway.jobs.protocol import DeletedJob, ImageJob, ImageJobList, ImageJobRequest
from gateway.jobs.runner import JobRunner
from gateway.jobs.service import MAX_LISTED, ImageJobs
from gateway.jobs.store import Job
from gateway.protocol.rest import (
    OPENAI_ERRORS,
    ImageGenerationResponse,
    openai_responses,
)
from gateway.tenancy.context import RequestContext
from serving.limits import DEFAULT_LIMITS

from ._deps import app_state, get_context, get_jobs
from ._images import Expires, Signature, Signer, b64_data, image_responses, url_data

router = APIRouter(prefix="/v1/images/jobs", tags=["image jobs"])


get_runner = app_state("job_runner")


Jobs = Annotated[ImageJobs, Depends(get_jobs)]
Context = Annotated[RequestContext, Depends(get_context)]
JobId = Annotated[str, Path(max_length=64, examples=["imgjob_Yc4b2n0Qm8aJX7Wl1oPzsR3T"])]


def _view(jobs: ImageJobs, job: Job) -> ImageJob:
    return ImageJob.model_validate(jobs.document(job))


@router.post(
    "",
    status_code=202,
    response_model=ImageJob,
    summary="Submit an image generation job (the body of /v1/images/generations, plus callback_url)",
    description="Answers at once with the queued job (202, `Location` naming it); poll it, then fetch "
    "`/result`. The request is checked, and takes a rate-limit token, as /v1/images/generations "
    f"does; a key may hold {DEFAULT_LIMITS.jobs.max_active_per_key} jobs queued or running and "
    f"{DEFAULT_LIMITS.jobs.max_kept_per_key} in all, finished ones included until they expire or "
    "are deleted (429 past either).",
    responses=OPENAI_ERRORS,
)
async def submit(body: ImageJobRequest, response: Response, jobs: Jobs, ctx: Context) -> ImageJob:
    job = await jobs.submit(
        ctx, body.to_task(), body.response_format or "b64_json", body.callback_url
    )
    response.headers["Location"] = f"/v1/images/jobs/{job.id}"
    return _view(jobs, job)


@router.get(
    "",
    response_model=ImageJobList,
    summary="This credential's jobs, newest first (the admin credential: everyone's)",
    responses=openai_responses(401, 503),
)
async def list_jobs(
    jobs: Jobs, ctx: Context, limit: Annotated[int, Query(ge=1, le=MAX_LISTED)] = 20
) -> ImageJobList:
    return ImageJobList(data=[_view(jobs, job) for job in await jobs.list_jobs(ctx, limit)])


@router.get(
    "/{job_id}",
    response_model=ImageJob,
    summary="One job: its status, and its error or number of images once it has ended",
    responses=openai_responses(401, 404, 503),
)
async def get_job(job_id: JobId, jobs: Jobs, ctx: Context) -> ImageJob:
    return _view(jobs, await jobs.get(ctx, job_id))


@router.post(
    "/{job_id}/cancel",
    response_model=ImageJob,
    summary="Cancel a queued or running job (a running one stops, and its result is dropped)",
    responses=openai_responses(401, 404, 409, 503),
)
async def cancel_job(
    job_id: JobId, jobs: Jobs, ctx: Context, runner: Annotated[JobRunner, Depends(get_runner)]
) -> ImageJob:
    job = await jobs.cancel(ctx, job_id)
    runner.cancel_local(
        job.id
    )  # at once when this process runs it; other processes see it at their renewal
    return _view(jobs, job)


@router.delete(
    "/{job_id}",
    response_model=DeletedJob,
    summary="Delete a finished job and its images (a queued or running one: cancel it first)",
    responses=openai_responses(401, 404, 409, 503),
)
async def delete_job(job_id: JobId, jobs: Jobs, ctx: Context) -> DeletedJob:
    await jobs.delete(ctx, job_id)
    return DeletedJob(id=job_id)


@router.get(
    "/{job_id}/result",
    response_model=ImageGenerationResponse,
    response_model_exclude_none=True,
    summary="A succeeded job's images, as /v1/images/generations answers (b64_json, or url)",
    responses=openai_responses(401, 404, 409, 503),
)
async def job_result(
    job_id: JobId,
    request: Request,
    jobs: Jobs,
    ctx: Context,
    signer: Signer,
) -> ImageGenerationResponse:
    result = await jobs.result(ctx, job_id)
    created = int(result.job.finished_at or time.time())
    if result.response_format == "url":
        settings = jobs.tasks.service.settings
        # Signed like /v1/images/generations' URLs; they open until the job expires (or the URL's own
        # expiry, the sooner), and deleting the job removes what they point at.
        ttl = min(settings.image_url_ttl_s, max(1.0, (result.job.expires_at or 0) - time.time()))
        paths = (f"/v1/images/jobs/{result.job.id}/images/{k}" for k in range(len(result.images)))
        data = url_data(request, settings, signer, paths, ttl)
    else:
        data = b64_data(result.images)
    return ImageGenerationResponse(created=created, data=data)


@router.get(
    "/{job_id}/images/{index}",
    summary="One image of a succeeded job: by its signed URL (no key), or for the credential that "
    "submitted it",
    response_class=Response,
    responses=image_responses(401, 404, 409, 503),
)
async def job_image(
    job_id: JobId,
    index: Annotated[int, Path(ge=0, le=64)],
    request: Request,
    jobs: Jobs,
    ctx: Context,
    signer: Signer,
    expires: Expires = None,
    signature: Signature = None,
) -> Response:
    if ctx.principal is None:  # no credential: the auth middleware let a signed URL through
        signer.check(request.url.path, expires, signature)
        result = await jobs.signed_result(job_id)
    else:
        result = await jobs.result(ctx, job_id)
    if index >= len(result.images):
        raise NotFound(f"job '{result.job.id}' has {len(result.images)} images", field="index")
    remaining = max(0, int((result.job.expires_at or 0) - time.time()))
    return Response(
        result.images[index],
        media_type=result.job.media_type or "application/octet-stream",
        headers={"Cache-Control": f"private, max-age={remaining}"},
    )
