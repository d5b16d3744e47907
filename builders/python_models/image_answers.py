"""Triton responses of the GPU image classifier: top-k rows per request, or why a request failed.

Shared by both ways ``image_classifier_gpu`` runs a batch (whole, in ``execute()``; or overlapped,
answered from the pipeline's thread), so that a request gets the same answer either way. Shipped
beside the model in its version folder (the stub imports it by file name).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.utils.dlpack

__all__ = ["LABELS_NEED_NUMPY_1", "Answers"]

LABELS_NEED_NUMPY_1 = (
    "LABELS (strings) cannot be sent by this Triton's Python stub under numpy 2; ask for "
    "SCORES and CLASS_IDS (CLASS_IDS index labels.txt)"
)


class Answers:
    """Builds the responses.

    Args:
        pb_utils: the stub's ``triton_python_backend_utils`` module.
        labels: the class names, by class id.
        strings: whether this stub sends string tensors correctly (LABELS is refused where not).
    """

    def __init__(self, pb_utils: Any, labels: list[str], strings: bool) -> None:
        self.pb, self.labels, self.strings = pb_utils, labels, strings

    def error(self, message: str) -> Any:
        """A response that fails its request with ``message`` (the client's mistake: 400)."""
        return self.pb.InferenceResponse(
            error=self.pb.TritonError(message, self.pb.TritonError.INVALID_ARG)
        )

    def failure(self, message: str) -> Any:
        """A response that fails its request for the server's own reason (500)."""
        return self.pb.InferenceResponse(
            error=self.pb.TritonError(message, self.pb.TritonError.INTERNAL)
        )

    def rows(
        self,
        responses: list[Any],
        owners: list[int],
        scores: torch.Tensor,
        ids: torch.Tensor,
        wants_labels: Callable[[int], bool],
    ) -> None:
        """Fill ``responses[owner]`` for each request owning rows of ``scores`` / ``ids``.

        ``owners[r]`` is the request of output row ``r``; a request's rows are consecutive.
        ``wants_labels(owner)`` says whether that request asked for ``LABELS``.
        """
        members: dict[int, list[int]] = {}
        for row, owner in enumerate(owners):
            members.setdefault(owner, []).append(row)
        for owner, rows in members.items():
            first, last = rows[0], rows[-1] + 1
            outputs = [
                self.pb.Tensor.from_dlpack(
                    "SCORES", torch.utils.dlpack.to_dlpack(scores[first:last].contiguous())
                ),
                self.pb.Tensor.from_dlpack(
                    "CLASS_IDS", torch.utils.dlpack.to_dlpack(ids[first:last].contiguous())
                ),
            ]
            if wants_labels(owner):
                if not self.strings:
                    responses[owner] = self.error(LABELS_NEED_NUMPY_1)
                    continue
                import numpy as np  # only for strings, which have no DLPack form

                names = [[self.labels[int(c)] for c in line] for line in ids[first:last].tolist()]
                outputs.append(self.pb.Tensor("LABELS", np.array(names, dtype=np.object_)))
            responses[owner] = self.pb.InferenceResponse(output_tensors=outputs)
