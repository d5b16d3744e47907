"""The GPU benchmark's sanity check, before any load: the served tensor entry (and the compiled
flavour, where built) agrees with PyTorch on the spec's sample images, and ``image_classifier_gpu``
gives the CPU pipeline's top-1 on the sample JPEGs. A disagreement on the tensor entries stops the run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from loadtest.bench.gpu_setup import PIPELINE, TENSOR
from loadtest.payloads import jpeg_images
from serving.launcher import TritonServer
from serving.triton_clients import triton_client

__all__ = ["sanity", "served_in_batches"]


def served_in_batches(client: Any, model: str, images: np.ndarray, step: int) -> np.ndarray:
    """``model``'s FP32 outputs for ``images``, sent in batches of at most ``step``."""
    import tritonclient.http as http

    outputs = []
    for start in range(0, len(images), step):
        batch = images[start : start + step]
        tensor = http.InferInput("INPUT__0", list(batch.shape), "FP32")
        tensor.set_data_from_numpy(batch)
        outputs.append(client.infer(model, [tensor]).as_numpy("OUTPUT__0"))
    return np.concatenate(outputs)


def _pipeline_top1(client: Any, pipeline: str) -> list[int]:
    """``pipeline``'s top-1 class of each sample JPEG, one request each."""
    import tritonclient.http as http

    top1: list[int] = []
    for data in jpeg_images():
        image = http.InferInput("IMAGE", [1, len(data)], "UINT8")
        image.set_data_from_numpy(np.frombuffer(data, dtype=np.uint8).reshape(1, -1))
        top1.append(
            int(
                client.infer(
                    pipeline, [image], outputs=[http.InferRequestedOutput("CLASS_IDS")]
                ).as_numpy("CLASS_IDS")[0][0]
            )
        )
    return top1


def sanity(
    triton: TritonServer, compiled_entry: str = "", compiled_pipeline: str = ""
) -> dict[str, Any]:
    """Before any load: the tensor entries agree with PyTorch, the pipelines with the CPU pipeline's top-1."""

    from builders.export import torch_reference
    from builders.registry import get_spec
    from serving.image_preprocessing import preprocess_bytes

    client = triton_client(triton.http_url, network_timeout=300)
    spec = get_spec("efficientnet_lite0")
    module, _ = spec.load()  # type: ignore[union-attr]
    feeds = spec.sample_inputs()  # type: ignore[union-attr]
    images, expected = feeds["input"], torch_reference(module, spec, feeds)[0]  # type: ignore[arg-type]
    # In batches the entry takes (16 on a CPU dry run, 256 on a GPU): the samples can outnumber it.
    step = int(client.get_model_config(TENSOR)["max_batch_size"])
    got = served_in_batches(client, TENSOR, images, step)
    top1 = _pipeline_top1(client, PIPELINE)
    import torch

    with torch.inference_mode():
        cpu_top1 = (
            module(torch.from_numpy(np.stack([preprocess_bytes(d) for d in jpeg_images()])))
            .argmax(1)
            .tolist()
        )
    compiled = {}
    if compiled_entry:
        served = served_in_batches(client, compiled_entry, images, step)
        compiled = {
            "compiled_top1_agreement": float((served.argmax(1) == expected.argmax(1)).mean()),
            "compiled_max_abs_error": float(np.abs(served - expected).max()),
        }
    if compiled_pipeline:
        compiled["compiled_jpeg_top1_agreement"] = float(
            np.mean(
                [
                    a == b
                    for a, b in zip(
                        _pipeline_top1(client, compiled_pipeline), cpu_top1, strict=True
                    )
                ]
            )
        )
    report = {
        **compiled,
        "tensor_top1_agreement": float((got.argmax(1) == expected.argmax(1)).mean()),
        "tensor_max_abs_error": float(np.abs(got - expected).max()),
        "jpeg_top1": top1,
        "cpu_pipeline_top1": cpu_top1,
        "jpeg_top1_agreement": float(
            np.mean([a == b for a, b in zip(top1, cpu_top1, strict=True)])
        ),
    }
    client.close()
    if report["tensor_top1_agreement"] < 1.0 or report.get("compiled_top1_agreement", 1.0) < 1.0:
        raise RuntimeError(f"the served tensor entry disagrees with PyTorch: {report}")
    return report
