"""Request and response models of the gateway's REST APIs, with the examples OpenAPI shows.

Only the routes import this module; the service layer works with plain values. The admin key API's
models are in :mod:`gateway.tenancy.key_protocol`, the job API's in :mod:`gateway.jobs.protocol`; the error
bodies live in :mod:`gateway.protocol.errors` and are re-exported here for the routes.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
)
from pydantic.json_schema import JsonDict

from gateway.protocol.errors import (
    INFERENCE_ERRORS,
    KSERVE_ERRORS,
    OPENAI_ERRORS,
    KServeError,
    OpenAIError,
    Problem,
    kserve_responses,
    openai_responses,
    problem_responses,
)
from gateway.tasks.openai_inputs import ImageRequest
from serving.limits import DEFAULT_LIMITS

_EMBEDDINGS = DEFAULT_LIMITS.embeddings
_GENERATION = DEFAULT_LIMITS.image_generation

__all__ = [
    "IMAGE_REQUEST_EXAMPLE",
    "INFERENCE_ERRORS",
    "KSERVE_ERRORS",
    "OPENAI_ERRORS",
    "ClassifyResponse",
    "EmbeddingData",
    "EmbeddingsRequest",
    "EmbeddingsResponse",
    "Health",
    "ImageData",
    "ImageGenerationRequest",
    "ImageGenerationResponse",
    "KServeError",
    "ModelObject",
    "ModelList",
    "OpenAIError",
    "Problem",
    "kserve_responses",
    "openai_responses",
    "problem_responses",
]


class Health(BaseModel):
    status: Literal["ok", "ready", "not ready"]
    triton: str | None = Field(None, description="Triton's HTTP address, on readiness")
    models: list[str] | None = Field(
        None,
        description="on readiness: the models checked (each READY and passing one synthetic inference)",
    )


class ModelObject(BaseModel):
    """A model as OpenAI's ``/v1/models`` describes one."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(
        description="Unix time the model's entry was published (0 when it does not say)"
    )
    owned_by: str = "triton"
    state: str | None = Field(
        None,
        description="with residency on: loaded, loading, unloading or available "
        "(loaded on the first request)",
    )
    footprint_bytes: int | None = Field(
        None,
        description="with residency on: its memory, measured at its last "
        "load (or estimated before one)",
    )


class ModelList(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "example": {
                "object": "list",
                "data": [
                    {
                        "id": "image_classifier",
                        "object": "model",
                        "created": 1764690000,
                        "owned_by": "triton",
                    },
                    {
                        "id": "text_embedding",
                        "object": "model",
                        "created": 1764690000,
                        "owned_by": "triton",
                    },
                ],
            }
        }
    )

    object: Literal["list"] = "list"
    data: list[ModelObject]


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


# Lengths and ranges are checked by the service, which names the item at fault (``input.3``); a
# constraint here would be reported against a member of the union instead.
TokenArray = list[StrictInt]


def _state_input_limits(schema: dict[str, Any]) -> None:
    """The limits of ``input`` in its OpenAPI schema (enforced by the OpenAI tasks, from serving.limits)."""
    limits = _EMBEDDINGS
    for member in schema.get("anyOf", []):
        if member.get("type") == "string":
            member.update(minLength=1, maxLength=limits.max_text_chars)
        elif member.get("type") == "array":
            member.update(minItems=1, maxItems=limits.max_inputs)
            items = member.get("items", {})
            if items.get("type") == "string":
                items.update(minLength=1, maxLength=limits.max_text_chars)
            elif items.get("type") == "integer":  # one token array
                member.update(maxItems=limits.max_token_ids)
            elif items.get("type") == "array":  # a list of token arrays
                items.update(minItems=1, maxItems=limits.max_token_ids)


