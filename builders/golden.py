"""The golden set: the held-out photographs, preprocessed for a model, with the classes accepted as top-1.

A precision variant is judged on it when it is built (:mod:`builders.variants`) and a candidate version
when it is promoted (``promote``): photographs no calibration has seen
(:data:`builders.photos.HELD_OUT_PHOTOS`), whole and untouched, preprocessed by the one definition
the serving ensemble uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from builders.photos import HELD_OUT_PHOTOS
from serving.image_preprocessing import Preprocessing, preprocess

__all__ = ["GoldenItem", "golden_set", "held_out_batch"]


@dataclass(frozen=True)
class GoldenItem:
    name: str
    pixels: np.ndarray  # [3, size, size] float32
    accepted: frozenset[int] | None  # None: unlabelled, used for agreement only


def golden_set(preprocessing: Preprocessing | None = None) -> list[GoldenItem]:
    """Every held-out photograph, preprocessed for the model under test (the default preprocessing
    if None)."""
    spec = preprocessing or Preprocessing()
    return [
        GoldenItem(photo.name, preprocess(photo.load(), spec), photo.labels or None)
        for photo in HELD_OUT_PHOTOS
    ]


def held_out_batch(preprocessing: Preprocessing) -> np.ndarray:
    """The held-out photographs as one batch, [n, 3, size, size] float32."""
    return np.stack([item.pixels for item in golden_set(preprocessing)])
