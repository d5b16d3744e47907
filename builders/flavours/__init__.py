"""The one build path and its flavours: the ways a PyTorch model is served.

    builders.flavours.base         the Flavour interface and what its steps pass (Loaded, Artifact)
    builders.flavours.walk         build_model: the steps, walked in order (and build_asset)
    builders.flavours.onnx         ONNX entry -> FP16/INT8 variants -> TensorRT engines
    builders.flavours.torchscript  torch.jit.trace -> pytorch_libtorch entry
    builders.flavours.compiled     torch.export -> Inductor / AOTInductor entry

Families declare specs only (:mod:`builders.spec`); a flavour knows no family.
"""

from __future__ import annotations

from builders.flavours.base import Artifact, BuildRun, Flavour, Loaded
from builders.flavours.walk import build_asset, build_model

__all__ = ["Artifact", "BuildRun", "Flavour", "Loaded", "build_asset", "build_model"]
