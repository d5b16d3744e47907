"""A model repository with the GPU image path: the TorchScript classifier and ``image_classifier_gpu``.

Built for real (the traced EfficientNet-Lite0, the builders' ``image_classifier_gpu`` entry). On a
machine without a GPU the entries are rewritten to ``KIND_CPU`` through the config schema, so the
same model files run on the CPU in CI; on a GPU host they stay ``KIND_GPU``.
"""

from __future__ import annotations

from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from builders.pipeline import BuildOptions, build
from builders.torchscript import TorchScriptOptions, build_torchscript, torchscript_name
from builders.triton_config import read_config, write_config

__all__ = ["CLASSIFIER", "PIPELINE", "build_gpu_repository", "cuda_available"]

CLASSIFIER = torchscript_name("efficientnet_lite0")
PIPELINE = "image_classifier_gpu"


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def build_gpu_repository(
    root: Path,
    gpu: bool,
    max_batch_size: int | None = None,
    pipeline_chunk: int | None = None,
    overlap: bool = False,
) -> Path:
    """Publish the classifier and the pipeline into ``root``; ``gpu=False`` makes both CPU entries;
    ``pipeline_chunk`` sets the pipeline's chunk size (small ones make every batch several chunks);
    ``overlap`` turns on the pipeline's overlapped way (answered from its own thread)."""
    build_torchscript(root, "efficientnet_lite0", TorchScriptOptions(gpu=gpu, precision="fp16"))
    build([PIPELINE], BuildOptions(repository=root, variants=False))
    for name in (CLASSIFIER, PIPELINE):
        path = root / name / "config.pbtxt"
        config = read_config(path)
        for group in config.instance_group:
            group.kind = mc.ModelInstanceGroup.KIND_GPU if gpu else mc.ModelInstanceGroup.KIND_CPU
        if max_batch_size is not None and name == PIPELINE:
            config.max_batch_size = max_batch_size
            del config.dynamic_batching.preferred_batch_size[:]
        if pipeline_chunk is not None and name == PIPELINE:
            config.parameters["pipeline_chunk"].string_value = str(pipeline_chunk)
        if name == PIPELINE:  # said either way: the build's default may change
            config.parameters["overlap"].string_value = "true" if overlap else "false"
        write_config(config, path)
    return root
