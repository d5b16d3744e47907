"""The OpenAI-compatible tasks' inputs, checked: texts, token ids, ``dimensions`` and image requests.

Pure functions of a request and the limits (:mod:`serving.limits`), with no service behind them:
:mod:`gateway.tasks.openai` runs what they return, the job store (:mod:`gateway.jobs`) keeps
:class:`ImageRequest` as JSON, and every refusal is a :class:`gateway.errors.BadRequest` naming the
field.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from gateway.backends.triton import Tensor
from gateway.errors import BadRequest
from gateway.observe.generation_pace import generation_work
from serving.limits import DEFAULT_LIMITS, EmbeddingLimits, ImageGenerationLimits

__all__ = [
    "IMAGE_FORMATS",
    "ImageRequest",
    "check_dimensions",
    "check_text",
    "embedding_tensors",
    "encode_image",
    "image_requests",
    "image_work",
    "token_row",
]

#: output_format -> (Pillow format, media type)
IMAGE_FORMATS = {
    "png": ("PNG", "image/png"),
    "jpeg": ("JPEG", "image/jpeg"),
    "webp": ("WEBP", "image/webp"),
}


@dataclass(frozen=True, kw_only=True)
class ImageRequest:
    """One image-generation request, as the synchronous route and the job store hand it over.

    Attributes:
        prompt, negative_prompt: the texts (checked against the limits by the tasks).
        model: the public model name; ``None`` is the configured diffusion model.
        n: images, image ``k`` with seed ``seed + k``.
        width, height: pixels; ``None``: the model's own side (its card's).
        output_format: ``png``, ``jpeg`` or ``webp``.
        steps: denoising steps; ``None``: the model's own default (its card's).
        guidance: the classifier-free guidance scale.
        seed: the seed of the first image.
        scheduler: ``default`` (the checkpoint's own) or a name of ``serving.limits``' schedulers.
    """

    prompt: str
    model: str | None = None
    n: int = 1
    width: int | None = None
    height: int | None = None
    output_format: str = "png"
    negative_prompt: str = ""
    steps: int | None = None
    guidance: float = DEFAULT_LIMITS.image_generation.default_guidance
    seed: int = 0
    scheduler: str = "default"

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (what a job stores)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ImageRequest:
        """The request a job stored; fields it lacks take their defaults, unknown ones are ignored."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def image_requests(request: ImageRequest, limits: ImageGenerationLimits) -> list[list[Tensor]]:
    """``request`` checked against ``limits``, as one Triton request per image.

    Raises:
        BadRequest: a parameter out of range (the field is named).
    """
    n, seed = request.n, request.seed
    # Unresolved (None) sides and steps are checked as the platform's defaults; resolve_image fills them.
    width = limits.default_side if request.width is None else request.width
    height = limits.default_side if request.height is None else request.height
    steps = limits.default_steps if request.steps is None else request.steps
    if not request.prompt.strip():
        raise BadRequest("prompt must not be empty", field="prompt")
    if not 1 <= n <= limits.max_images:
        raise BadRequest(f"n must be between 1 and {limits.max_images}", field="n")
    for name, side in (("width", width), ("height", height)):
        problem = limits.side_problem(name, side)
        if problem is not None:
            raise BadRequest(problem, field="size")
    if not limits.min_steps <= steps <= limits.max_steps:
        raise BadRequest(
            f"steps must be between {limits.min_steps} and {limits.max_steps}", field="steps"
        )
    guidance = request.guidance
    if not (math.isfinite(guidance) and limits.min_guidance <= guidance <= limits.max_guidance):
        raise BadRequest(
            f"guidance_scale must be between {limits.min_guidance:g} and {limits.max_guidance:g}",
            field="guidance_scale",
        )
    if not limits.min_seed <= seed <= limits.max_seed - (n - 1):
        raise BadRequest(
            f"seed must be between {limits.min_seed} and {limits.max_seed - (n - 1)}",
            field="seed",
        )
    scheduler_problem = limits.scheduler_problem(request.scheduler)
    if scheduler_problem is not None:
        raise BadRequest(scheduler_problem, field="scheduler")
    if request.output_format not in IMAGE_FORMATS:
        raise BadRequest(
            f"output_format must be one of {', '.join(IMAGE_FORMATS)}", field="output_format"
        )
    texts = {
        name: check_text(
            value,
            0,
            limits.max_prompt_chars,
            limits.max_prompt_bytes,
            field=name,
            empty_ok=True,
        )
        for name, value in (
            ("prompt", request.prompt),
            ("negative_prompt", request.negative_prompt),
        )
    }
    # One request per image, each of batch 1 ([1, 1] per input) and always with every input: the
    # pipeline's dynamic batcher merges concurrent requests (these n and other clients') into one
    # denoising loop, and it merges only requests that send the same inputs.
    return [
        [
            Tensor("PROMPT", np.array([[texts["prompt"]]], dtype=np.object_)),
            Tensor("NEGATIVE_PROMPT", np.array([[texts["negative_prompt"]]], dtype=np.object_)),
            Tensor("STEPS", np.array([[steps]], dtype=np.int32)),
            Tensor("GUIDANCE", np.array([[guidance]], dtype=np.float32)),
            Tensor("HEIGHT", np.array([[height]], dtype=np.int32)),
            Tensor("WIDTH", np.array([[width]], dtype=np.int32)),
            Tensor("SEED", np.array([[seed + k]], dtype=np.int64)),
            Tensor("SCHEDULER", np.array([[request.scheduler.encode()]], dtype=np.object_)),
        ]
        for k in range(n)
    ]


def image_work(request: ImageRequest) -> float:
    limits = DEFAULT_LIMITS.image_generation
    side = limits.default_side
    return generation_work(
        request.n,
        request.steps or limits.default_steps,
        request.width or side,
        request.height or side,
    )


def check_text(
    value: str,
    index: int,
    max_chars: int,
    max_bytes: int,
    *,
    field: str = "",
    empty_ok: bool = False,
) -> bytes:
    where = field or f"input.{index}"
    shown = field or f"input[{index}]"
    if not value and not empty_ok:
        raise BadRequest(f"{shown} is empty", field=where)
    if len(value) > max_chars:
        raise BadRequest(f"{shown} is {len(value)} characters; at most {max_chars}", field=where)
    try:
        data = value.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate ("\ud800") is not Unicode text
        raise BadRequest(
            f"{shown} is not valid Unicode text (a lone surrogate at character {exc.start})",
            field=where,
        ) from exc
    if len(data) > max_bytes:
        raise BadRequest(f"{shown} is {len(data)} UTF-8 bytes; at most {max_bytes}", field=where)
    return data


def check_dimensions(dimensions: int, length: int, model: str) -> None:
    """Refuse ``dimensions`` outside 1..``length`` (``length`` 0: the card does not say; checked later)."""
    if dimensions < 1 or (length and dimensions > length):
        raise BadRequest(
            f"dimensions={dimensions} is not available for model '{model}': it returns "
            f"{length or 'fixed-length'}-dimensional vectors; ask for 1 to {length or 'that many'}",
            field="dimensions",
        )


def token_row(ids: Sequence[int], index: int, max_ids: int) -> list[int]:
    if isinstance(ids, str) or not ids:
        raise BadRequest(
            f"input[{index}] must be a non-empty array of token ids (or every item a string)",
            field=f"input.{index}",
        )
    if len(ids) > max_ids:
        raise BadRequest(
            f"input[{index}] holds {len(ids)} token ids; at most {max_ids}", field=f"input.{index}"
        )
    if any(type(i) is not int or i < 0 or i > 2**62 for i in ids):
        raise BadRequest(
            f"input[{index}] must hold non-negative integer token ids", field=f"input.{index}"
        )
    return list(ids)


def embedding_tensors(
    inputs: Sequence[str] | Sequence[Sequence[int]], size: int, limits: EmbeddingLimits
) -> list[Tensor]:
    """``inputs`` checked and split into chunks of ``size``, as TEXT or TOKEN_IDS tensors."""
    if not inputs:
        raise BadRequest("input must hold at least one string or token array", field="input")
    if len(inputs) > limits.max_inputs:
        raise BadRequest(
            f"input holds {len(inputs)} items; at most {limits.max_inputs} per request",
            field="input",
        )
    if all(isinstance(item, str) for item in inputs):
        encoded = [
            check_text(item, index, limits.max_text_chars, limits.max_text_bytes)  # type: ignore[arg-type]
            for index, item in enumerate(inputs)
        ]
        return [
            Tensor("TEXT", np.array([[t] for t in encoded[i : i + size]], dtype=np.object_))
            for i in range(0, len(encoded), size)
        ]
    rows = [
        token_row(item, index, limits.max_token_ids)  # type: ignore[arg-type]
        for index, item in enumerate(inputs)
    ]
    tensors = []
    for start in range(0, len(rows), size):
        chunk = rows[start : start + size]
        padded = np.full(
            (len(chunk), max(len(r) for r in chunk)), -1, dtype=np.int64
        )  # -1: the model's padding
        for row, ids in enumerate(chunk):
            padded[row, : len(ids)] = ids
        tensors.append(Tensor("TOKEN_IDS", padded))
    return tensors


def encode_image(image: np.ndarray, output_format: str) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.asarray(image, dtype=np.uint8)).save(
        buffer, format=IMAGE_FORMATS[output_format][0]
    )
    return buffer.getvalue()
