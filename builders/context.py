"""One model's build, as the steps after the export see it: one object instead of parameter chains.

The pipeline makes a :class:`BuildContext` per PyTorch model once its FP32 ONNX is verified; the
precision variants and engines (:mod:`builders.variants`) read everything from it. It also knows the
host the repository is for, so every ONNX entry (FP32 or variant) gets the same serving config.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from builders.engine import EngineOptions
from builders.report import BuildReport
from builders.spec import ModelSpec
from builders.triton_config import spec_config, tensorrt_accelerator

__all__ = ["BuildContext", "GroundTruth", "onnx_entry_config"]


def _quiet(message: str) -> None:
    del message


@dataclass(frozen=True)
class GroundTruth:
    """The spec's real inputs and its PyTorch module's outputs on them, computed before any
    conversion: what every artifact of the model is checked against.

    Attributes:
        feeds: the spec's real sample inputs: parity data and INT8 calibration set.
        reference: PyTorch outputs on ``feeds``.
        held_out: real inputs no calibration sees (the spec's ``held_out_inputs``), or None.
        held_out_reference: PyTorch outputs on ``held_out``.
    """

    feeds: Mapping[str, np.ndarray]
    reference: Sequence[np.ndarray]
    held_out: Mapping[str, np.ndarray] | None = None
    held_out_reference: Sequence[np.ndarray] | None = None


@dataclass(frozen=True)
class BuildContext:
    """Everything the variant and engine steps of one model's build need.

    Attributes:
        spec: the model.
        repository: where entries are published (and current ones are looked up).
        workdir: scratch space for this build; removed afterwards.
        parent: the FP32 entry's report (version, weights, parity), built now or already current.
        parent_hash: the FP32 entry's input hash; variants and engines derive theirs from it.
        fp32_onnx: the verified FP32 ONNX the variants are converted from.
        truth: the inputs and PyTorch outputs every variant is checked against.
        force: rebuild entries even when current.
        engines: build TensorRT engines too, with these options; None skips them.
        gpu: the repository is for a GPU host (ONNX entries get GPU instances and TensorRT acceleration).
        native_backends: the repository is for Triton's native backends (no ragged inputs).
        status: progress messages; notify: messages for the user (engines skipped, ...).
    """

    spec: ModelSpec
    repository: Path
    workdir: Path
    parent: BuildReport
    parent_hash: str
    fp32_onnx: Path
    truth: GroundTruth
    force: bool = False
    engines: EngineOptions | None = None
    gpu: bool = False
    native_backends: bool = False
    status: Callable[[str], None] = _quiet
    notify: Callable[[str], None] = _quiet


def onnx_entry_config(
    spec: ModelSpec, name: str, precision: str, *, gpu: bool, ragged: bool = True
) -> mc.ModelConfig:
    """The ``onnxruntime_onnx`` config of ``name`` (``spec``'s FP32 entry or one of its variants).

    On a GPU host the entry runs in ``KIND_GPU`` instances with the TensorRT execution accelerator,
    as Triton's native onnxruntime backend reads it (the Python-based one reads it the same way). An
    INT8 (Q/DQ) entry gets the CUDA provider only: the TensorRT provider's INT8 path is not verified.
    ``ragged``: the spec's ``ragged_inputs`` get ``allow_ragged_batch`` (not for native backends).
    """
    config = spec_config(
        spec,
        name,
        platform="onnxruntime_onnx",
        filename="model.onnx",
        gpu=gpu,
        parameters=spec.model_parameters(),
    )
    for message in config.input:
        message.allow_ragged_batch = ragged and message.name in spec.ragged_inputs
    if gpu and precision in ("fp32", "fp16"):
        tensorrt_accelerator(config, precision_mode=precision.upper())
    return config
