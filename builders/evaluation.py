"""How a model family is judged when a new version of it is promoted: held-out inputs and a comparison.

Promotion compares a candidate with the version in production on the same inputs, through Triton,
and the comparison depends on what the model is for:

- :class:`ClassAgreement` (classifiers): top-1 and top-5 agreement with production on the golden
  photographs (held out from calibration), and accuracy where a photograph has a known answer;
- :class:`EmbeddingCosine` (encoders): cosine between the candidate's and production's sentence
  embeddings on held-out sentences: a new version must keep the vector space clients have indexed;
- :class:`OutputParity` (generative networks): PSNR of the candidate's output against production's
  on inputs drawn from a fixed seed (pixels, for a decoder; noise predictions, for a UNet).

A :class:`builders.spec.ModelSpec` says which through :meth:`~builders.spec.ModelSpec.evaluation`;
the promoter (``promote``) runs it. This module only describes; it calls nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from serving.image_preprocessing import Preprocessing

__all__ = ["ClassAgreement", "EmbeddingCosine", "Evaluation", "Metric", "OutputParity"]


@dataclass(frozen=True, kw_only=True)
class ClassAgreement:
    """Classifiers, judged on the golden photographs.

    Attributes:
        output: the logits output.
        min_top1: share of photographs whose top-1 class equals production's.
        min_top5: share of photographs whose production top-1 class is in the candidate's top 5.
        max_accuracy_drop: on labelled photographs, how far below production's accuracy the
            candidate may be.
    """

    output: str
    min_top1: float = 0.9
    min_top5: float = 1.0
    max_accuracy_drop: float = 0.0


@dataclass(frozen=True, kw_only=True)
class EmbeddingCosine:
    """Encoders: the cosine between candidate and production embeddings of each held-out input.

    Attributes:
        output: the embedding output (or token embeddings, mean-pooled over ``mask``).
        mask: the input masking padded tokens, when ``output`` holds one vector per token.
        min_cosine: the lowest cosine any input may have.
    """

    output: str
    mask: str | None = None
    min_cosine: float = 0.999


@dataclass(frozen=True, kw_only=True)
class OutputParity:
    """Generative networks at a fixed seed: PSNR (dB) of the candidate's output, production's as the signal.

    Attributes:
        output: the output compared.
        min_psnr_db: the lowest PSNR, over the whole batch, that passes (40 dB: differences at the
            level of FP16 rounding; an 8-bit image that differs by one level everywhere has 48 dB).
    """

    output: str
    min_psnr_db: float = 40.0


Metric = ClassAgreement | EmbeddingCosine | OutputParity


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """What a promotion sends to both versions and how it compares their answers.

    Attributes:
        metric: the comparison.
        inputs: a batch of held-out inputs, by input name (batch axis first).
        photos: image classifiers: the golden photographs preprocessed this way are the batch of
            ``photo_input`` (the set is shared with the precision checks, see ``promote.golden``).
        photo_input: the input the photographs go to.
    """

    metric: Metric
    inputs: Mapping[str, np.ndarray] = field(default_factory=lambda: MappingProxyType({}))
    photos: Preprocessing | None = None
    photo_input: str = "input"
