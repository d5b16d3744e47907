"""efficientnet_lite0's FP16/INT8 variants in the shared test repository, served by the real Triton,
and its TensorRT-for-RTX engines built on the CPU through the pipeline (``BuildOptions.engines``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as http
from _variant_repos import copy_entries

from builders import engine
from builders.engine import EngineMismatchError, EngineUnavailable, check_engine, read_metadata
from builders.families.efficientnet import MEAN, STD, EfficientNetLite0
from builders.pipeline import BuildOptions, build
from builders.python_models.image_preprocess import preprocess
from builders.report import file_sha256
from builders.repository import latest_report, latest_version
from builders.triton_config import read_config

MODEL = "efficientnet_lite0"
CAT_CLASSES = range(281, 286)  # ImageNet: tabby, tiger cat, Persian, Siamese, Egyptian cat


def _tensors(config) -> list[tuple[str, int, list[int]]]:  # type: ignore[no-untyped-def]
    return [(t.name, t.data_type, list(t.dims)) for t in (*config.input, *config.output)]


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_variant_entries_carry_checked_parity(model_repository: Path, precision: str) -> None:
    spec = EfficientNetLite0()
    name = f"{MODEL}_{precision}"
    report = latest_report(model_repository, name)
    parent = latest_report(model_repository, MODEL)
    assert report is not None and parent is not None, f"{name} is built with {MODEL}"
    assert report.precision == precision and report.inputs_hash != parent.inputs_hash
    logits = report.parity["logits"]
    tolerance = spec.variant_tolerance(precision)
    assert logits["samples"] >= 12
    assert logits["max_abs_error"] <= tolerance.max_abs_error
    assert logits["min_cosine"] >= tolerance.min_cosine
    assert logits["top1_agreement"] >= tolerance.min_top1_agreement
    assert logits["tolerance"]["min_top1_agreement"] == tolerance.min_top1_agreement
    for key in ("max_abs_error", "min_cosine", "top1_agreement"):
        assert key in logits["vs_fp32_onnx"] and key in logits["delta_vs_fp32"]
    assert logits["delta_vs_fp32"]["max_abs_error"] == pytest.approx(
        logits["max_abs_error"] - parent.parity["logits"]["max_abs_error"])

    config = read_config(model_repository / name / "config.pbtxt")
    parent_config = read_config(model_repository / MODEL / "config.pbtxt")
    assert config.platform == "onnxruntime_onnx"
    assert _tensors(config) == _tensors(parent_config), "a variant drops in where its parent is served"
    assert config.max_batch_size == parent_config.max_batch_size
    version = model_repository / name / str(latest_version(model_repository, name))
    assert report.artifacts["model"]["sha256"] == file_sha256(version / "model.onnx")


def _chelsea(batch: int = 1) -> np.ndarray:
    from PIL import Image
    from skimage import data

    pixels = preprocess(Image.fromarray(data.chelsea()), size=224, resize=256, mean=MEAN, std=STD)
    return np.repeat(pixels[None], batch, axis=0)


@pytest.mark.integration
@pytest.mark.parametrize("model", [f"{MODEL}_int8", f"{MODEL}_fp16"])
def test_served_variant_labels_chelsea_as_a_cat(triton, model: str) -> None:
    client = http.InferenceServerClient(triton.http_url)
    assert client.is_model_ready(model)
    pixels = _chelsea(batch=2)
    tensor = http.InferInput("input", list(pixels.shape), "FP32")
    tensor.set_data_from_numpy(pixels)
    logits = client.infer(model, [tensor]).as_numpy("logits")
    assert logits.shape == (2, 1000) and logits.dtype == np.float32
    assert int(logits[0].argmax()) in CAT_CLASSES, np.argsort(logits[0])[::-1][:5]
    np.testing.assert_allclose(logits[0], logits[1], atol=1e-4)


def _tensorrt() -> engine.TensorRT:
    try:
        return engine.load_tensorrt()
    except EngineUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def engine_repository(model_repository: Path, tmp_path_factory) -> tuple[Path, list]:
    """A private copy of the efficientnet entries, built with ``engines=True`` (only engines are new)."""
    _tensorrt()
    root = tmp_path_factory.mktemp("engines")
    repository = copy_entries(model_repository, root / "repository")
    options = BuildOptions(repository=repository, engines=True, timing_cache=root / "timing.cache")
    return repository, build([MODEL], options)


def test_engine_build_only_adds_engines(engine_repository) -> None:
    repository, reports = engine_repository
    built = {r.model: r.skipped for r in reports}
    assert built == {MODEL: True, f"{MODEL}_fp16": True, f"{MODEL}_int8": True,
                     f"{MODEL}_trt_fp16": False, f"{MODEL}_trt_int8": False}
    again = build([MODEL], BuildOptions(repository=repository, engines=True,
                                        timing_cache=repository.parent / "timing.cache"))
    assert all(r.skipped for r in again), "unchanged engines are not rebuilt"


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_rtx_engine_entry_and_metadata(engine_repository, precision: str) -> None:
    trt = _tensorrt()
    repository, _ = engine_repository
    spec = EfficientNetLite0()
    name = f"{MODEL}_trt_{precision}"
    version = repository / name / str(latest_version(repository, name))
    meta = read_metadata(version)
    assert meta.flavour == trt.flavour and meta.tensorrt_version == trt.version
    assert meta.precision == precision
    assert meta.max_batch_size == spec.batching.max_batch_size
    assert meta.profiles["input"]["min"] == [1, 3, 224, 224]
    assert meta.profiles["input"]["max"] == [spec.batching.max_batch_size, 3, 224, 224]
    variant = repository / f"{MODEL}_{precision}" / str(latest_version(repository, f"{MODEL}_{precision}"))
    assert meta.input_hash == file_sha256(variant / "model.onnx"), "engine.json names the ONNX it came from"
    assert meta.engine_sha256 == file_sha256(version / engine.ENGINE_NAME)
    if trt.flavour == "tensorrt-rtx":
        assert meta.compute_capability == "8.9"

    config = read_config(repository / name / "config.pbtxt")
    assert config.platform == "tensorrt_plan" and config.default_model_filename == "model.plan"
    assert config.max_batch_size == meta.max_batch_size, "the profile covers up to max_batch_size (server#8141)"
    assert [g.kind for g in config.instance_group] == [config.instance_group[0].KIND_GPU]
    report = json.loads((version / "build_report.json").read_text())
    assert report["precision"] == precision
    assert any("embedded CPU Triton cannot load" in n for n in report["notes"])

    check_engine(version, tensorrt_version=trt.version, compute_capability=meta.compute_capability,
                 flavour=trt.flavour, plan=version / engine.ENGINE_NAME)
    with pytest.raises(EngineMismatchError, match="compute capability"):
        check_engine(version, tensorrt_version=trt.version, compute_capability="9.0", flavour=trt.flavour)


def test_repository_engine_check_before_serving(engine_repository) -> None:
    trt = _tensorrt()
    repository, _ = engine_repository
    host = {"tensorrt_version": trt.version, "flavour": trt.flavour, "compute_capability": "8.9"}
    if trt.flavour != "tensorrt-rtx":  # pragma: no cover - full TensorRT built for the local GPU
        host["compute_capability"] = read_metadata(next(repository.glob(f"{MODEL}_trt_fp16/*"))).compute_capability
    assert engine.check_repository_engines(repository, **host) == [f"{MODEL}_trt_fp16", f"{MODEL}_trt_int8"]
    with pytest.raises(EngineMismatchError, match=f"{MODEL}_trt_fp16/1: .*host GPU is 9.0"):
        engine.check_repository_engines(repository, **{**host, "compute_capability": "9.0"})


def test_without_tensorrt_engines_are_skipped_with_a_message(model_repository, tmp_path, monkeypatch) -> None:
    import io

    from rich.console import Console

    def unavailable(prefer: str | None = None) -> engine.TensorRT:
        raise EngineUnavailable("TensorRT engines skipped: neither full TensorRT nor TensorRT for RTX is installed")

    monkeypatch.setattr(engine, "load_tensorrt", unavailable)
    repository = copy_entries(model_repository, tmp_path / "repository")
    out = io.StringIO()
    reports = build([MODEL], BuildOptions(repository=repository, engines=True), Console(file=out, width=200))
    assert {r.model for r in reports} == {MODEL, f"{MODEL}_fp16", f"{MODEL}_int8"}
    assert "TensorRT engines skipped" in out.getvalue()
    assert not list(repository.glob("*_trt_*")), "no engine entry is faked"
