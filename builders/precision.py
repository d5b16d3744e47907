"""FP32 ONNX -> FP16 ONNX (graph conversion) and INT8 ONNX (explicit Q/DQ from static calibration).

Both keep the model's interface: inputs and outputs stay FP32 (FP16 via ``keep_io_types``, INT8 because
Q/DQ pairs sit inside the graph), so a variant drops into the same Triton config, ensemble or gateway
route as its FP32 parent. Precision lives in the graph, which is what a strongly typed TensorRT
network reads.

    convert("fp16", Path("model.onnx"), Path("model_fp16.onnx"), feeds)
    convert("int8", src, dst, spec.sample_inputs(), int8=Int8Options(method="entropy"))

The conversions live in :mod:`builders.precision_fp16` and :mod:`builders.precision_int8`; this
module names the precisions and picks one. Nothing here knows model families; callers hand in real
calibration samples.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from builders.errors import PrecisionError
from builders.precision_fp16 import DEFAULT_FP32_OPS, Fp16Options, to_fp16
from builders.precision_int8 import CALIBRATION_METHODS, CalibrationReader, Int8Options, to_int8

__all__ = [
    "CALIBRATION_METHODS",
    "DEFAULT_FP16",
    "DEFAULT_FP32_OPS",
    "DEFAULT_INT8",
    "PRECISIONS",
    "CalibrationReader",
    "Fp16Options",
    "Int8Options",
    "PrecisionError",
    "PrecisionResult",
    "convert",
    "to_fp16",
    "to_int8",
]

#: the precisions a spec may declare in ``variants``
PRECISIONS = ("fp16", "int8")

DEFAULT_FP16 = Fp16Options()
DEFAULT_INT8 = Int8Options()


@dataclass(frozen=True)
class PrecisionResult:
    path: Path
    precision: str
    seconds: float


def convert(
    precision: str,
    src: Path,
    dst: Path,
    calibration: Mapping[str, np.ndarray],
    *,
    fp16: Fp16Options = DEFAULT_FP16,
    int8: Int8Options = DEFAULT_INT8,
) -> PrecisionResult:
    """Produce the ``precision`` variant of ``src`` at ``dst``.

    Args:
        calibration: input name -> real samples, batched on axis 0 (INT8 calibrates on them).
        fp16: how an FP16 variant is converted.
        int8: how an INT8 variant is quantized and calibrated.

    Raises:
        PrecisionError: an unknown precision, or the conversion failed.
    """
    started = time.perf_counter()
    if precision == "fp16":
        to_fp16(src, dst, fp16)
    elif precision == "int8":
        to_int8(src, dst, calibration, int8)
    else:
        raise PrecisionError(f"unknown precision '{precision}'; known: {', '.join(PRECISIONS)}")
    return PrecisionResult(path=dst, precision=precision, seconds=time.perf_counter() - started)
