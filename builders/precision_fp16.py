"""FP32 ONNX -> FP16 ONNX by graph conversion, its inputs and outputs kept FP32.

    to_fp16(Path("model.onnx"), Path("model_fp16.onnx"))
    to_fp16(src, dst, Fp16Options(keep_float=("time_embedding",)))

``keep_io_types`` keeps the interface FP32, so the variant drops into its FP32 parent's Triton
config; the converter's rough edges (shared weights, casts it mistypes, outputs it leaves FP16) are
mended around it here. Nothing here knows model families.
"""

from __future__ import annotations

import contextlib
import unittest.mock
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builders.errors import PrecisionError
from builders.export import onnx_files, save_onnx

__all__ = ["DEFAULT_FP32_OPS", "Fp16Options", "to_fp16"]

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


@dataclass(frozen=True, kw_only=True)
class Fp16Options:
    """How a graph is converted to FP16.

    Attributes:
        keep_fp32_ops: op types left in FP32 (casts are inserted around them).
        keep_float: node-name substrings; matching nodes stay in FP32 too.
    """

    keep_fp32_ops: tuple[str, ...] = DEFAULT_FP32_OPS
    keep_float: tuple[str, ...] = ()


def to_fp16(src: Path, dst: Path, options: Fp16Options = Fp16Options()) -> Path:
    """Convert an FP32 ONNX graph to FP16, keeping its inputs and outputs FP32.

    Args:
        options: the ops and nodes left in FP32.

    Returns:
        ``dst``.

    Raises:
        PrecisionError: the graph could not be read or converted.
    """
    import onnx

    try:
        try:
            converted = _convert_fp16(
                onnx.load(str(src)), options.keep_fp32_ops, options.keep_float, tidy=True
            )
        except AttributeError:
            # onnxconverter-common 1.16's last step, which drops Cast(to FP16) -> Cast(to FP32) pairs,
            # fails when the second cast feeds several nodes (a UNet's timestep input does). The pairs
            # are only tidiness: ONNX Runtime and TensorRT fold them. Convert again without that step.
            converted = _convert_fp16(
                onnx.load(str(src)), options.keep_fp32_ops, options.keep_float, tidy=False
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
