"""The ``image_classifier`` ensemble: encoded image bytes -> top-5 ImageNet labels with scores.

    IMAGE (bytes) -> image_preprocess -> PIXELS -> <classifier> -> logits -> image_postprocess
                                                                 -> LABELS, SCORES, CLASS_IDS

The classifier tensors stay callable directly (``efficientnet_lite0``, ``resnet50``); this ensemble is
what an application that holds a JPEG calls.
"""

from __future__ import annotations

from pathlib import Path

from builders.spec import AssetSpec, BatchingPolicy, TensorSpec
from builders.triton_config import ConfigOptions, ensemble_config, model_config
from serving import image_preprocessing
from serving.image_preprocessing import Preprocessing
from serving.limits import DEFAULT_LIMITS
from serving.model_card import ModelCard, Task, internal_parameters

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


def preprocess_spec(preprocessing: Preprocessing) -> AssetSpec:
    """The ``image_preprocess`` entry: its model file with the shared preprocessing module beside it,
    the preprocessing and the platform's decode limits (``serving.limits``) in its parameters."""
    decode = DEFAULT_LIMITS.image_decode
    config = model_config(
        "image_preprocess",
        inputs=[IMAGE],
        outputs=[PIXELS],
        batching=BatchingPolicy(max_batch_size=MAX_BATCH, max_queue_delay_us=500, instance_count=2),
        options=ConfigOptions(
            backend="python",
            parameters={
                **preprocessing.parameters(),
                **decode.parameters(),
                **internal_parameters(),
            },
            warmup=False,
        ),
    )
    return AssetSpec(
        "image_preprocess",
        "python",
        "decode, resize, crop, normalise",
        config,
        files={
            "model.py": _MODELS / "image_preprocess.py",
            "per_request.py": _MODELS / "per_request.py",
            "image_preprocessing.py": Path(image_preprocessing.__file__),
        },
    )


def postprocess_spec() -> AssetSpec:
    config = model_config(
        "image_postprocess",
        inputs=[LOGITS],
        outputs=list(OUTPUTS),
        batching=BatchingPolicy(max_batch_size=32, max_queue_delay_us=100),
        options=ConfigOptions(
            backend="python",
            parameters={"top_k": str(TOP_K), **internal_parameters()},
            warmup=False,
        ),
    )
    return AssetSpec(
        "image_postprocess",
        "python",
        "softmax, top-5 ImageNet labels",
        config,
        files={
            "model.py": _MODELS / "image_postprocess.py",
            "per_request.py": _MODELS / "per_request.py",
            "labels.txt": _LABELS,
        },
    )


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
    for key, value in ModelCard("image_classifier", task=Task.CLASSIFICATION).parameters().items():
        config.parameters[key].string_value = value
    return AssetSpec(
        "image_classifier",
        "ensemble",
        f"image bytes -> top-{TOP_K} labels via {classifier}",
        config,
        requires=("image_preprocess", classifier, "image_postprocess"),
    )


# -- the GPU flavour ------------------------------------------------------------------------------

_SERVING = Path(__file__).resolve().parents[2] / "serving"
#: one encoded image per row (UINT8, ragged): strings cannot cross the embedded Triton's Python stub
#: under numpy 2, numeric tensors cross it by DLPack (see python_models/image_classifier_gpu.py)
IMAGE_BYTES = TensorSpec("IMAGE", "uint8", (-1,))
GPU_CLASSIFIER = "efficientnet_lite0_torchscript"
#: starting values, not yet chosen by a sweep: ``python -m loadtest.bench.gpu`` measures instance
#: count x queue delay x preferred sizes on the serving GPU and writes its choice into the build report.
#: The delay is about half an execution of 32 images: at 5,000 images/s and P99 <= 20 ms a batch is a
#: few dozen images every few ms.
GPU_BATCHING = BatchingPolicy(
    max_batch_size=128, preferred_batch_sizes=(32, 64, 128), max_queue_delay_us=1000
)


def gpu_classifier_spec(
    preprocessing: Preprocessing,
    classifier: str = GPU_CLASSIFIER,
    batching: BatchingPolicy = GPU_BATCHING,
) -> AssetSpec:
    """``image_classifier_gpu``: encoded images -> top-5, decoded, resized and classified on the GPU
    in one Python model (a captured CUDA graph per batch size). ``classifier`` names the TorchScript
    (or AOTInductor) entry of the same repository whose newest version it runs."""
    from serving.limits import DEFAULT_LIMITS

    limits = DEFAULT_LIMITS.image_decode
    config = model_config(
        "image_classifier_gpu",
        inputs=[IMAGE_BYTES],
        outputs=list(OUTPUTS),
        batching=batching,
        options=ConfigOptions(
            backend="python",
            parameters={
                "classifier": classifier,
                **preprocessing.parameters(),
                "top_k": str(TOP_K),
                "max_source_pixels": str(limits.max_source_pixels),
                "max_aspect_ratio": str(limits.max_aspect_ratio),
                "max_resized_pixels": str(limits.max_resized_pixels),
            },
            gpu=True,
            warmup=False,
        ),
    )
    config.input[0].allow_ragged_batch = True
    for key, value in (
        ModelCard("image_classifier_gpu", task=Task.CLASSIFICATION).parameters().items()
    ):
        config.parameters[key].string_value = value
    files = {
        "model.py": _MODELS / "image_classifier_gpu.py",
        "batch_runner.py": _SERVING / "backends" / "pytorch" / "batch_runner.py",
        "torch_module.py": _SERVING / "backends" / "pytorch" / "torch_module.py",
        "gpu_images.py": _SERVING / "gpu_images.py",
        "gpu_overlap.py": _SERVING / "gpu_overlap.py",
        "gpu_stream.py": _SERVING / "gpu_stream.py",
        "image_answers.py": _MODELS / "image_answers.py",
        "image_stream_execute.py": _MODELS / "image_stream_execute.py",
        "step_metrics.py": _SERVING / "step_metrics.py",
        "image_preprocessing.py": Path(image_preprocessing.__file__),
        "labels.txt": _LABELS,
    }
    return AssetSpec(
        "image_classifier_gpu",
        "python",
        f"image bytes -> top-{TOP_K} on the GPU (nvJPEG, resize, {classifier} as CUDA graphs)",
        config,
        files=files,
    )
