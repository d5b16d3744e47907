"""Request and response models of the gateway's REST APIs, with the examples OpenAPI shows.

Only the routes import this module; the service layer works with plain values.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.problems import PROBLEM_CONTENT_TYPE

__all__ = [
    "ClassifyResponse",
    "CreateKeyRequest",
    "CreatedKey",
    "EmbeddingData",
    "EmbeddingsRequest",
    "EmbeddingsResponse",
    "Health",
    "ImageData",
    "ImageGenerationRequest",
    "ImageGenerationResponse",
    "KeyInfo",
    "ModelCard",
    "ModelList",
    "Problem",
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
    413: "Body larger than GATEWAY_MAX_BODY_BYTES",
    422: "A request field failed validation (the field is named)",
    429: "Rate limit exceeded or too many requests in flight (Retry-After, RateLimit-* headers)",
    502: "Triton answered with an internal error",
    503: "Triton (or Redis, with the closed policy) is unavailable (Retry-After)",
    504: "Triton did not answer within GATEWAY_UPSTREAM_TIMEOUT_S",
}


def problem_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for the given error statuses, all problem+json."""
    return {
        code: {"model": Problem, "description": _DESCRIPTIONS[code], "content": {PROBLEM_CONTENT_TYPE: {}}}
        for code in codes
    }


INFERENCE_ERRORS = problem_responses(400, 401, 403, 404, 413, 422, 429, 502, 503, 504)


class Health(BaseModel):
    status: Literal["ok", "ready", "not ready"]
    triton: str | None = Field(None, description="Triton's HTTP address, on readiness")


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    owned_by: str = "triton"
    version: str = ""
    state: str = Field(description="Triton's state: READY, UNAVAILABLE, LOADING ...")


class ModelList(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "example": {
                "object": "list",
                "data": [
                    {
                        "id": "image_classifier",
                        "object": "model",
                        "owned_by": "triton",
                        "version": "1",
                        "state": "READY",
                    }
                ],
            }
        }
    )

    object: Literal["list"] = "list"
    data: list[ModelCard]


class ClassPrediction(BaseModel):
    label: str
    score: float = Field(description="softmax probability")
    class_id: int


class ClassifyResult(BaseModel):
    filename: str | None
    top: list[ClassPrediction]


class ClassifyResponse(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "example": {
                "model": "image_classifier",
                "results": [
                    {
                        "filename": "cat.jpg",
                        "top": [
                            {"label": "tabby", "score": 0.61, "class_id": 281},
                            {"label": "tiger cat", "score": 0.2, "class_id": 282},
                        ],
                    }
                ],
            }
        }
    )

    model: str
    results: list[ClassifyResult]


class EmbeddingsRequest(BaseModel):
    """OpenAI-compatible embeddings request."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [{"model": "text_embedding", "input": ["a photo of a cat", "espresso"]}]
        },
    )

    model: str = Field(min_length=1, description="'text_embedding' or a configured alias")
    input: str | list[str] = Field(description="one string or a list of up to 64 strings")
    encoding_format: Literal["float"] = "float"
    user: str | None = None

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float]


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "example": {
                "object": "list",
                "data": [{"object": "embedding", "index": 0, "embedding": [0.013, -0.072, 0.051]}],
                "model": "text_embedding",
                "usage": {"prompt_tokens": 5, "total_tokens": 5},
            }
        }
    )

    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: Usage


class ImageGenerationRequest(BaseModel):
    """OpenAI-compatible image generation request (one image, base64 PNG)."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [
                {
                    "prompt": "a watercolor fox in the snow",
                    "n": 1,
                    "size": "512x512",
                    "response_format": "b64_json",
                }
            ]
        },
    )

    prompt: str = Field(min_length=1, max_length=2000)
    model: str | None = Field(None, description="defaults to the configured diffusion model")
    n: int = Field(1, ge=1, le=1, description="only 1 is supported")
    size: str = Field("512x512", pattern=r"^\d{2,4}x\d{2,4}$", description="WIDTHxHEIGHT, multiples of 8")
    response_format: Literal["b64_json"] = "b64_json"
    negative_prompt: str = ""
    steps: int = Field(20, ge=1, le=150)
    guidance_scale: float = Field(7.5, ge=0, le=50)
    seed: int = Field(0, ge=0)

    def dimensions(self) -> tuple[int, int]:
        width, height = self.size.split("x")
        return int(width), int(height)


class ImageData(BaseModel):
    b64_json: str


class ImageGenerationResponse(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={"example": {"created": 1764690000, "data": [{"b64_json": "iVBORw0KGgo..."}]}}
    )

    created: int
    data: list[ImageData]


class CreateKeyRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"name": "mobile-app", "scopes": ["image_classifier"], "tier": "standard"}]
        },
    )

    name: str = Field(min_length=1, max_length=200)
    scopes: list[str] = Field(
        default_factory=lambda: ["*"], min_length=1, description="model names, or ['*'] for all"
    )
    tier: str = Field("free", description="a tier of GATEWAY_TIER_LIMITS")


class KeyInfo(BaseModel):
    key_id: str
    name: str
    scopes: list[str]
    tier: str
    created_at: float
    rotated_at: float | None = None
    revoked_at: float | None = None


class CreatedKey(KeyInfo):
    """A key as created or rotated: the only time its plaintext is shown."""

    model_config = ConfigDict(
        json_schema_extra={
            "example": {
                "key_id": "3f9a0c1b2d4e",
                "name": "mobile-app",
                "scopes": ["image_classifier"],
                "tier": "standard",
                "created_at": 1764690000.0,
                "api_key": "gk_3f9a0c1b2d4e_Vx8...",
            }
        }
    )

    api_key: str = Field(description="shown once; only its SHA-256 is stored")