class EmbeddingsRequest(BaseModel):
    """OpenAI-compatible embeddings request."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [
                {"model": "text_embedding", "input": ["a photo of a cat", "espresso"]},
                {
                    "model": "text_embedding",
                    "input": [[101, 7592, 2088, 102]],
                    "encoding_format": "base64",
                },
            ]
        },
    )

    model: str = Field(
        min_length=1, description="an embedding model of `/v1/models` (e.g. 'text_embedding')"
    )
    input: StrictStr | list[StrictStr] | TokenArray | list[TokenArray] = Field(
        json_schema_extra=_state_input_limits,
        description=(
            f"one string, a list of up to {_EMBEDDINGS.max_inputs} strings (each 1 to "
            f"{_EMBEDDINGS.max_text_chars} characters), or up to {_EMBEDDINGS.max_inputs} token "
            "arrays: ids of the model's own vocabulary (WordPiece for text_embedding; up to "
            f"{_EMBEDDINGS.max_token_ids} per input, [CLS]/[SEP] added where missing). An array "
            "holding an id that tokenizer never makes from text (outside the vocabulary, a "
            "reserved entry, [CLS]/[SEP] in the middle), such as another tokenizer's "
            "(tiktoken's), is refused with 400 naming the input. Large lists are split into the "
            "model's batch size and answered in order. The encoder reads the first 256 tokens."
        ),
    )
    encoding_format: Literal["float", "base64"] = Field(
        "float",
        description="base64: each vector as little-endian float32 bytes (what the OpenAI SDKs send)",
    )
    dimensions: int | None = Field(
        None,
        ge=1,
        description=(
            "shorter vectors: the first `dimensions` values, L2-renormalised; 1 to the model's "
            "length (384 for text_embedding), else 400 naming `dimensions`. Models trained for it "
            "(Matryoshka) keep most of their quality when shortened; all-MiniLM-L6-v2 was not, and "
            "loses more the shorter it gets"
        ),
    )
    user: str | None = None

    @field_validator("input", mode="wrap")
    @classmethod
    def _one_shape(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # One clear message at ``input`` instead of one per member of the union.
        try:
            return handler(value)
        except ValidationError:
            raise ValueError(
                "input must be a string, a list of strings, a token array (a list of integer ids) or a list "
                "of token arrays"
            ) from None

    def inputs(self) -> list[str] | list[list[int]]:
        """The inputs as a list: of strings, or of token arrays."""
        value = self.input
        if isinstance(value, str):
            return [value]
        if value and all(isinstance(item, int) for item in value):
            return [list(value)]  # type: ignore[return-value]
        return list(value)  # type: ignore[return-value]


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description="floats, or base64 of little-endian float32")


class Usage(BaseModel):
    prompt_tokens: int = Field(
        description="tokens the model's tokenizer produced, [CLS]/[SEP] included"
    )
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "example": {
                "object": "list",
                "data": [{"object": "embedding", "index": 0, "embedding": [0.013, -0.072, 0.051]}],
                "model": "text_embedding",
                "usage": {"prompt_tokens": 7, "total_tokens": 7},
            }
        }
    )

    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: Usage


#: the documented example of an image generation request (the job route's adds a callback to it)
IMAGE_REQUEST_EXAMPLE: JsonDict = {
    "prompt": "a watercolor fox in the snow",
    "n": 2,
    "size": "512x512",
    "response_format": "url",
}


class ImageGenerationRequest(BaseModel):
    """OpenAI-compatible image generation request."""

    model_config = ConfigDict(
        extra="ignore", json_schema_extra={"examples": [IMAGE_REQUEST_EXAMPLE]}
    )

    prompt: str = Field(min_length=1, max_length=_GENERATION.max_prompt_chars)
    model: str | None = Field(None, description="defaults to the configured diffusion model")
    n: int | None = Field(
        1, ge=1, le=_GENERATION.max_images, description="images, each its own seed"
    )
    size: str | None = Field(
        None,
        pattern=r"^(auto|\d{2,4}x\d{2,4})$",
        description=(
            f"WIDTHxHEIGHT, each a multiple of {_GENERATION.side_multiple} from {_GENERATION.min_side} to "
            f"{_GENERATION.max_side}; absent or 'auto': the model's own side (its card's "
            "limit_default_side: 64 for the tiny default model, 512 for SD 1.5)"
        ),
    )
    response_format: Literal["b64_json", "url"] | None = Field(
        "b64_json",
        description="url: a link served by this gateway, for a short while, to this credential only",
    )
    output_format: Literal["png", "jpeg", "webp"] | None = "png"
    negative_prompt: str = Field("", max_length=_GENERATION.max_prompt_chars)
    steps: int | None = Field(
        None,
        ge=_GENERATION.min_steps,
        le=_GENERATION.max_steps,
        description="denoising steps; absent: the model's own default (limit_default_steps)",
    )
    guidance_scale: float = Field(
        _GENERATION.default_guidance,
        ge=_GENERATION.min_guidance,
        le=_GENERATION.max_guidance,
        allow_inf_nan=False,
    )
    seed: int = Field(
        0,
        ge=_GENERATION.min_seed,
        le=_GENERATION.max_seed,
        description="seed of the first image; image k uses seed + k",
    )
    scheduler: str = Field(
        "default",
        max_length=64,
        description=f"default (the checkpoint's own) or one of {', '.join(_GENERATION.schedulers)}",
    )

    def dimensions(self) -> tuple[int | None, int | None]:
        """(width, height) asked for; ``None`` for the model's own side."""
        if self.size in (None, "auto"):
            return None, None
        width, height = self.size.split("x")
        return int(width), int(height)

    def to_task(self) -> ImageRequest:
        """The protocol-neutral request the tasks (and the job store) work with."""
        width, height = self.dimensions()
        return ImageRequest(
            prompt=self.prompt,
            model=self.model,
            n=self.n or 1,
            width=width,
            height=height,
            output_format=self.output_format or "png",
            negative_prompt=self.negative_prompt,
            steps=self.steps,
            guidance=self.guidance_scale,
            seed=self.seed,
            scheduler=self.scheduler,
        )


class ImageData(BaseModel):
    b64_json: str | None = None
    url: str | None = None
    revised_prompt: str | None = None


class ImageGenerationResponse(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "example": {
                "created": 1764690000,
                "data": [{"url": "http://127.0.0.1:8080/v1/images/files/Zk3..."}],
            }
        }
    )

    created: int
    data: list[ImageData]
