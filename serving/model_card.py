"""What a model repository entry tells its clients about itself, through its Triton config ``parameters``.

The builders write these keys into every entry they publish; the gateway reads them back through
Triton's model-config API. One vocabulary for both, so neither guesses from model names:

- ``task``: what a client calls the model for (``embeddings``, ``image-generation``,
  ``classification``); absent for plain tensor models called through KServe v2.
- ``visibility``: ``internal`` for pipeline steps (tokenizers, pre/post-processing, the networks an
  ensemble or a BLS model calls); such entries are not listed to clients as models.
- ``created``: Unix time (seconds) the entry was published.
- ``embedding_dimensions``: the length of the vectors an embedding model returns.
- ``matryoshka_dimensions``: comma-separated shorter lengths the model was trained to be truncated to
  (Matryoshka representation learning); empty when it was not. The gateway shortens to any length up
  to ``embedding_dimensions`` on request; these are the lengths where that keeps the model's quality.
- ``limit_default_side``, ``limit_default_steps``: an image-generation model's own default image side
  (pixels) and denoising steps (the pipeline model writes its limits as ``limit_*``); what a request
  that names no ``size`` or ``steps`` gets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = [
    "PARAM_CREATED",
    "PARAM_DIMENSIONS",
    "PARAM_IMAGE_SIDE",
    "PARAM_IMAGE_STEPS",
    "PARAM_MATRYOSHKA",
    "PARAM_TASK",
    "PARAM_VISIBILITY",
    "ModelCard",
    "Task",
    "internal_parameters",
]

PARAM_TASK = "task"
PARAM_VISIBILITY = "visibility"
PARAM_CREATED = "created"
PARAM_DIMENSIONS = "embedding_dimensions"
PARAM_MATRYOSHKA = "matryoshka_dimensions"
PARAM_IMAGE_SIDE = "limit_default_side"
PARAM_IMAGE_STEPS = "limit_default_steps"
_INTERNAL = "internal"


class Task(StrEnum):
    """What a client calls a model for (the gateway route that serves it)."""

    EMBEDDINGS = "embeddings"
    IMAGE_GENERATION = "image-generation"
    CLASSIFICATION = "classification"


def internal_parameters() -> dict[str, str]:
    """Config ``parameters`` that mark a pipeline step (never listed to clients)."""
    return {PARAM_VISIBILITY: _INTERNAL}


@dataclass(frozen=True)
class ModelCard:
    """The client-facing facts of one entry.

    Attributes:
        name: the Triton model name.
        task: what it is called for, or ``None`` for a plain tensor model.
        internal: a pipeline step, not listed to clients.
        created: Unix time of publication (0 when the entry does not say).
        dimensions: embedding length (embedding models), else 0.
        matryoshka: shorter lengths the embedding may be truncated to (empty: none).
        image_side, image_steps: an image-generation model's default side and steps (0: not said).
    """

    name: str
    task: Task | None = None
    internal: bool = False
    created: int = 0
    dimensions: int = 0
    matryoshka: tuple[int, ...] = field(default_factory=tuple)
    image_side: int = 0
    image_steps: int = 0

    def parameters(self) -> dict[str, str]:
        """The config ``parameters`` that describe this card (what the builders write)."""
        params: dict[str, str] = {}
        if self.task is not None:
            params[PARAM_TASK] = self.task.value
        if self.internal:
            params[PARAM_VISIBILITY] = _INTERNAL
        if self.created:
            params[PARAM_CREATED] = str(self.created)
        if self.dimensions:
            params[PARAM_DIMENSIONS] = str(self.dimensions)
            params[PARAM_MATRYOSHKA] = ",".join(str(d) for d in self.matryoshka)
        if self.image_side:
            params[PARAM_IMAGE_SIDE] = str(self.image_side)
        if self.image_steps:
            params[PARAM_IMAGE_STEPS] = str(self.image_steps)
        return params

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelCard:
        """The card of a model config as Triton's HTTP or gRPC JSON shows it.

        Unknown or malformed values read as absent: an entry written by hand still loads and is
        served as a plain tensor model.
        """
        raw = config.get("parameters") or {}
        params = {
            str(k): str(v.get("string_value", "")) if isinstance(v, Mapping) else str(v)
            for k, v in raw.items()
        }
        task: Task | None
        try:
            task = Task(params.get(PARAM_TASK, ""))
        except ValueError:
            task = None
        return cls(
            name=str(config.get("name", "")),
            task=task,
            internal=params.get(PARAM_VISIBILITY, "").strip().lower() == _INTERNAL,
            created=_int(params.get(PARAM_CREATED, "")),
            dimensions=_int(params.get(PARAM_DIMENSIONS, "")),
            matryoshka=tuple(
                sorted(
                    {
                        d
                        for d in (_int(p) for p in params.get(PARAM_MATRYOSHKA, "").split(","))
                        if d > 0
                    }
                )
            ),
            image_side=_int(params.get(PARAM_IMAGE_SIDE, "")),
            image_steps=_int(params.get(PARAM_IMAGE_STEPS, "")),
        )

    def allows_dimensions(self, dimensions: int) -> bool:
        """Whether ``dimensions`` is a length this model was trained to give (its own, or a
        Matryoshka one)."""
        return dimensions == self.dimensions or dimensions in self.matryoshka


def _int(text: str) -> int:
    text = text.strip()
    return int(text) if text.isdigit() else 0
