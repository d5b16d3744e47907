"""FP32 ONNX -> FP16 ONNX (graph conversion) and INT8 ONNX (explicit Q/DQ from static calibration).

Both keep the model's interface: inputs and outputs stay FP32 (FP16 via ``keep_io_types``, INT8 because
Q/DQ pairs sit inside the graph), so a variant drops into the same Triton config, ensemble or gateway
route as its FP32 parent. Precision lives in the graph, which is what a strongly typed TensorRT
network reads.

    to_fp16(Path("model.onnx"), Path("model_fp16.onnx"))
    to_int8(Path("model.onnx"), Path("model_int8.onnx"), spec.sample_inputs())

Nothing here knows model families; callers hand in real calibration samples.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from builders.errors import BuildError

__all__ = [
    "DEFAULT_FP32_OPS",
    "PRECISIONS",
    "CalibrationReader",
    "PrecisionError",
    "PrecisionResult",
    "convert",
    "to_fp16",
    "to_int8",
]

#: the precisions a spec may declare in ``variants``
PRECISIONS = ("fp16", "int8")

#: ops kept in FP32 when converting to FP16: normalisations, powers and reductions overflow or lose
#: their sums in half precision (the LayerNorm/Pow/L2-normalise overflow seen in transformers), and
#: onnxconverter-common's own list of ops without FP16 kernels in ONNX Runtime.
DEFAULT_FP32_OPS: tuple[str, ...] = (
    "LayerNormalization",
    "Pow",
    "ReduceMean",
    "ReduceSum",
    "ReduceL2",
    "Sqrt",
    "Softmax",
    "Erf",
    "Div",
    "Range",
    "CumSum",
    "TopK",
    "Resize",
    "Upsample",
    "NonMaxSuppression",
    "RoiAlign",
)


class PrecisionError(BuildError):
    """A precision conversion failed (unreadable graph, calibration inputs that do not fit)."""


@dataclass(frozen=True)
class PrecisionResult:
    path: Path
    precision: str
    seconds: float


def to_fp16(src: Path, dst: Path, keep_fp32_ops: Iterable[str] = DEFAULT_FP32_OPS) -> Path:
    """Convert an FP32 ONNX graph to FP16, keeping its inputs and outputs FP32.

    Args:
        keep_fp32_ops: op types left in FP32 (casts are inserted around them).

    Returns:
        ``dst``.

    Raises:
        PrecisionError: the graph could not be read or converted.
    """
    import onnx
    from onnxconverter_common import float16

    try:
        model = onnx.load(str(src))
        with warnings.catch_warnings():
            # One warning per tiny weight truncated to FP16's range; parity below is the real check.
            warnings.filterwarnings("ignore", message="the float32 number", category=UserWarning)
            converted = float16.convert_float_to_float16(
                model, keep_io_types=True, op_block_list=sorted(set(keep_fp32_ops)) or None,
            )
    except Exception as exc:  # onnx/onnxconverter raise bare exceptions of many kinds
        raise PrecisionError(f"FP16 conversion of {src.name} failed: {exc}") from exc
    _restore_float_outputs(converted.graph, onnx.load(str(src), load_external_data=False).graph)
    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(converted, str(dst))
    onnx.checker.check_model(str(dst))
    return dst


def _restore_float_outputs(graph: Any, original: Any) -> None:
    """Cast back to FP32 any graph output the converter left FP16.

    ``keep_io_types`` misses outputs whose producer is on the op block list (e.g. a transformer's
    final LayerNorm): the converter casts its FP32 result down to FP16 and declares the output FP16.
    Served models must keep the FP32 interface their config promises.
    """
    from onnx import TensorProto, helper

    wanted = {o.name: o.type.tensor_type.elem_type for o in original.output}
    for output in graph.output:
        if wanted.get(output.name) != TensorProto.FLOAT or output.type.tensor_type.elem_type != TensorProto.FLOAT16:
            continue
        internal = f"{output.name}__fp16"
        for node in graph.node:
            node.output[:] = [internal if n == output.name else n for n in node.output]
            node.input[:] = [internal if n == output.name else n for n in node.input]
        graph.node.append(
            helper.make_node("Cast", [internal], [output.name], to=TensorProto.FLOAT, name=f"{output.name}__to_fp32")
        )
        output.type.tensor_type.elem_type = TensorProto.FLOAT


class CalibrationReader:
    """Feeds calibration samples to ``quantize_static`` in batches (an ORT ``CalibrationDataReader``).

    Args:
        samples: input name -> array batched on axis 0 (real data: photographs, sentences).
        batch_size: rows per calibration step; small batches bound calibration memory.
    """

    def __init__(self, samples: Mapping[str, np.ndarray], batch_size: int = 4) -> None:
        sizes = {len(v) for v in samples.values()}
        if len(sizes) != 1 or 0 in sizes:
            raise PrecisionError(f"calibration inputs must share one non-empty batch axis, got sizes {sorted(sizes)}")
        self.samples = {k: np.ascontiguousarray(v) for k, v in samples.items()}
        self.rows = sizes.pop()
        self.batch_size = max(1, batch_size)
        self._batches: Iterator[dict[str, np.ndarray]] = iter(())
        self.rewind()

    def _iterate(self) -> Iterator[dict[str, np.ndarray]]:
        for start in range(0, self.rows, self.batch_size):
            yield {k: v[start:start + self.batch_size] for k, v in self.samples.items()}

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._batches, None)

    def rewind(self) -> None:
        self._batches = self._iterate()


def to_int8(
    src: Path,
    dst: Path,
    calibration: Mapping[str, np.ndarray],
    *,
    per_channel: bool = True,
    batch_size: int = 4,
    op_types: Iterable[str] | None = None,
    keep_float: Iterable[str] = (),
) -> Path:
    """Quantize an FP32 ONNX graph to INT8 with explicit Q/DQ nodes from static calibration.

    Activations and weights are quantized symmetrically (zero point 0), which TensorRT requires;
    min/max calibration over ``calibration`` sets the activation scales.

    Args:
        calibration: input name -> real samples, batched on axis 0.
        per_channel: one weight scale per output channel (keeps depthwise convolutions accurate).
        op_types: op types to quantize; None quantizes every op onnxruntime supports.
        keep_float: node-name substrings; matching nodes stay in float (outlier-heavy layers).

    Returns:
        ``dst``.

    Raises:
        PrecisionError: the graph or the calibration samples could not be used.
    """
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    reader = CalibrationReader(calibration, batch_size=batch_size)
    dst.parent.mkdir(parents=True, exist_ok=True)
    src, dst = src.resolve(), dst.resolve()
    prepared = dst.with_name(dst.stem + ".pre.onnx")
    # onnxruntime's shape inference and quantizer drop scratch files (sym_shape_infer_temp.onnx,
    # <uuid>.data) into the working directory, and leave them there when they fail: work elsewhere.
    with tempfile.TemporaryDirectory(prefix="int8-") as scratch, contextlib.chdir(scratch):
        try:
            # Shape inference + graph cleanup first, as onnxruntime recommends before quantizing;
            # transformer graphs with dynamic sequence axes defeat the symbolic pass, ONNX's own suffices.
            try:
                quant_pre_process(str(src), str(prepared), skip_symbolic_shape=False)
            except Exception:
                quant_pre_process(str(src), str(prepared), skip_symbolic_shape=True)
            excluded = _matching_nodes(prepared, tuple(keep_float))
            quantize_static(
                str(prepared),
                str(dst),
                reader,  # type: ignore[arg-type]
                quant_format=QuantFormat.QDQ,
                per_channel=per_channel,
                activation_type=QuantType.QInt8,
                weight_type=QuantType.QInt8,
                calibrate_method=CalibrationMethod.MinMax,
                op_types_to_quantize=list(op_types) if op_types is not None else None,
                nodes_to_exclude=excluded,
                extra_options={"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False},
            )
        except PrecisionError:
            raise
        except Exception as exc:  # onnxruntime raises bare exceptions of many kinds
            raise PrecisionError(f"INT8 quantization of {src.name} failed: {exc}") from exc
        finally:
            prepared.unlink(missing_ok=True)
    onnx.checker.check_model(str(dst))
    return dst


def _matching_nodes(path: Path, patterns: tuple[str, ...]) -> list[str]:
    if not patterns:
        return []
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return [n.name for n in graph.node if any(p in n.name for p in patterns)]


def convert(precision: str, src: Path, dst: Path, calibration: Mapping[str, np.ndarray],
            keep_fp32_ops: Iterable[str] = DEFAULT_FP32_OPS, *, int8_op_types: Iterable[str] | None = None,
            int8_keep_float: Iterable[str] = ()) -> PrecisionResult:
    """Produce the ``precision`` variant of ``src`` at ``dst``.

    Raises:
        PrecisionError: an unknown precision, or the conversion failed.
    """
    started = time.perf_counter()
    if precision == "fp16":
        to_fp16(src, dst, keep_fp32_ops)
    elif precision == "int8":
        to_int8(src, dst, calibration, op_types=int8_op_types, keep_float=int8_keep_float)
    else:
        raise PrecisionError(f"unknown precision '{precision}'; known: {', '.join(PRECISIONS)}")
    return PrecisionResult(path=dst, precision=precision, seconds=time.perf_counter() - started)
