"""Triton Python model: token embeddings -> one L2-normalised sentence embedding per text.

Attention-masked mean pooling followed by L2 normalisation, as sentence-transformers' ``Pooling``
(mean tokens) and ``Normalize`` modules compute it for all-MiniLM-L6-v2. Kept in float32 outside
the encoder graph: FP16 overflows in normalisation are a known pitfall, and this keeps the FP16 and
INT8 encoder variants behind the same pooling.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING or __package__:  # imported from the builders package (tests)
    from builders.python_models.per_request import PerRequest, RequestRefused
else:  # Triton's Python stub: the build puts the module beside model.py, on sys.path
    from per_request import PerRequest, RequestRefused


def mean_pool_normalize(hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """Mean of the unmasked token vectors, then unit length.

    Args:
        hidden: float [n, tokens, dim] encoder output.
        attention_mask: int [n, tokens], 1 for real tokens.

    Returns:
        float32 [n, dim].
    """
    hidden = hidden.astype(np.float32, copy=False)
    mask = attention_mask.astype(np.float32)[..., None]
    summed = (hidden * mask).sum(axis=1)
    counts = np.maximum(mask.sum(axis=1), 1e-9)
    pooled = summed / counts
    norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    return (pooled / norms).astype(np.float32)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils

        self.pb = pb_utils
        self.answers = PerRequest(pb_utils, args.get("model_name", "text_pooling"), "pooling")

    def execute(self, requests: list[Any]) -> list[Any]:
        return self.answers.answer(requests, self._outputs)

    def _outputs(self, request: Any) -> list[Any]:
        hidden = self.pb.get_input_tensor_by_name(request, "last_hidden_state").as_numpy()
        mask = self.pb.get_input_tensor_by_name(request, "attention_mask").as_numpy()
        if hidden.shape[:2] != mask.shape:
            raise RequestRefused(
                f"last_hidden_state {list(hidden.shape)} does not match attention_mask "
                f"{list(mask.shape)}"
            )
        return [self.pb.Tensor("EMBEDDING", mean_pool_normalize(hidden, mask))]
