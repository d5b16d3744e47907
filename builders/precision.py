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
import io
import tempfile
import time
import unittest.mock
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from builders.errors import BuildError
from builders.export import onnx_files, save_onnx

__all__ = [
    "CALIBRATION_METHODS",
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

#: INT8 calibration methods: how the activation ranges are set from the calibration samples.
#: ``minmax``: the observed extremes; ``percentile``: the 99.999th percentile of |x| (clips rare
#: outliers); ``entropy``: the threshold minimising the KL divergence between the float and the
#: quantized histograms (TensorRT's classic calibrator). All stay symmetric, as TensorRT requires.
CALIBRATION_METHODS: tuple[str, ...] = ("minmax", "percentile", "entropy")

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


def to_fp16(
    src: Path,
    dst: Path,
    keep_fp32_ops: Iterable[str] = DEFAULT_FP32_OPS,
    keep_float: Iterable[str] = (),
) -> Path:
    """Convert an FP32 ONNX graph to FP16, keeping its inputs and outputs FP32.

    Args:
        keep_fp32_ops: op types left in FP32 (casts are inserted around them).
        keep_float: node-name substrings; matching nodes stay in FP32 too.

    Returns:
        ``dst``.

    Raises:
        PrecisionError: the graph could not be read or converted.
    """
    import onnx

    try:
        try:
            converted = _convert_fp16(
                onnx.load(str(src)), keep_fp32_ops, tuple(keep_float), tidy=True
            )
        except AttributeError:
            # onnxconverter-common 1.16's last step, which drops Cast(to FP16) -> Cast(to FP32) pairs,
            # fails when the second cast feeds several nodes (a UNet's timestep input does). The pairs
            # are only tidiness: ONNX Runtime and TensorRT fold them. Convert again without that step.
            converted = _convert_fp16(
                onnx.load(str(src)), keep_fp32_ops, tuple(keep_float), tidy=False
            )
    except Exception as exc:  # onnx/onnxconverter raise bare exceptions of many kinds
        raise PrecisionError(f"FP16 conversion of {src.name} failed: {exc}") from exc
    _restore_float_outputs(converted.graph, onnx.load(str(src), load_external_data=False).graph)
    # A graph whose FP32 weights needed external data keeps its FP16 weights there too.
    save_onnx(converted, dst, external_data=len(onnx_files(src)) > 1)
    onnx.checker.check_model(str(dst))
    return dst


def _inline_shared_weights(model: Any) -> Any:
    """Replace ``Identity(initializer)`` nodes by a copy of the initializer under the output's name.

    The exporter shares identical weights (a random model's LayerNorm scales: all ones) through
    Identity nodes; the FP16 converter types such an output FP16 even where a block-listed op
    (LayerNorm) reads it as FP32, and ONNX Runtime then refuses the graph.
    """
    from onnx import numpy_helper

    graph = model.graph
    initializers = {i.name: i for i in graph.initializer}
    for node in [n for n in graph.node if n.op_type == "Identity" and n.input[0] in initializers]:
        copy = numpy_helper.from_array(
            numpy_helper.to_array(initializers[node.input[0]]), node.output[0]
        )
        graph.initializer.append(copy)
        graph.node.remove(node)
    return model


def _kept_nodes(graph: Any, ops: set[str], patterns: tuple[str, ...]) -> list[str]:
    """Nodes to keep in FP32 beyond the op block list: those named by ``patterns``, and every
    ``Cast`` to FP32 whose consumers all stay FP32 (the converter would retype such a cast to FP16
    and ONNX Runtime then refuses the graph: the exporter writes these casts before ``Sqrt`` in
    attention scaling and between a timestep embedding's layers)."""
    from onnx import TensorProto

    kept = {n.name for n in graph.node if any(p in n.name for p in patterns)}
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    casts = [
        n
        for n in graph.node
        if n.op_type == "Cast"
        and any(a.name == "to" and a.i == TensorProto.FLOAT for a in n.attribute)
    ]
    changed = True
    while changed:  # a cast may feed another cast
        changed = False
        for cast in casts:
            users = [u for out in cast.output for u in consumers.get(out, [])]
            if (
                cast.name not in kept
                and users
                and all(u.op_type in ops or u.name in kept for u in users)
            ):
                kept.add(cast.name)
                changed = True
    return sorted(kept)


def _convert_fp16(
    model: Any, keep_fp32_ops: Iterable[str], keep_float: tuple[str, ...], *, tidy: bool
) -> Any:
    from onnxconverter_common import float16

    model = _inline_shared_weights(model)
    nodes = _kept_nodes(model.graph, set(keep_fp32_ops), keep_float)

    with warnings.catch_warnings(), contextlib.ExitStack() as stack:
        # One warning per tiny weight truncated to FP16's range; parity afterwards is the real check.
        warnings.filterwarnings("ignore", message="the float32 number", category=UserWarning)
        if not tidy:
            stack.enter_context(
                unittest.mock.patch.object(
                    float16, "remove_unnecessary_cast_node", lambda graph: None
                )
            )
        converted = float16.convert_float_to_float16(
            model,
            keep_io_types=True,
            op_block_list=sorted(set(keep_fp32_ops)) or None,
            node_block_list=nodes or None,
        )
    _retype_cast_outputs(converted.graph)
    return converted


def _retype_cast_outputs(graph: Any) -> None:
    """Make each converted ``Cast`` to FP32 cast to FP16, as its output is now declared.

    The converter declares every FP32 value FP16 outside the kept nodes, but leaves the exporter's
    own ``Cast(to=FLOAT)`` nodes as they were (attention's ``to_out`` input): ONNX Runtime refuses a
    cast whose result contradicts its declaration.
    """
    from onnx import TensorProto

    declared = {
        info.name: info.type.tensor_type.elem_type
        for info in graph.value_info
        if info.type.HasField("tensor_type")
    }
    for node in graph.node:
        if node.op_type != "Cast":
            continue
        for attribute in node.attribute:
            if (
                attribute.name == "to"
                and attribute.i == TensorProto.FLOAT
                and declared.get(node.output[0]) == TensorProto.FLOAT16
            ):
                attribute.i = TensorProto.FLOAT16


def _restore_float_outputs(graph: Any, original: Any) -> None:
    """Cast back to FP32 any graph output the converter left FP16.

    ``keep_io_types`` misses outputs whose producer is on the op block list (e.g. a transformer's
    final LayerNorm): the converter casts its FP32 result down to FP16 and declares the output FP16.
    Served models must keep the FP32 interface their config promises.
    """
    from onnx import TensorProto, helper

    wanted = {o.name: o.type.tensor_type.elem_type for o in original.output}
    for output in graph.output:
        if (
            wanted.get(output.name) != TensorProto.FLOAT
            or output.type.tensor_type.elem_type != TensorProto.FLOAT16
        ):
            continue
        internal = f"{output.name}__fp16"
        for node in graph.node:
            node.output[:] = [internal if n == output.name else n for n in node.output]
            node.input[:] = [internal if n == output.name else n for n in node.input]
        graph.node.append(
            helper.make_node(
                "Cast",
                [internal],
                [output.name],
                to=TensorProto.FLOAT,
                name=f"{output.name}__to_fp32",
            )
        )
        output.type.tensor_type.elem_type = TensorProto.FLOAT


class CalibrationReader:
    """Feeds calibration samples to ``quantize_static`` in batches (an ORT ``CalibrationDataReader``).

    Args:
        samples: input name -> array batched on axis 0 (real data: photographs, sentences).
        batch_size: rows per calibration step; small batches bound calibration memory.

    ``len()`` and ``set_range()`` (in batches) let onnxruntime collect one batch at a time
    (``CalibStridedMinMax``): its histogram calibrators otherwise keep every intermediate tensor of
    every sample in memory at once (8 GB for efficientnet_lite0 on 88 photographs).
    """

    def __init__(self, samples: Mapping[str, np.ndarray], batch_size: int = 4) -> None:
        sizes = {len(v) for v in samples.values()}
        if len(sizes) != 1 or 0 in sizes:
            raise PrecisionError(
                f"calibration inputs must share one non-empty batch axis, got sizes {sorted(sizes)}"
            )
        self.samples = {k: np.ascontiguousarray(v) for k, v in samples.items()}
        self.rows = sizes.pop()
        self.batch_size = max(1, batch_size)
        self._range = (0, len(self))
        self._batches: Iterator[dict[str, np.ndarray]] = iter(())
        self.rewind()

    def __len__(self) -> int:
        return -(-self.rows // self.batch_size)

    def set_range(self, start_index: int, end_index: int) -> None:
        """Yield only batches ``start_index`` .. ``end_index - 1`` from now on."""
        self._range = (start_index, min(end_index, len(self)))
        self.rewind()

    def _iterate(self) -> Iterator[dict[str, np.ndarray]]:
        for batch in range(*self._range):
            start = batch * self.batch_size
            yield {k: v[start : start + self.batch_size] for k, v in self.samples.items()}

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
    method: str = "minmax",
) -> Path:
    """Quantize an FP32 ONNX graph to INT8 with explicit Q/DQ nodes from static calibration.

    Activations and weights are quantized symmetrically (zero point 0), which TensorRT requires;
    calibration over ``calibration`` by ``method`` sets the activation scales.

    Args:
        calibration: input name -> real samples, batched on axis 0.
        per_channel: one weight scale per output channel (keeps depthwise convolutions accurate).
        op_types: op types to quantize; None quantizes every op onnxruntime supports.
        keep_float: node-name substrings; matching nodes stay in float (outlier-heavy layers).
        method: one of :data:`CALIBRATION_METHODS`.

    Returns:
        ``dst``.

    Raises:
        PrecisionError: the graph or the calibration samples could not be used.
    """
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    methods = {
        "minmax": CalibrationMethod.MinMax,
        "percentile": CalibrationMethod.Percentile,
        "entropy": CalibrationMethod.Entropy,
    }
    if method not in methods:
        raise PrecisionError(
            f"unknown calibration method '{method}'; known: {', '.join(CALIBRATION_METHODS)}"
        )
    reader = CalibrationReader(calibration, batch_size=batch_size)
    dst.parent.mkdir(parents=True, exist_ok=True)
    src, dst = src.resolve(), dst.resolve()
    prepared = dst.with_name(dst.stem + ".pre.onnx")
    # onnxruntime's shape inference and quantizer drop scratch files (sym_shape_infer_temp.onnx,
    # <uuid>.data) into the working directory, and leave them there when they fail: work elsewhere.
    # onnxruntime's histogram calibrators print a line per batch collected: keep the build's output clean.
    with (
        tempfile.TemporaryDirectory(prefix="int8-") as scratch,
        contextlib.chdir(scratch),
        contextlib.redirect_stdout(io.StringIO()),
    ):
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
                calibrate_method=methods[method],
                op_types_to_quantize=list(op_types) if op_types is not None else None,
                nodes_to_exclude=excluded,
                # CalibStridedMinMax: collect (and merge into the ranges/histograms) one batch at a time.
                extra_options={
                    "ActivationSymmetric": True,
                    "WeightSymmetric": True,
                    "QuantizeBias": False,
                    "CalibStridedMinMax": 1,
                },
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


def convert(
    precision: str,
    src: Path,
    dst: Path,
    calibration: Mapping[str, np.ndarray],
    keep_fp32_ops: Iterable[str] = DEFAULT_FP32_OPS,
    *,
    int8_op_types: Iterable[str] | None = None,
    int8_keep_float: Iterable[str] = (),
    int8_method: str = "minmax",
    fp16_keep_float: Iterable[str] = (),
) -> PrecisionResult:
    """Produce the ``precision`` variant of ``src`` at ``dst``.

    Raises:
        PrecisionError: an unknown precision, or the conversion failed.
    """
    started = time.perf_counter()
    if precision == "fp16":
        to_fp16(src, dst, keep_fp32_ops, fp16_keep_float)
    elif precision == "int8":
        to_int8(
            src,
            dst,
            calibration,
            op_types=int8_op_types,
            keep_float=int8_keep_float,
            method=int8_method,
        )
    else:
        raise PrecisionError(f"unknown precision '{precision}'; known: {', '.join(PRECISIONS)}")
    return PrecisionResult(path=dst, precision=precision, seconds=time.perf_counter() - started)
