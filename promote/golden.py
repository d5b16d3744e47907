"""The golden set: real photographs with the ImageNet classes a correct classifier must put on top."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from builders.python_models.image_preprocess import preprocess
from builders.samples import SAMPLE_IMAGES

__all__ = ["GoldenItem", "golden_set"]

#: skimage photograph -> acceptable top-1 ImageNet classes (verified with the pretrained EfficientNet-Lite0)
_LABELS: dict[str, frozenset[int]] = {
    "chelsea": frozenset(range(281, 286)),  # tabby, tiger cat, Persian, Siamese, Egyptian cat
    "coffee": frozenset({504, 550, 967, 968}),  # coffee mug, espresso maker, espresso, cup
    "cat": frozenset(range(281, 286)),
}


@dataclass(frozen=True)
class GoldenItem:
    name: str
    pixels: np.ndarray  # [3, 224, 224] float32
    accepted: frozenset[int] | None  # None: unlabelled, used for agreement only


def golden_set(preprocessing: dict[str, object]) -> list[GoldenItem]:
    """Every sample photograph and its mirror image, preprocessed for the model under test."""
    from skimage import data

    items = []
    by_name = {}
    for name in SAMPLE_IMAGES:
        loader = getattr(data, name, None)
        if loader is not None:
            array = loader()
            if array.ndim == 3:
                by_name[name] = Image.fromarray(np.ascontiguousarray(array[..., :3]))
    for name, image in by_name.items():
        for suffix, variant in (("", image), ("-mirrored", image.transpose(Image.Transpose.FLIP_LEFT_RIGHT))):
            pixels = preprocess(variant, **preprocessing)  # type: ignore[arg-type]
            items.append(GoldenItem(name + suffix, pixels, _LABELS.get(name)))
    return items
