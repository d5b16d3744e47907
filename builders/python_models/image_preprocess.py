"""Triton Python model: encoded image bytes -> a normalised CHW float tensor.

The same ``preprocess`` function prepares the builders' parity and calibration samples, so what
the classifier is verified on is exactly what it sees in production. Resize, crop and
normalisation come from the model config's parameters (``size``, ``resize``, ``mean``, ``std``).
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

# Decompression-bomb guard: refuse anything larger than ~50 megapixels before decoding it.
MAX_PIXELS = 50_000_000


def preprocess(
    image: Image.Image | bytes,
    size: int = 224,
    resize: int = 256,
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5),
    std: tuple[float, float, float] = (0.5, 0.5, 0.5),
) -> np.ndarray:
    """Decode (if bytes), resize the short side to ``resize``, centre-crop ``size``, normalise.

    Returns:
        float32 array of shape (3, size, size).

    Raises:
        ValueError: the bytes are not an image PIL can decode.
    """
    if isinstance(image, bytes | bytearray):
        try:
            image = Image.open(io.BytesIO(image))
            if image.width * image.height > MAX_PIXELS:
                raise ValueError(f"image of {image.width}x{image.height} pixels is too large")
            image.load()
        except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
            raise ValueError(f"input is not a decodable image (JPEG/PNG/...): {exc}") from exc
    image = image.convert("RGB")
    scale = resize / min(image.width, image.height)
    image = image.resize((max(size, round(image.width * scale)), max(size, round(image.height * scale))),
                         Image.Resampling.BILINEAR)
    left, top = (image.width - size) // 2, (image.height - size) // 2
    image = image.crop((left, top, left + size, top + size))
    array = np.asarray(image, dtype=np.float32) / 255.0
    array = (array - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    return np.ascontiguousarray(array.transpose(2, 0, 1))


def _floats(raw: str) -> tuple[float, float, float]:
    a, b, c = (float(v) for v in raw.split(","))
    return a, b, c


class TritonPythonModel:
    """Batched: each request carries [n, 1] encoded images; a bad image fails only its request."""

    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils

        self.pb = pb_utils
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"]).get("parameters", {}).items()}
        self.options: dict[str, Any] = {
            "size": int(params.get("size", 224)),
            "resize": int(params.get("resize", 256)),
            "mean": _floats(params.get("mean", "0.5,0.5,0.5")),
            "std": _floats(params.get("std", "0.5,0.5,0.5")),
        }

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                images = self.pb.get_input_tensor_by_name(request, "IMAGE").as_numpy().reshape(-1)
                if images.size == 0:
                    raise ValueError("IMAGE is an empty batch")
                batch = np.stack([preprocess(bytes(item), **self.options) for item in images])
                responses.append(self.pb.InferenceResponse([self.pb.Tensor("PIXELS", batch)]))
            except ValueError as exc:
                responses.append(self.pb.InferenceResponse(error=self.pb.TritonError(str(exc), self.pb.TritonError.INVALID_ARG)))
        return responses
