"""Triton Python model: encoded image bytes -> normalised CHW float tensors.

The preprocessing itself is ``image_preprocessing.py`` (``serving/image_preprocessing.py``, copied
beside this file by the build): the one definition the builders' samples and the promotion golden set
use too. Resize, crop and normalisation come from the config's parameters (``size``, ``resize``,
``mean``, ``std``), the decode limits (``max_source_pixels``, ``max_aspect_ratio``,
``max_resized_pixels``) from ``serving.limits``, written into the config at build time.

Each request carries [n, 1] encoded images and fails alone: an image the preprocessing refuses fails
its request with ``INVALID_ARG`` naming the image and the problem; anything else fails it with a
fixed message, the exception going to Triton's log only. The other requests of the batch are answered.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from builders.python_models.per_request import PerRequest
    from serving.image_preprocessing import (
        DecodeLimits,
        ImageError,
        Preprocessing,
        preprocess_bytes,
    )
else:  # Triton imports this file with its version folder, holding copies of the modules, on sys.path
    from image_preprocessing import DecodeLimits, ImageError, Preprocessing, preprocess_bytes
    from per_request import PerRequest


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils

        self.pb = pb_utils
        config = json.loads(args["model_config"])
        name = args.get("model_name", "image_preprocess")
        self.answers = PerRequest(pb_utils, name, "preprocessing", refused=(ImageError,))
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.spec = Preprocessing.from_parameters(params)
        self.limits = DecodeLimits.from_parameters(params)

    def execute(self, requests: list[Any]) -> list[Any]:
        return self.answers.answer(requests, self._outputs)

    def _outputs(self, request: Any) -> list[Any]:
        tensor = self.pb.get_input_tensor_by_name(request, "IMAGE")
        if tensor is None:
            raise ImageError("missing input 'IMAGE'")
        images = tensor.as_numpy().reshape(-1)
        if images.size == 0:
            raise ImageError("IMAGE is an empty batch")
        pixels = []
        for index, item in enumerate(images):
            try:
                pixels.append(preprocess_bytes(bytes(item), self.spec, self.limits))
            except ImageError as exc:
                where = f"image {index + 1} of {images.size}: " if images.size > 1 else ""
                raise ImageError(f"{where}{exc}") from None
        return [self.pb.Tensor("PIXELS", np.stack(pixels))]
