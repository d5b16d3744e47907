"""Triton Python model: classifier logits -> top-k labels, softmax scores and class ids."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING or __package__:  # imported from the builders package (tests)
    from builders.python_models.per_request import PerRequest
else:  # Triton's Python stub: the build puts the module beside model.py, on sys.path
    from per_request import PerRequest


def top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Softmax over the last axis and the k best classes, best first.

    Returns:
        (class ids int64 [n, k], probabilities float32 [n, k])
    """
    shifted = logits - logits.max(axis=-1, keepdims=True)
    probs = np.exp(shifted)
    probs /= probs.sum(axis=-1, keepdims=True)
    ids = np.argsort(-probs, axis=-1, kind="stable")[..., :k]
    return ids.astype(np.int64), np.take_along_axis(probs, ids, axis=-1).astype(np.float32)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils

        self.pb = pb_utils
        name = args.get("model_name", "image_postprocess")
        self.answers = PerRequest(pb_utils, name, "postprocessing", refused=())
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.k = int(params.get("top_k", 5))
        labels_path = os.path.join(args["model_repository"], args["model_version"], "labels.txt")
        with open(labels_path, encoding="utf-8") as handle:
            # Class names ship with underscores (tiger_cat); users read "tiger cat".
            self.labels = np.array(
                [line.strip().replace("_", " ") for line in handle if line.strip()], dtype=object
            )

    def execute(self, requests: list[Any]) -> list[Any]:
        return self.answers.answer(requests, self._outputs)

    def _outputs(self, request: Any) -> list[Any]:
        pb = self.pb
        logits = pb.get_input_tensor_by_name(request, "LOGITS").as_numpy()
        ids, scores = top_k(logits, self.k)
        labels = self.labels[ids].astype(np.bytes_)
        return [
            pb.Tensor("LABELS", labels.astype(np.object_)),
            pb.Tensor("SCORES", scores),
            pb.Tensor("CLASS_IDS", ids),
        ]
