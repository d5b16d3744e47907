"""The ``image_classifier`` ensemble: encoded image bytes -> top-5 ImageNet labels with scores.

    IMAGE (bytes) -> image_preprocess -> PIXELS -> <classifier> -> logits -> image_postprocess
                                                                 -> LABELS, SCORES, CLASS_IDS

The classifier tensors stay callable directly (``efficientnet_lite0``, ``resnet50``); this ensemble is
what an application that holds a JPEG calls.
"""

from __future__ import annotations

from pathlib import Path

from builders.spec import AssetSpec, BatchingPolicy, TensorSpec
from builders.triton_config import ensemble_config, model_config

_MODELS = Path(__file__).resolve().parent.parent / "python_models"
_LABELS = Path(__file__).resolve().parent.parent / "data" / "imagenet_classes.txt"
MAX_BATCH = 8
TOP_K = 5

IMAGE = TensorSpec("IMAGE", "bytes", (1,))
PIXELS = TensorSpec("PIXELS", "float32", (3, 224, 224))
LOGITS = TensorSpec("LOGITS", "float32", (1000,))
OUTPUTS = (
    TensorSpec("LABELS", "bytes", (TOP_K,)),
    TensorSpec("SCORES", "float32", (TOP_K,)),
    TensorSpec("CLASS_IDS", "int64", (TOP_K,)),
)


def _fmt(values: tuple[float, float, float]) -> str:
    return ",".join(str(v) for v in values)


def preprocess_spec(preprocessing: dict[str, object]) -> AssetSpec:
    config = model_config(
        "image_preprocess",
        backend="python",
        inputs=[IMAGE],
        outputs=[PIXELS],
        batching=BatchingPolicy(max_batch_size=MAX_BATCH, max_queue_delay_us=500, instance_count=2),
        parameters={
            "size": str(preprocessing["size"]),
            "resize": str(preprocessing["resize"]),
            "mean": _fmt(preprocessing["mean"]),  # type: ignore[arg-type]
            "std": _fmt(preprocessing["std"]),  # type: ignore[arg-type]
        },
        warmup=False,
    )
    return AssetSpec("image_preprocess", "python", "decode, resize, crop, normalise", config,
                     files={"model.py": _MODELS / "image_preprocess.py"})


def postprocess_spec() -> AssetSpec:
    config = model_config(
        "image_postprocess",
        backend="python",
        inputs=[LOGITS],
        outputs=list(OUTPUTS),
        batching=BatchingPolicy(max_batch_size=32, max_queue_delay_us=100),
        parameters={"top_k": str(TOP_K)},
        warmup=False,
    )
    return AssetSpec("image_postprocess", "python", "softmax, top-5 ImageNet labels", config,
                     files={"model.py": _MODELS / "image_postprocess.py", "labels.txt": _LABELS})


def classifier_spec(classifier: str = "efficientnet_lite0") -> AssetSpec:
    config = ensemble_config(
        "image_classifier",
        inputs=[IMAGE],
        outputs=list(OUTPUTS),
        max_batch_size=MAX_BATCH,
        steps=[
            ("image_preprocess", {"IMAGE": "IMAGE"}, {"PIXELS": "pixels"}),
            (classifier, {"input": "pixels"}, {"logits": "logits"}),
            ("image_postprocess", {"LOGITS": "logits"}, {n.name: n.name for n in OUTPUTS}),
        ],
    )
    return AssetSpec("image_classifier", "ensemble", f"image bytes -> top-{TOP_K} labels via {classifier}",
                     config, requires=("image_preprocess", classifier, "image_postprocess"))
