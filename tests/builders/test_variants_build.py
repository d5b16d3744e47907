"""efficientnet_lite0's FP16/INT8 variants in the shared test repository, served by the real Triton,
and its TensorRT-for-RTX engines built on the CPU through the pipeline (``BuildOptions.engines``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as http

from builders import engine
from builders.engine import EngineMismatchError, EngineUnavailable, check_engine, read_metadata
from builders.engine_target import (
    ServingTarget,
    artifact_root,
    check_repository_engines,
    engine_refusals,
)
from builders.families.efficientnet import MEAN, STD, EfficientNetLite0
from builders.photos import CALIBRATION_PHOTOS, CALIBRATION_VIEWS, HELD_OUT_PHOTOS
from builders.pipeline import BuildOptions, build
from builders.report import BuildReport, file_sha256
from builders.repository import latest_report, latest_version
from builders.triton_config import read_config
from serving.image_preprocessing import Preprocessing, preprocess
from tests.support.tensorrt import tensorrt_or_skip
from tests.support.variant_repos import copy_entries

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
    if precision == "fp16":  # INT8's delta is against the FP32 ONNX on the held-out photos (below)
        assert logits["delta_vs_fp32"]["max_abs_error"] == pytest.approx(
            logits["max_abs_error"] - parent.parity["logits"]["max_abs_error"]
        )

    config = read_config(model_repository / name / "config.pbtxt")
    parent_config = read_config(model_repository / MODEL / "config.pbtxt")
    assert config.platform == "onnxruntime_onnx"
    assert _tensors(config) == _tensors(parent_config), (
        "a variant drops in where its parent is served"
    )
    assert config.max_batch_size == parent_config.max_batch_size
    version = model_repository / name / str(latest_version(model_repository, name))
    assert report.artifacts["model"]["sha256"] == file_sha256(version / "model.onnx")


def _check_held_out(report: BuildReport | None, methods_tried: set[str]) -> None:
    """An INT8 report calibrated on crops of some photos, judged on photos it never saw, each method
    tried recorded with its held-out figures and the best one kept."""
    spec = EfficientNetLite0()
    assert report is not None
    logits = report.parity["logits"]
    assert logits["judged_on"] == "held-out" and logits["samples"] == len(HELD_OUT_PHOTOS)
    assert logits["calibration_set"]["samples"] == len(CALIBRATION_PHOTOS) * len(CALIBRATION_VIEWS)
    tolerance = spec.variant_tolerance("int8")
    assert logits["top5_agreement"] >= tolerance.min_top5_agreement
    assert logits["tolerance"]["min_top5_agreement"] == tolerance.min_top5_agreement
    methods = logits["calibration_methods"]
    assert set(methods) == methods_tried
    for figures in methods.values():
        assert figures["samples"] == len(HELD_OUT_PHOTOS) and figures["top5_agreement"] is not None

    def rank(f: dict) -> tuple:  # type: ignore[type-arg]
        return f["top1_agreement"], f["top5_agreement"], f["min_cosine"], -f["max_abs_error"]

    kept = logits["calibration_method"]
    assert rank(methods[kept]) == max(rank(f) for f in methods.values())
    assert methods[kept]["top1_agreement"] == logits["top1_agreement"], (
        "the gated figures are the kept method's"
    )
    assert any("held-out" in note and kept in note for note in report.notes)


def test_int8_report_is_judged_on_held_out_photos(model_repository: Path) -> None:
    """A build calibrates by the spec's first method (its measured best) alone."""
    first = EfficientNetLite0().int8_calibrations[0]
    _check_held_out(latest_report(model_repository, f"{MODEL}_int8"), {first})


