"""Triton Python model: token embeddings -> one L2-normalised sentence embedding per text.

Attention-masked mean pooling followed by L2 normalisation, as sentence-transformers' ``Pooling``
(mean tokens) and ``Normalize`` modules compute it for all-MiniLM-L6-v2. Kept in float32 outside
the encoder graph: FP16 overflows in normalisation are a known pitfall, and this keeps the FP16 and
INT8 encoder variants behind the same pooling.
"""

from __future__ import annotations

from typing import Any

import numpy as np


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

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._answer(request) for request in requests]

    def _answer(self, request: Any) -> Any:
        """One request's embeddings; any failure fails this request only, without internals."""
        pb = self.pb
        try:
            hidden = pb.get_input_tensor_by_name(request, "last_hidden_state").as_numpy()
            mask = pb.get_input_tensor_by_name(request, "attention_mask").as_numpy()
            if hidden.shape[:2] != mask.shape:
                return pb.InferenceResponse(
                    error=pb.TritonError(
                        f"last_hidden_state {list(hidden.shape)} does not match attention_mask "
                        f"{list(mask.shape)}",
                        pb.TritonError.INVALID_ARG,
                    )
                )
            return pb.InferenceResponse([pb.Tensor("EMBEDDING", mean_pool_normalize(hidden, mask))])
        except Exception as exc:
            pb.Logger.log_error(f"model 'text_pooling': {type(exc).__name__}: {exc}"[:400])
            return pb.InferenceResponse(
                error=pb.TritonError(
                    "model 'text_pooling' could not process this request (the server log has the details)",
                    pb.TritonError.INTERNAL,
                )
            )
