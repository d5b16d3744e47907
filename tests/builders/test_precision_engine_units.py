"""builders.precision and builders.engine on a tiny conv net: conversions, metadata, checks, errors."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

from builders import engine
from builders.engine import (
    EngineMetadata,
    EngineMismatchError,
    EngineOptions,
    EngineProfile,
    EngineUnavailable,
    build_engine,
    check_engine,
)
from builders.engine_target import (
    DEFAULT_NGC_RELEASE,
    NGC_TENSORRT,
    ServingTarget,
    check_repository_engines,
    engine_refusals,
)
from builders.errors import BuildError, EngineBuildError
from builders.families.efficientnet import EfficientNetLite0
from builders.parity import compare, run_onnx
from builders.precision import (
    CALIBRATION_METHODS,
    CalibrationReader,
    Fp16Options,
    Int8Options,
    PrecisionError,
    convert,
    to_fp16,
    to_int8,
)
from builders.report import file_sha256
from builders.spec import DEFAULT_VARIANT_TOLERANCES, Tolerance
from builders.variants import parity_entry, variant_hash
from tests.support.tensorrt import tensorrt_or_skip

MAX_BATCH = 8


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    """A small conv net (conv, BN, ReLU6, pooling, linear) exported like the builders export."""
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.BatchNorm2d(16),
        torch.nn.ReLU6(),
        torch.nn.Conv2d(16, 16, 3, padding=1, groups=16),
        torch.nn.ReLU6(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(16, 10),
    ).eval()
    rng = np.random.default_rng(0)
    feeds = {"input": rng.normal(size=(6, 3, 16, 16)).astype(np.float32)}
    path = tmp_path_factory.mktemp("tiny") / "model.onnx"
    torch.onnx.export(
        net,
        (torch.from_numpy(feeds["input"]),),
        str(path),
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )
    return path, feeds


def _io_types(path: Path) -> set[int]:
    graph = onnx.load(str(path)).graph
    return {t.type.tensor_type.elem_type for t in (*graph.input, *graph.output)}


def test_fp16_keeps_fp32_io_and_halves_weights(tiny, tmp_path) -> None:
    src, feeds = tiny
    dst = to_fp16(src, tmp_path / "fp16.onnx")
    assert _io_types(dst) == {onnx.TensorProto.FLOAT}, (
        "served FP16 model still takes and returns FP32"
    )
    weights = onnx.load(str(dst)).graph.initializer
    assert any(w.data_type == onnx.TensorProto.FLOAT16 for w in weights)
    result = compare(run_onnx(src, feeds)[0], run_onnx(dst, feeds)[0], classes=True)
    assert result.min_cosine > 0.999 and result.top1_agreement == 1.0


def test_fp16_block_list_keeps_listed_ops_in_fp32(tmp_path) -> None:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("Softmax", ["x"], ["s"], axis=-1),
            helper.make_node("Relu", ["s"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
    )
    src = tmp_path / "softmax.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(src))
    dst = to_fp16(src, tmp_path / "softmax_fp16.onnx", Fp16Options(keep_fp32_ops=("Softmax",)))
    converted = onnx.load(str(dst))
    softmax = next(n for n in converted.graph.node if n.op_type == "Softmax")
    # Softmax reads the FP32 input directly (no cast to FP16 in front of it).
    assert softmax.input[0] == "x"
    x = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    np.testing.assert_allclose(run_onnx(dst, {"x": x})[0], run_onnx(src, {"x": x})[0], rtol=1e-3)


@pytest.mark.parametrize("method", CALIBRATION_METHODS)
def test_int8_is_symmetric_qdq_with_float_bias(tiny, tmp_path, method: str) -> None:
    src, feeds = tiny
    dst = to_int8(src, tmp_path / "int8.onnx", feeds, Int8Options(method=method))
    model = onnx.load(str(dst))
    ops = [n.op_type for n in model.graph.node]
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops
    assert _io_types(dst) == {onnx.TensorProto.FLOAT}
    inits = {i.name: i for i in model.graph.initializer}
    zero_points = [
        n.input[2]
        for n in model.graph.node
        if n.op_type in ("QuantizeLinear", "DequantizeLinear") and len(n.input) > 2
    ]
    assert zero_points, "Q/DQ nodes carry explicit zero points"
    for name in zero_points:
        assert not onnx.numpy_helper.to_array(inits[name]).any(), (
            f"{name}: TensorRT needs zero points of 0"
        )
    int32 = [i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.INT32]
    assert not [n for n in int32 if "bias" in n], (
        "biases stay float (TensorRT rejects INT32 bias dequantization)"
    )
    result = compare(run_onnx(src, feeds)[0], run_onnx(dst, feeds)[0], classes=True)
    assert result.min_cosine > 0.95


def test_int8_keep_float_excludes_matching_nodes(tiny, tmp_path) -> None:
    src, feeds = tiny
    linear = next(n.name for n in onnx.load(str(src)).graph.node if n.op_type == "Gemm")
    dst = to_int8(src, tmp_path / "int8_partial.onnx", feeds, Int8Options(keep_float=(linear,)))
    model = onnx.load(str(dst))
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    producers = {o: n.op_type for n in model.graph.node for o in n.output}
    assert producers.get(gemm.input[1]) != "DequantizeLinear", (
        "the excluded node's weights stay float"
    )
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    assert producers.get(conv.input[1]) == "DequantizeLinear", "other nodes are still quantized"


def test_calibration_reader_batches_and_rewinds() -> None:
    reader = CalibrationReader({"a": np.zeros((5, 2)), "b": np.ones((5, 3))}, batch_size=2)
    sizes = []
    while (batch := reader.get_next()) is not None:
        sizes.append((len(batch["a"]), len(batch["b"])))
    assert sizes == [(2, 2), (2, 2), (1, 1)]
    reader.rewind()
    assert reader.get_next() is not None
    # onnxruntime's strided collection (one batch per collect): len() and set_range() count batches
    assert len(reader) == 3
    reader.set_range(1, 2)
    middle = reader.get_next()
    assert middle is not None and len(middle["a"]) == 2 and reader.get_next() is None


def test_unknown_calibration_method_is_named(tiny, tmp_path) -> None:
    src, feeds = tiny
    with pytest.raises(PrecisionError, match="unknown calibration method 'median'"):
        to_int8(src, tmp_path / "x.onnx", feeds, Int8Options(method="median"))


def test_calibration_reader_refuses_mismatched_batches() -> None:
    with pytest.raises(PrecisionError, match="batch axis"):
        CalibrationReader({"a": np.zeros((5, 2)), "b": np.zeros((4, 2))})


def test_unknown_precision_is_named(tiny, tmp_path) -> None:
    src, feeds = tiny
    with pytest.raises(PrecisionError, match="unknown precision 'int4'"):
        convert("int4", src, tmp_path / "x.onnx", feeds)
    assert issubclass(PrecisionError, BuildError)


def test_variant_tolerances_and_hashes() -> None:
    spec = EfficientNetLite0()
    assert spec.variants == ("fp16", "int8")
    assert spec.variant_tolerance("fp16") == DEFAULT_VARIANT_TOLERANCES["fp16"]
    # INT8 is judged on the held-out photographs: top-1 and top-5 agreement both gated
    assert spec.int8_calibrations == CALIBRATION_METHODS
    assert spec.variant_tolerance("int8").min_top1_agreement >= 0.6
    assert spec.variant_tolerance("int8").min_top5_agreement >= 0.9
    fp16, int8 = variant_hash(spec, "parent", "fp16"), variant_hash(spec, "parent", "int8")
    assert len({fp16, int8, variant_hash(spec, "other", "fp16")}) == 3
    assert variant_hash(spec, "parent", "fp16") == fp16, "stable: an unchanged variant is skipped"


def test_parity_entry_states_deltas_vs_fp32() -> None:
    ref = np.array([[0.0, 1.0, 0.2], [2.0, 0.1, 0.0]])
    fp32 = compare(ref, ref + 1e-6, classes=True)
    variant = compare(ref, ref + np.array([[0.0, 0.0, 0.3], [0.0, 0.0, 0.0]]), classes=True)
    entry = parity_entry(variant, variant, fp32, Tolerance())
    delta = entry["delta_vs_fp32"]
    assert isinstance(delta, dict)
    assert delta["max_abs_error"] == pytest.approx(0.3 - 1e-6)
    assert delta["top1_agreement"] == 0.0
    assert entry["tolerance"] == dataclasses.asdict(Tolerance())
    assert entry["vs_fp32_onnx"] == variant.as_dict()


def _metadata(**changes: object) -> EngineMetadata:
    meta = EngineMetadata(
        flavour="tensorrt",
        tensorrt_version="10.9.0",
        compute_capability="8.9",
        precision="fp16",
        input_hash="ab" * 32,
        max_batch_size=32,
        build_seconds=1.0,
        optimization_level=3,
    )
    return dataclasses.replace(meta, **changes)  # type: ignore[arg-type]


def test_check_engine_accepts_a_matching_host(tmp_path) -> None:
    meta = _metadata()
    meta.write(tmp_path)
    loaded = check_engine(
        tmp_path, tensorrt_version="10.9.0", compute_capability="8.9", flavour="tensorrt"
    )
    assert loaded.input_hash == meta.input_hash


def test_check_engine_names_every_mismatch(tmp_path) -> None:
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"engine")
    meta = _metadata(engine_sha256="0" * 64)
    with pytest.raises(EngineMismatchError) as caught:
        check_engine(
            meta, tensorrt_version="10.3.0", compute_capability="9.0", flavour="tensorrt", plan=plan
        )
    message = str(caught.value)
    assert "TensorRT 10.9.0" in message and "10.3.0" in message
    assert "compute capability 8.9" in message and "9.0" in message
    assert "model.plan does not match" in message
    with pytest.raises(EngineMismatchError, match="built with tensorrt, host runs tensorrt-rtx"):
        check_engine(
            meta, tensorrt_version="10.9.0", compute_capability="8.9", flavour="tensorrt-rtx"
        )


def test_missing_tensorrt_flavour_is_a_clear_skip() -> None:
    try:
        import tensorrt  # noqa: F401
    except Exception:
        with pytest.raises(EngineUnavailable, match="TensorRT engines skipped.*tensorrt-rtx"):
            engine.load_tensorrt("tensorrt")
    else:  # pragma: no cover - a host with full TensorRT
        pytest.skip("full TensorRT is installed here")


def test_engine_refuses_missing_or_batchless_input(tmp_path) -> None:
    with pytest.raises(EngineBuildError, match="not found"):
        build_engine(tmp_path / "nope.onnx", tmp_path / "out", EngineProfile(4), "fp16")
    (tmp_path / "m.onnx").write_bytes(b"")
    with pytest.raises(EngineBuildError, match="max_batch_size is 0"):
        build_engine(tmp_path / "m.onnx", tmp_path / "out", EngineProfile(0), "fp16")


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_tiny_engine_builds_with_metadata(tiny, tmp_path, precision) -> None:
    trt = tensorrt_or_skip()
    src, feeds = tiny
    variant = convert(precision, src, tmp_path / f"{precision}.onnx", feeds).path
    cache = tmp_path / "timing.cache"
    meta = build_engine(
        variant,
        tmp_path / "engine",
        EngineProfile(MAX_BATCH, preferred_batch_size=4),
        precision,
        EngineOptions(timing_cache=cache),
    )
    plan, written = (
        tmp_path / "engine" / engine.ENGINE_NAME,
        tmp_path / "engine" / engine.METADATA_NAME,
    )
    assert plan.stat().st_size > 0 and cache.exists()
    on_disk = json.loads(written.read_text())
    assert on_disk["flavour"] == trt.flavour and on_disk["tensorrt_version"] == trt.version
    assert on_disk["precision"] == precision
    assert on_disk["input_hash"] == file_sha256(variant)
    assert on_disk["engine_sha256"] == file_sha256(plan)
    assert on_disk["profiles"]["input"] == {
        "min": [1, 3, 16, 16],
        "opt": [4, 3, 16, 16],
        "max": [MAX_BATCH, 3, 16, 16],
    }
    if trt.flavour == "tensorrt-rtx":
        assert meta.compute_capability == engine.DEFAULT_COMPUTE_CAPABILITY
    # The cache written by the first build is read by the next one.
    build_engine(
        variant,
        tmp_path / "again",
        EngineProfile(MAX_BATCH),
        precision,
        EngineOptions(timing_cache=cache),
    )


def test_rtx_refuses_an_unknown_target(tiny, tmp_path) -> None:
    trt = tensorrt_or_skip()
    if trt.flavour != "tensorrt-rtx":  # pragma: no cover - full TensorRT builds for the local GPU
        pytest.skip("full TensorRT targets the local GPU")
    src, _ = tiny
    with pytest.raises(EngineBuildError, match="cannot target compute capability 9.0"):
        build_engine(
            src, tmp_path / "out", EngineProfile(4), "fp32", EngineOptions(compute_capability="9.0")
        )


@pytest.fixture(scope="module")
def sequence_model(tmp_path_factory) -> Path:
    """A tiny token model with a dynamic sequence axis, [batch, seq, 4] -> [batch, seq, 2]."""
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2)).eval()
    path = tmp_path_factory.mktemp("seq") / "model.onnx"
    torch.onnx.export(
        net,
        (torch.randn(2, 5, 4),),
        str(path),
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {0: "batch", 1: "seq"}, "y": {0: "batch", 1: "seq"}},
        opset_version=17,
        dynamo=False,
    )
    return to_fp16(path, path.with_name("fp16.onnx"))


def test_dynamic_axes_need_and_get_profile_ranges(sequence_model, tmp_path) -> None:
    tensorrt_or_skip()
    with pytest.raises(EngineBuildError, match="dynamic non-batch axes.*engine_axis_ranges"):
        build_engine(sequence_model, tmp_path / "a", EngineProfile(4), "fp16")
    with pytest.raises(EngineBuildError, match="axis 2 of input 'x'"):
        build_engine(
            sequence_model,
            tmp_path / "b",
            EngineProfile(4, axis_ranges={"x": ((1, 4), (8, 3), (16, 4))}),
            "fp16",
        )
    meta = build_engine(
        sequence_model,
        tmp_path / "c",
        EngineProfile(4, axis_ranges={"x": ((1, 4), (8, 4), (16, 4))}),
        "fp16",
    )
    assert meta.profiles["x"] == {"min": [1, 1, 4], "opt": [4, 8, 4], "max": [4, 16, 4]}


def test_repository_check_names_the_entry(tmp_path) -> None:
    version = tmp_path / "repo" / "m_trt_fp16" / "1"
    version.mkdir(parents=True)
    (version.parent / "config.pbtxt").write_text('name: "m_trt_fp16"\nplatform: "tensorrt_plan"\n')
    (tmp_path / "repo" / "onnx_model").mkdir()
    (tmp_path / "repo" / "onnx_model" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\n')
    target = ServingTarget("a Triton with TensorRT 10.9", "10.9.0", "8.9")
    with pytest.raises(EngineMismatchError, match="m_trt_fp16: no engine.json"):
        check_repository_engines(tmp_path / "repo", target)
    (version / "model.plan").write_bytes(b"plan bytes")
    meta = _metadata(engine_sha256=file_sha256(version / "model.plan"))
    meta.write(version)
    assert check_repository_engines(tmp_path / "repo", target) == ["m_trt_fp16"]
    with pytest.raises(
        EngineMismatchError, match="m_trt_fp16: built for compute capability 8.9, not 8.6"
    ):
        check_repository_engines(tmp_path / "repo", ServingTarget("gpu", "10.9.0", "8.6"))
    refusals = engine_refusals(tmp_path / "repo", ServingTarget.embedded())
    assert list(refusals) == ["m_trt_fp16"] and "cannot load TensorRT plans" in str(
        refusals["m_trt_fp16"]
    )


def test_serving_target_reads_flavour_version_and_capability_from_the_metadata(tmp_path) -> None:
    meta = _metadata()  # full TensorRT 10.9.0, compute capability 8.9
    assert ServingTarget("t", "10.9.0", "8.9").refusal(meta) is None
    assert ServingTarget("t", "10.9.0.34", "8.9").refusal(meta) is None, (
        "the build number does not matter"
    )
    assert "TensorRT 10.9.0, t has 10.5.0" in str(ServingTarget("t", "10.5.0", "8.9").refusal(meta))
    assert "not 9.0" in str(ServingTarget("t", "10.9.0", "9.0").refusal(meta))
    rtx = replace(meta, flavour="tensorrt-rtx", tensorrt_version="1.7.1.116")
    assert "TensorRT-RTX runtime" in str(ServingTarget("t", "10.9.0", "8.9").refusal(rtx)), (
        "never by name"
    )
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"not the plan")
    assert "sha256" in str(
        ServingTarget("t", "10.9.0", "8.9").refusal(replace(meta, engine_sha256="0" * 64), plan)
    )
    ngc = ServingTarget.ngc("8.9")
    assert (
        ngc.tensorrt_version == NGC_TENSORRT[DEFAULT_NGC_RELEASE]
        and ngc.compute_capability == "8.9"
    )
    with pytest.raises(ValueError, match="unknown NGC Triton release"):
        ServingTarget.ngc("8.9", "19.01")
