"""Real sample inputs shipped by PyPI packages (no downloads): parity checks and INT8 calibration."""

from __future__ import annotations

from functools import cache

import numpy as np
from PIL import Image

from builders.python_models.image_preprocess import preprocess

__all__ = ["SAMPLE_IMAGES", "sample_images", "image_batch"]

#: colour photographs in ``skimage.data``; each also contributes its mirror image
SAMPLE_IMAGES = ("chelsea", "coffee", "astronaut", "rocket", "immunohistochemistry", "cat")


@cache
def sample_images() -> tuple[Image.Image, ...]:
    from skimage import data

    images = []
    for name in SAMPLE_IMAGES:
        loader = getattr(data, name, None)
        if loader is None:
            continue
        array = loader()
        if array.ndim == 3 and array.shape[2] >= 3:
            images.append(Image.fromarray(np.ascontiguousarray(array[..., :3])))
    return tuple(images)


def image_batch(
    size: int = 224,
    resize: int = 256,
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5),
    std: tuple[float, float, float] = (0.5, 0.5, 0.5),
    mirrored: bool = True,
) -> np.ndarray:
    """The sample photographs preprocessed exactly as the serving ensemble does, [n, 3, size, size]."""
    images = list(sample_images())
    if mirrored:
        images += [img.transpose(Image.Transpose.FLIP_LEFT_RIGHT) for img in images]
    return np.stack([preprocess(img, size=size, resize=resize, mean=mean, std=std) for img in images])