def test_int8_calibration_study_tries_every_method(
    model_repository: Path, tmp_path_factory
) -> None:
    """``int8_calibration_study``: every method the spec names, the best on the held-out photos kept; a
    new INT8 version beside the single-method one (its hash names the methods); the FP32 entry is not
    rebuilt (the variants hash their whole spec, so FP16 is)."""
    spec = EfficientNetLite0()
    assert len(spec.int8_calibrations) >= 2
    repository = copy_entries(model_repository, tmp_path_factory.mktemp("study") / "repository")
    reports = build([MODEL], BuildOptions(repository=repository, int8_calibration_study=True))
    skipped = {r.model: r.skipped for r in reports}
    assert skipped[MODEL] and not skipped[f"{MODEL}_int8"], skipped
    _check_held_out(latest_report(repository, f"{MODEL}_int8"), set(spec.int8_calibrations))
    again = build([MODEL], BuildOptions(repository=repository, int8_calibration_study=True))
    assert all(r.skipped for r in again), "an unchanged study is not rebuilt"


def _chelsea(batch: int = 1) -> np.ndarray:
    from PIL import Image
    from skimage import data

    pixels = preprocess(
        Image.fromarray(data.chelsea()), Preprocessing(size=224, resize=256, mean=MEAN, std=STD)
    )
    return np.repeat(pixels[None], batch, axis=0)


@pytest.mark.integration
@pytest.mark.parametrize("model", [f"{MODEL}_int8", f"{MODEL}_fp16"])
def test_served_variant_labels_chelsea_as_a_cat(triton, model: str) -> None:
    with http.InferenceServerClient(triton.http_url) as client:
        assert client.is_model_ready(model)
        pixels = _chelsea(batch=2)
        tensor = http.InferInput("input", list(pixels.shape), "FP32")
        tensor.set_data_from_numpy(pixels)
        logits = client.infer(model, [tensor]).as_numpy("logits")
    assert logits.shape == (2, 1000) and logits.dtype == np.float32
    assert int(logits[0].argmax()) in CAT_CLASSES, np.argsort(logits[0])[::-1][:5]
    np.testing.assert_allclose(logits[0], logits[1], atol=1e-4)


@pytest.fixture(scope="module")
def engine_repository(model_repository: Path, tmp_path_factory) -> tuple[Path, list]:
    """A private copy of the efficientnet entries, built with ``engines=True`` (only engines are new)."""
    tensorrt_or_skip()
    root = tmp_path_factory.mktemp("engines")
    repository = copy_entries(model_repository, root / "repository")
    options = BuildOptions(repository=repository, engines=True, timing_cache=root / "timing.cache")
    return repository, build([MODEL], options)


def test_engine_build_only_adds_engines(engine_repository) -> None:
    repository, reports = engine_repository
    built = {r.model: r.skipped for r in reports}
    assert built == {
        MODEL: True,
        f"{MODEL}_fp16": True,
        f"{MODEL}_int8": True,
        f"{MODEL}_trt_fp16": False,
        f"{MODEL}_trt_int8": False,
    }
    again = build(
        [MODEL],
        BuildOptions(
            repository=repository, engines=True, timing_cache=repository.parent / "timing.cache"
        ),
    )
    assert all(r.skipped for r in again), "unchanged engines are not rebuilt"


