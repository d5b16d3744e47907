"""FP32 ONNX -> INT8 ONNX: explicit Q/DQ nodes from static calibration on real samples.

    to_int8(Path("model.onnx"), Path("model_int8.onnx"), spec.sample_inputs())
    to_int8(src, dst, feeds, Int8Options(method="entropy", keep_float=("out_proj",)))

The Q/DQ pairs sit inside the graph, so inputs and outputs stay FP32 and the variant drops into its
FP32 parent's Triton config. Nothing here knows model families; callers hand in real calibration
samples.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from builders.errors import PrecisionError

__all__ = ["CALIBRATION_METHODS", "CalibrationReader", "Int8Options", "to_int8"]

#: INT8 calibration methods: how the activation ranges are set from the calibration samples.
#: ``minmax``: the observed extremes; ``percentile``: the 99.999th percentile of |x| (clips rare
#: outliers); ``entropy``: the threshold minimising the KL divergence between the float and the
#: quantized histograms (TensorRT's classic calibrator). All stay symmetric, as TensorRT requires.
CALIBRATION_METHODS: tuple[str, ...] = ("minmax", "percentile", "entropy")


@dataclass(frozen=True, kw_only=True)
class Int8Options:
    """How a graph is quantized to INT8.

    Attributes:
        per_channel: one weight scale per output channel (keeps depthwise convolutions accurate).
        batch_size: calibration rows per step; small batches bound calibration memory.
        op_types: op types to quantize; None quantizes every op onnxruntime supports.
        keep_float: node-name substrings; matching nodes stay in float (outlier-heavy layers).
        method: one of :data:`CALIBRATION_METHODS`.
    """

    per_channel: bool = True
    batch_size: int = 4
    op_types: tuple[str, ...] | None = None
    keep_float: tuple[str, ...] = ()
    method: str = "minmax"


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
    options: Int8Options = Int8Options(),
) -> Path:
    """Quantize an FP32 ONNX graph to INT8 with explicit Q/DQ nodes from static calibration.

    Activations and weights are quantized symmetrically (zero point 0), which TensorRT requires;
    calibration over ``calibration`` by ``options.method`` sets the activation scales.

    Args:
        calibration: input name -> real samples, batched on axis 0.
        options: what is quantized, and how it is calibrated.

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
    method = options.method
    if method not in methods:
        raise PrecisionError(
            f"unknown calibration method '{method}'; known: {', '.join(CALIBRATION_METHODS)}"
        )
    reader = CalibrationReader(calibration, batch_size=options.batch_size)
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
            excluded = _matching_nodes(prepared, options.keep_float)
            quantize_static(
                str(prepared),
                str(dst),
                reader,  # type: ignore[arg-type]
                quant_format=QuantFormat.QDQ,
                per_channel=options.per_channel,
                activation_type=QuantType.QInt8,
                weight_type=QuantType.QInt8,
                calibrate_method=methods[method],
                op_types_to_quantize=(
                    list(options.op_types) if options.op_types is not None else None
                ),
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
