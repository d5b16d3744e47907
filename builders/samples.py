"""Real sample inputs shipped by PyPI packages (no downloads): parity checks and INT8 calibration.

Image models calibrate and check parity on the calibration photographs of :mod:`builders.photos` and
their deterministic crops and mirror images; the held-out photographs (:mod:`builders.golden`) are
kept for judging what calibration produced.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
from PIL import Image

from builders import golden
from builders.photos import (
    CALIBRATION_PHOTOS,
    CALIBRATION_VIEWS,
    View,
    calibration_views,
    photo_files,
)
from serving import image_preprocessing
from serving.image_preprocessing import Preprocessing, preprocess

__all__ = ["WHOLE", "image_batch", "image_sample_sources", "sample_images"]

#: each calibration photograph once, whole (for models too slow to calibrate on every view)
WHOLE: tuple[View, ...] = (CALIBRATION_VIEWS[0],)


def image_sample_sources() -> tuple[Path, ...]:
    """The files an image model's samples are made of: a change to any is a change to its build."""
    return (
        Path(__file__),
        Path(golden.__file__),
        Path(image_preprocessing.__file__),
        *photo_files(),
    )


@cache
def sample_images() -> tuple[Image.Image, ...]:
    """The calibration photographs, whole (RGB)."""
    return tuple(photo.load() for photo in CALIBRATION_PHOTOS)


def image_batch(spec: Preprocessing, views: tuple[View, ...] = CALIBRATION_VIEWS) -> np.ndarray:
    """The calibration photographs under ``views``, preprocessed exactly as the serving ensemble does,
    [n, 3, size, size]."""
    return np.stack([preprocess(image, spec) for _, image in calibration_views(views)])