def _engine_folder(repository: Path, name: str) -> Path:
    """Where the build put engine ``name``: a Triton entry, or an artifact beside the repository."""
    for root in (repository, artifact_root(repository)):
        version = latest_version(root, name)
        if version is not None:
            return root / name / str(version)
    raise AssertionError(f"{name} was published nowhere")


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_engine_metadata_and_where_it_is_published(engine_repository, precision: str) -> None:
    trt = tensorrt_or_skip()
    repository, _ = engine_repository
    spec = EfficientNetLite0()
    name = f"{MODEL}_trt_{precision}"
    version = _engine_folder(repository, name)
    meta = read_metadata(version)
    assert meta.flavour == trt.flavour and meta.tensorrt_version == trt.version
    assert meta.runtime == engine.runtime_of(trt.flavour)
    assert meta.precision == precision
    assert meta.max_batch_size == spec.batching.max_batch_size
    assert meta.profiles["input"]["min"] == [1, 3, 224, 224]
    assert meta.profiles["input"]["max"] == [spec.batching.max_batch_size, 3, 224, 224]
    variant = (
        repository
        / f"{MODEL}_{precision}"
        / str(latest_version(repository, f"{MODEL}_{precision}"))
    )
    assert meta.input_hash == file_sha256(variant / "model.onnx"), (
        "engine.json names the ONNX it came from"
    )
    assert meta.engine_sha256 == file_sha256(version / engine.ENGINE_NAME)
    report = json.loads((version / "build_report.json").read_text())
    assert report["precision"] == precision

    target = ServingTarget.ngc(meta.compute_capability)
    refusal = target.refusal(meta, version / engine.ENGINE_NAME)
    if (
        refusal is None
    ):  # pragma: no cover - full TensorRT of the NGC release's version, on its GPU host
        config = read_config(repository / name / "config.pbtxt")
        assert config.platform == "tensorrt_plan" and config.default_model_filename == "model.plan"
        assert config.max_batch_size == meta.max_batch_size, (
            "the profile covers up to max_batch_size (server#8141)"
        )
        assert [g.kind for g in config.instance_group] == [config.instance_group[0].KIND_GPU]
    else:
        # TensorRT-RTX (here), or a TensorRT other than the target Triton's: never a Triton entry.
        assert version.parent.parent == artifact_root(repository)
        assert not (repository / name).exists(), (
            "an engine Triton cannot load is not in the repository"
        )
        assert any("not a Triton entry" in n for n in report["notes"])
        if trt.flavour == "tensorrt-rtx":
            assert meta.compute_capability == "8.9" and meta.runtime == engine.RUNTIME_RTX
            assert "TensorRT-RTX runtime" in refusal

    check_engine(
        version,
        tensorrt_version=trt.version,
        compute_capability=meta.compute_capability,
        flavour=trt.flavour,
        plan=version / engine.ENGINE_NAME,
    )
    with pytest.raises(EngineMismatchError, match="compute capability"):
        check_engine(
            version, tensorrt_version=trt.version, compute_capability="9.0", flavour=trt.flavour
        )


def test_no_repository_entry_is_an_engine_its_triton_cannot_load(engine_repository) -> None:
    repository, _ = engine_repository
    meta = read_metadata(_engine_folder(repository, f"{MODEL}_trt_fp16"))
    target = ServingTarget.ngc(meta.compute_capability)
    loadable = check_repository_engines(
        repository, target
    )  # raises naming any entry it cannot load
    assert all(
        ServingTarget.ngc(meta.compute_capability).entry_refusal(
            repository / n / str(latest_version(repository, n))
        )
        is None
        for n in loadable
    )
    # The embedded server loads no engine: inferctl up leaves every engine entry out.
    assert all(reason for reason in engine_refusals(repository, ServingTarget.embedded()).values())


def test_without_tensorrt_engines_are_skipped_with_a_message(
    model_repository, tmp_path, monkeypatch
) -> None:
    import io

    from rich.console import Console

    def unavailable(prefer: str | None = None) -> engine.TensorRT:
        raise EngineUnavailable(
            "TensorRT engines skipped: neither full TensorRT nor TensorRT for RTX is installed"
        )

    monkeypatch.setattr(engine, "load_tensorrt", unavailable)
    repository = copy_entries(model_repository, tmp_path / "repository")
    out = io.StringIO()
    reports = build(
        [MODEL], BuildOptions(repository=repository, engines=True), Console(file=out, width=200)
    )
    assert {r.model for r in reports} == {MODEL, f"{MODEL}_fp16", f"{MODEL}_int8"}
    assert "TensorRT engines skipped" in out.getvalue()
    assert not list(repository.glob("*_trt_*")), "no engine entry is faked"
    assert not artifact_root(repository).exists(), "nor an artifact"
