"""ResNet-50 (the standard architecture, via ``transformers``; torchvision does not import here).

Weights come from a local file or checkpoint folder the user names (``RESNET50_WEIGHTS`` or
``inferctl build --weights resnet50=PATH``); without one the model is randomly initialised with a
fixed seed and the build report says so: such a model serves and batches like the real one but its
labels mean nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from builders.errors import MissingInputError
from builders.evaluation import ClassAgreement, Evaluation
from builders.export import select_output
from builders.report import file_sha256
from builders.samples import WHOLE, image_batch, image_sample_sources
from builders.spec import BatchingPolicy, ModelSpec, TensorSpec, Tolerance, WeightsInfo
from serving.image_preprocessing import Preprocessing

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
WEIGHTS_ENV = "RESNET50_WEIGHTS"


def _config():  # type: ignore[no-untyped-def]
    from transformers import ResNetConfig

    # ResNetConfig's defaults are ResNet-50 v1.5; num_labels goes through PretrainedConfig's **kwargs.
    return ResNetConfig(num_labels=1000)  # type: ignore[call-arg]


class ResNet50(ModelSpec):
    name = "resnet50"
    family = "image-classification"
    description = (
        "ResNet-50 v1.5 (transformers ResNetForImageClassification), weights from a local file"
    )
    inputs = (TensorSpec("input", "float32", (3, 224, 224)),)
    outputs = (TensorSpec("logits", "float32", (1000,)),)
    # 4 GFLOPs a sample: batches past 8 add latency faster than throughput on a CPU.
    batching = BatchingPolicy(
        max_batch_size=16, preferred_batch_sizes=(4, 8), max_queue_delay_us=5000
    )
    tolerance = Tolerance(max_abs_error=1e-2, min_cosine=0.9999, min_top1_agreement=1.0)
    class_output = "logits"
    preprocessing = Preprocessing(size=224, resize=256, mean=IMAGENET_MEAN, std=IMAGENET_STD)

    def __init__(self, weights: str | os.PathLike[str] | None = None) -> None:
        self.weights = (
            Path(weights)
            if weights
            else (Path(os.environ[WEIGHTS_ENV]) if os.environ.get(WEIGHTS_ENV) else None)
        )

    def load(self):  # type: ignore[no-untyped-def]
        import torch
        from transformers import ResNetForImageClassification

        if self.weights is None:
            torch.manual_seed(0)
            model = ResNetForImageClassification(_config()).eval()
            info = WeightsInfo(
                source="random-init",
                pretrained=False,
                note=f"no weights given (set {WEIGHTS_ENV}); labels are meaningless",
            )
        elif not self.weights.exists():
            raise MissingInputError(f"resnet50 weights not found: {self.weights}")
        elif self.weights.is_dir():
            model = ResNetForImageClassification.from_pretrained(
                str(self.weights), local_files_only=True
            ).eval()
            info = WeightsInfo(
                source=f"file:{self.weights}", pretrained=True, path=str(self.weights)
            )
        else:
            model = ResNetForImageClassification(_config()).eval()
            state = torch.load(self.weights, map_location="cpu", weights_only=True)
            model.load_state_dict(
                state.get("state_dict", state) if isinstance(state, dict) else state
            )
            info = WeightsInfo(
                source=f"file:{self.weights}",
                pretrained=True,
                path=str(self.weights),
                sha256=file_sha256(self.weights),
            )
        return select_output(model, "logits", ["pixel_values"]), info

    def sample_inputs(self) -> dict[str, np.ndarray]:
        return {"input": image_batch(self.preprocessing, WHOLE)}

    def evaluation(self) -> Evaluation:
        return Evaluation(metric=ClassAgreement(output="logits"), photos=self.preprocessing)

    def source_files(self) -> list[Path]:
        return [*super().source_files(), *image_sample_sources()]

    def model_parameters(self) -> dict[str, str]:
        return {"intra_op_thread_count": "0", "inter_op_thread_count": "1"}
