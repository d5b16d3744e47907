"""The TorchScript EfficientNet-Lite0 entry the ``pytorch`` backend tests serve (CPU and GPU), and the
requests they send it."""

from __future__ import annotations

import numpy as np
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from builders.torchscript import torchscript_name

__all__ = ["MODEL", "infer", "infer_in_batches", "infer_wrong_shape"]

MODEL = torchscript_name("efficientnet_lite0")


def infer(url: str, batch: np.ndarray) -> np.ndarray:
    """The entry's logits for ``batch`` (N x 3 x 224 x 224 FP32)."""
    tensor = http.InferInput("INPUT__0", list(batch.shape), "FP32")
    tensor.set_data_from_numpy(batch)
    with http.InferenceServerClient(url) as client:
        return client.infer(MODEL, [tensor]).as_numpy("OUTPUT__0")


def infer_in_batches(url: str, images: np.ndarray, max_batch_size: int) -> np.ndarray:
    """The entry's logits for every image, sent ``max_batch_size`` at a time (Triton refuses larger
    requests; the sample set holds more photographs than one batch)."""
    return np.concatenate(
        [infer(url, images[i : i + max_batch_size]) for i in range(0, len(images), max_batch_size)]
    )


def infer_wrong_shape(url: str) -> str:
    """Send a 112 x 112 image the entry cannot take; the error Triton answers with.

    Raises:
        AssertionError: the request was answered instead of refused.
    """
    bad = http.InferInput("INPUT__0", [1, 3, 112, 112], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 3, 112, 112), dtype=np.float32))
    try:
        with http.InferenceServerClient(url) as client:
            client.infer(MODEL, [bad])
    except InferenceServerException as exc:
        return str(exc)
    raise AssertionError("a 112x112 input was answered; the entry takes 224x224")
