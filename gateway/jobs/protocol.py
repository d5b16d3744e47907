"""Request and response models of the image generation job routes (``/v1/images/jobs``).

Only the routes import this module; :mod:`gateway.jobs.service` works with plain values and
:func:`gateway.jobs.service.job_document` is the one description of a job both answer with.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.jobs.callback_signature import JOB_ID_HEADER, SIGNATURE_HEADER
from gateway.protocol.rest import IMAGE_REQUEST_EXAMPLE, ImageGenerationRequest
from serving.limits import DEFAULT_LIMITS

__all__ = [
    "CallbackInfo",
    "DeletedJob",
    "ImageJob",
    "ImageJobList",
    "ImageJobRequest",
    "JobErrorInfo",
]

_JOBS = DEFAULT_LIMITS.jobs


class ImageJobRequest(ImageGenerationRequest):
    """What ``/v1/images/generations`` takes, plus an optional completion callback."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [
                {
                    **IMAGE_REQUEST_EXAMPLE,
                    "response_format": "b64_json",
                    "callback_url": "https://hooks.example.com/generation-done",
                }
            ]
        },
    )

    callback_url: str | None = Field(
        None,
        max_length=_JOBS.max_callback_url_chars,
        description=(
            "POSTed a signed JSON event when the job ends (succeeded, failed or cancelled): "
            '`{"type": "image.generation.job.succeeded", "created": ..., "data": <the job>}`. Only '
            "URLs whose "
            "origin the operator allow-lists, resolving to public addresses (or allow-listed private ones). "
            f"Header `{SIGNATURE_HEADER}: t=<unix seconds>,v1=<hex HMAC-SHA256 of '<t>.' + body>` "
            f"keyed with the deployment's callback secret; `{JOB_ID_HEADER}` names the job (a "
            "callback may arrive more than once). Redirects are not followed; 408, 429 and 5xx "
            "answers and timeouts are retried with backoff."
        ),
    )


class JobErrorInfo(BaseModel):
    code: str = Field(description="the error's kind, as the synchronous route's `error.code`")
    message: str
    param: str | None = None


class CallbackInfo(BaseModel):
    url: str
    state: Literal["waiting", "pending", "delivered", "failed"] = Field(
        description="waiting: the job has not ended; pending: being delivered or retried"
    )
    attempts: int
    last_error: str | None = None


class ImageJob(BaseModel):
    """An image generation job."""

    model_config = ConfigDict(
        json_schema_extra={
            "example": {
                "id": "imgjob_Yc4b2n0Qm8aJX7Wl1oPzsR3T",
                "object": "image.generation.job",
                "status": "succeeded",
                "model": "stable_diffusion",
                "created_at": 1767225600.1,
                "started_at": 1767225600.2,
                "finished_at": 1767225609.7,
                "expires_at": 1767229209.7,
                "attempts": 1,
                "request": {
                    "prompt": "a watercolor fox in the snow",
                    "n": 2,
                    "width": 512,
                    "height": 512,
                    "steps": 25,
                    "seed": 0,
                    "response_format": "b64_json",
                },
                "images": 2,
                "error": None,
                "callback": None,
            }
        }
    )

    id: str
    object: Literal["image.generation.job"] = "image.generation.job"
    status: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    model: str
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    expires_at: float | None = Field(
        None, description="when a finished job and its images are deleted"
    )
    attempts: int = Field(description="times a worker started it (more than 1: a worker was lost)")
    request: dict[str, Any] = Field(description="the generation parameters, as submitted")
    images: int = Field(description="result images stored (succeeded jobs)")
    error: JobErrorInfo | None = None
    callback: CallbackInfo | None = None


class ImageJobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ImageJob]


class DeletedJob(BaseModel):
    id: str
    object: Literal["image.generation.job"] = "image.generation.job"
    deleted: bool = True
