"""The error bodies of the gateway's REST APIs as OpenAPI documents them: problem+json (RFC 9457),
OpenAI's ``{"error": {...}}`` and KServe v2's ``{"error": "..."}``, and the ``responses`` entries routes
declare. :mod:`gateway.http.problems` renders them; :mod:`gateway.protocol.rest` re-exports them for
the routes.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gateway.http.problems import PROBLEM_CONTENT_TYPE

__all__ = [
    "INFERENCE_ERRORS",
    "KSERVE_ERRORS",
    "OPENAI_ERRORS",
    "KServeError",
    "OpenAIError",
    "OpenAIErrorDetail",
    "Problem",
    "kserve_responses",
    "openai_responses",
    "problem_responses",
]


class Problem(BaseModel):
    """An RFC 9457 problem document: the body of every error response."""

    model_config = ConfigDict(
        json_schema_extra={
            "example": {
                "type": "urn:gateway:problem:model-not-found",
                "title": "Model not found",
                "status": 404,
                "detail": "model 'text_embedding' is not served by Triton",
                "instance": "/v1/embeddings",
                "field": "model",
            }
        }
    )

    type: str
    title: str
    status: int
    detail: str
    instance: str
    field: str | None = Field(None, description="the request field at fault, when there is one")


_DESCRIPTIONS = {
    400: "Malformed request or inputs Triton refused (the field is named)",
    401: "Missing, wrong, expired or revoked credential",
    403: "The credential lacks the scope for this model, or the admin API is disabled",
    404: "Unknown model (named in the detail) or resource",
    409: "The request contradicts stored state (an imported key id exists with other content; a "
    "version is not READY)",
    413: "Body larger than GATEWAY_MAX_BODY_BYTES (compressed, or once decompressed)",
    415: "A Content-Encoding other than gzip, deflate or identity",
    422: "A request field failed validation (the field is named)",
    429: "Rate limit exceeded or too many requests in flight (Retry-After, RateLimit-* headers)",
    502: "Triton answered with an internal error",
    503: "Triton, or the shared store (Redis), is unavailable (Retry-After)",
    504: "Triton did not answer within GATEWAY_UPSTREAM_TIMEOUT_S",
    507: "the model is larger than the memory budget of a Triton instance (GATEWAY_RESIDENCY_BUDGET_BYTES)",
}


def problem_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for the given error statuses, all problem+json."""
    return {
        code: {
            "model": Problem,
            "description": _DESCRIPTIONS[code],
            "content": {PROBLEM_CONTENT_TYPE: {}},
        }
        for code in codes
    }


INFERENCE_ERRORS = problem_responses(400, 401, 403, 404, 413, 415, 422, 429, 502, 503, 504)


class OpenAIErrorDetail(BaseModel):
    message: str = Field(description="what went wrong, for people")
    type: str = Field(
        description="invalid_request_error, authentication_error, permission_error, "
        "rate_limit_error or server_error"
    )
    param: str | None = Field(None, description="the request field at fault, when there is one")
    code: str | None = Field(
        None, description="the kind of error, e.g. model_not_found, rate_limited"
    )


class OpenAIError(BaseModel):
    """OpenAI's error body, on the OpenAI-compatible routes (the SDKs show ``error.message``)."""

    model_config = ConfigDict(
        json_schema_extra={
            "example": {
                "error": {
                    "message": "model 'text-embedding-3-small' is not served by Triton",
                    "type": "invalid_request_error",
                    "param": "model",
                    "code": "model_not_found",
                }
            }
        }
    )

    error: OpenAIErrorDetail


class KServeError(BaseModel):
    """The KServe v2 error body, on ``/v2`` routes (tritonclient raises it as its exception's message)."""

    model_config = ConfigDict(
        json_schema_extra={"example": {"error": "model 'resnet' is not served by Triton"}}
    )

    error: str


def openai_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries in OpenAI's error shape (validation failures are 400 there)."""
    return {
        code: {"model": OpenAIError, "description": _DESCRIPTIONS[code]}
        for code in codes
        if code != 422
    }


def kserve_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries in the KServe v2 error shape."""
    return {code: {"model": KServeError, "description": _DESCRIPTIONS[code]} for code in codes}


OPENAI_ERRORS = openai_responses(400, 401, 403, 404, 413, 429, 502, 503, 504)
KSERVE_ERRORS = kserve_responses(400, 401, 403, 404, 413, 429, 502, 503, 504)
