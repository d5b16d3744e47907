"""Precision variants of a built model: ``<model>_fp16`` / ``<model>_int8`` ONNX entries and their
``<model>_trt_fp16`` / ``<model>_trt_int8`` TensorRT engine entries.

    FP32 ONNX -> precision.convert -> parity vs PyTorch and vs FP32 ONNX -> <model>_<p> (onnxruntime_onnx)
                                   -> engine.build_engine               -> <model>_trt_<p> (tensorrt_plan)

A variant keeps its parent's tensors (FP32 in, FP32 out), so it drops into the same ensemble or
gateway route. Each is its own repository entry with its own build report (precision, parity vs the
PyTorch reference, the same figures vs the FP32 ONNX, and the deltas between them), and is published
only when it is inside ``spec.variant_tolerance(precision)``. Input hashes derive from the parent's
hash, so an unchanged variant is skipped.

Nothing is published here: :func:`build_variants` returns :class:`Publication` objects the pipeline
publishes once the parent and every variant succeeded. The pipeline calls this module; this module
never imports the pipeline.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from builders import engine
from builders import precision as precision_module
from builders import repository as repo
from builders.errors import ParityError
from builders.parity import ParityResult, compare, run_onnx
from builders.precision import DEFAULT_FP32_OPS, PRECISIONS, PrecisionError, convert
from builders.report import BuildReport, file_sha256
from builders.spec import ModelSpec, Tolerance
from builders.triton_config import model_config

__all__ = [
    "EngineOptions",
    "Publication",
    "build_variants",
    "engine_hash",
    "engine_name",
    "parity_entry",
    "up_to_date_variants",
    "variant_hash",
    "variant_name",
]

@dataclass
class Publication:
    """A built and verified entry waiting to be published, or (``config`` None) one already current."""

    report: BuildReport
    config: mc.ModelConfig | None = None
    files: dict[str, Path] = field(default_factory=dict)

    def publish(self, repository: Path) -> BuildReport:
        if self.config is not None:
            repo.publish(repository, self.config, self.files, self.report)
        return self.report


@dataclass(frozen=True)
class EngineOptions:
    """How TensorRT engines are built (``inferctl build --engines``)."""

    timing_cache: Path
    compute_capability: str | None = None  # TensorRT for RTX target; full TensorRT uses the local GPU
    optimization_level: int = engine.DEFAULT_OPTIMIZATION_LEVEL


def variant_name(model: str, precision: str) -> str:
    return f"{model}_{precision}"


def engine_name(model: str, precision: str) -> str:
    return f"{model}_trt_{precision}"


def _digest(*parts: object) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(repr(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()


def variant_hash(spec: ModelSpec, parent_hash: str, precision: str) -> str:
    """The parent's hash plus what makes this variant (precision, tolerance, conversion code)."""
    code = file_sha256(Path(precision_module.__file__))
    return _digest(parent_hash, precision, spec.variant_tolerance(precision), DEFAULT_FP32_OPS,
                   spec.int8_op_types, spec.int8_keep_float, code)


def engine_hash(variant_digest: str, trt: engine.TensorRT, options: EngineOptions, capability: str,
                axis_ranges: Mapping[str, object] | None = None) -> str:
    """The variant's hash plus what makes the engine (TensorRT flavour/version, target, builder level)."""
    return _digest(variant_digest, trt.flavour, trt.version, capability, options.optimization_level,
                   sorted((axis_ranges or {}).items()), file_sha256(Path(engine.__file__)))


def _usable_engine_target(spec: ModelSpec, engines: EngineOptions | None,
                          notify: Callable[[str], None]) -> tuple[engine.TensorRT, str] | None:
    """The engine target to build for, or None (no engines asked, no TensorRT, or a spec that cannot have one)."""
    if engines is None:
        return None
    try:
        target = _engine_target(engines)
    except engine.EngineUnavailable as exc:
        notify(str(exc))
        return None
    gap = _engine_gap(spec)
    if gap is not None:
        notify(gap)
        return None
    return target


def _engine_gap(spec: ModelSpec) -> str | None:
    """Why ``spec`` gets no engine (dynamic non-batch axes without a profile range), or None."""
    missing = [t.name for t in spec.inputs if -1 in t.dims and t.name not in spec.engine_axis_ranges]
    if missing:
        return (f"{spec.name}: TensorRT engines skipped: inputs {', '.join(missing)} have dynamic non-batch axes "
                "and the spec gives no engine_axis_ranges for them")
    return None


def _engine_target(options: EngineOptions) -> tuple[engine.TensorRT, str]:
    """The installed TensorRT and the compute capability it would build for.

    Raises:
        EngineUnavailable: no TensorRT flavour, or full TensorRT without a visible GPU.
    """
    trt = engine.load_tensorrt()
    if trt.flavour == "tensorrt":
        return trt, engine._local_compute_capability()
    return trt, options.compute_capability or engine.DEFAULT_COMPUTE_CAPABILITY


def _current(repository: Path, name: str, digest: str) -> BuildReport | None:
    previous = repo.latest_report(repository, name)
    if previous is not None and previous.inputs_hash == digest:
        previous.skipped = True
        return previous
    return None


def up_to_date_variants(spec: ModelSpec, parent_hash: str, repository: Path,
                        engines: EngineOptions | None,
                        notify: Callable[[str], None] = lambda message: None) -> list[BuildReport] | None:
    """The published reports of every variant (and engine) ``spec`` needs, or None if one must be built.

    Engines count only when a TensorRT flavour is installed and the spec can have one: otherwise they
    are skipped, and ``notify`` says why.
    """
    reports = []
    target = _usable_engine_target(spec, engines, notify)
    for precision in spec.variants:
        digest = variant_hash(spec, parent_hash, precision)
        current = _current(repository, variant_name(spec.name, precision), digest)
        if current is None:
            return None
        reports.append(current)
        if engines is not None and target is not None:
            built = _current(repository, engine_name(spec.name, precision),
                             engine_hash(digest, target[0], engines, target[1], spec.engine_axis_ranges))
            if built is None:
                return None
            reports.append(built)
    return reports


def parity_entry(vs_reference: ParityResult, vs_fp32_onnx: ParityResult, fp32_vs_reference: ParityResult | None,
                 tolerance: Tolerance) -> dict[str, object]:
    """One output's parity record: figures vs PyTorch (gated), vs the FP32 ONNX, and the deltas."""
    entry: dict[str, object] = dict(vs_reference.as_dict())
    entry["vs_fp32_onnx"] = vs_fp32_onnx.as_dict()
    if fp32_vs_reference is not None:
        entry["delta_vs_fp32"] = {
            "max_abs_error": vs_reference.max_abs_error - fp32_vs_reference.max_abs_error,
            "mean_abs_error": vs_reference.mean_abs_error - fp32_vs_reference.mean_abs_error,
            "min_cosine": vs_reference.min_cosine - fp32_vs_reference.min_cosine,
            "top1_agreement": (None if vs_reference.top1_agreement is None or fp32_vs_reference.top1_agreement is None
                               else vs_reference.top1_agreement - fp32_vs_reference.top1_agreement),
        }
    entry["tolerance"] = asdict(tolerance)
    return entry


def build_variants(
    spec: ModelSpec,
    *,
    fp32_onnx: Path,
    feeds: Mapping[str, np.ndarray],
    reference: Sequence[np.ndarray],
    parent: BuildReport,
    parent_hash: str,
    repository: Path,
    workdir: Path,
    force: bool = False,
    engines: EngineOptions | None = None,
    status: Callable[[str], None] = lambda message: None,
    notify: Callable[[str], None] = lambda message: None,
) -> list[Publication]:
    """Build and verify every precision variant ``spec`` declares (and its engine), publishing nothing.

    Everything is built in ``workdir`` first; the caller publishes the returned entries once all of
    them (and the FP32 parent) succeeded, so a failure leaves the repository as it was.

    Args:
        fp32_onnx: the FP32 ONNX the variants derive from (the parent's published artifact).
        feeds: the spec's real sample inputs: parity data and INT8 calibration set.
        reference: PyTorch outputs on ``feeds``.
        parent: the FP32 entry's report (version, weights and parity recorded beside the variant's).
        engines: build TensorRT engines too, with these options; None skips them.
        status: progress messages; notify: messages for the user (engines skipped, ...).

    Returns:
        One entry per variant and engine, in build order (already current ones carry no config).

    Raises:
        ParityError: a variant is outside its tolerance.
        PrecisionError: a conversion failed.
        EngineBuildError: TensorRT could not parse or build a variant.
    """
    unknown = [p for p in spec.variants if p not in PRECISIONS]
    if unknown:
        raise PrecisionError(f"{spec.name} declares unknown precision variants {unknown}; known: {', '.join(PRECISIONS)}")
    names = [o.name for o in spec.outputs]
    fp32_outputs = run_onnx(fp32_onnx, dict(feeds), names)
    fp32_parity = {out.name: compare(ref, cand, classes=out.name == spec.class_output)
                   for out, ref, cand in zip(spec.outputs, reference, fp32_outputs, strict=True)}

    target = _usable_engine_target(spec, engines, notify)

    pending: list[Publication] = []
    for precision in spec.variants:
        name = variant_name(spec.name, precision)
        digest = variant_hash(spec, parent_hash, precision)
        onnx_path = workdir / f"{name}.onnx"
        current = None if force else _current(repository, name, digest)
        if current is None:
            variant = _build_variant(spec, precision, name, digest, fp32_onnx, onnx_path, feeds, reference,
                                     fp32_outputs, fp32_parity, parent, repository, status)
        else:
            variant = Publication(current)
            onnx_path = repository / name / str(current.version) / "model.onnx"
        pending.append(variant)

        if engines is not None and target is not None:
            trt, capability = target
            trt_name = engine_name(spec.name, precision)
            trt_digest = engine_hash(digest, trt, engines, capability, spec.engine_axis_ranges)
            built = None if force else _current(repository, trt_name, trt_digest)
            if built is None:
                status(f"{trt_name}: building {trt.flavour} engine for compute capability {capability}")
                pending.append(_build_engine_entry(spec, precision, trt_name, trt_digest, onnx_path, variant.report,
                                                   repository, workdir, engines, capability))
            else:
                pending.append(Publication(built))
    return pending


def _build_variant(spec: ModelSpec, precision: str, name: str, digest: str, fp32_onnx: Path, onnx_path: Path,
                   feeds: Mapping[str, np.ndarray], reference: Sequence[np.ndarray],
                   fp32_outputs: Sequence[np.ndarray], fp32_parity: Mapping[str, ParityResult],
                   parent: BuildReport, repository: Path, status: Callable[[str], None]) -> Publication:
    timings: dict[str, float] = {}
    status(f"{name}: converting to {precision.upper()}")
    converted = convert(precision, fp32_onnx, onnx_path, feeds, int8_op_types=spec.int8_op_types,
                        int8_keep_float=spec.int8_keep_float)
    timings[f"to_{precision}"] = converted.seconds

    status(f"{name}: checking parity")
    started = time.perf_counter()
    outputs = run_onnx(onnx_path, dict(feeds), [o.name for o in spec.outputs])
    tolerance = spec.variant_tolerance(precision)
    parity, failures = {}, []
    for out, ref, base, cand in zip(spec.outputs, reference, fp32_outputs, outputs, strict=True):
        classes = out.name == spec.class_output
        vs_reference = compare(ref, cand, classes=classes)
        parity[out.name] = parity_entry(vs_reference, compare(base, cand, classes=classes),
                                        fp32_parity.get(out.name), tolerance)
        failures += [f"{out.name}: {p}" for p in vs_reference.failures(tolerance)]
    timings["parity"] = time.perf_counter() - started
    if failures:
        raise ParityError(f"{name} ({precision.upper()} variant of {spec.name}) is outside its tolerance "
                          "vs the PyTorch reference: " + "; ".join(failures))

    report = BuildReport(
        model=name, family=spec.family, version=(repo.latest_version(repository, name) or 0) + 1,
        precision=precision, inputs_hash=digest, weights=dict(parent.weights), timings_s=timings, parity=parity,
        notes=[f"{precision.upper()} variant of {spec.name} v{parent.version}; parity on {len(reference[0])} real "
               "samples vs the FP32 PyTorch reference (gated), vs the FP32 ONNX (vs_fp32_onnx), and the change "
               "from the FP32 ONNX's own parity (delta_vs_fp32)"],
    )
    if precision == "int8":
        report.notes.append(f"INT8: static Q/DQ, symmetric per-channel weights, min/max calibration on the same "
                            f"{len(reference[0])} real samples")
    config = model_config(name, platform="onnxruntime_onnx", inputs=spec.inputs, outputs=spec.outputs,
                          batching=spec.batching, parameters=spec.model_parameters())
    config.default_model_filename = "model.onnx"
    return Publication(report, config, {"model.onnx": onnx_path})


def _build_engine_entry(spec: ModelSpec, precision: str, name: str, digest: str, onnx_path: Path,
                        variant: BuildReport, repository: Path, workdir: Path, options: EngineOptions,
                        capability: str) -> Publication:
    out = workdir / name
    preferred = max(spec.batching.preferred_batch_sizes, default=spec.batching.max_batch_size)
    meta = engine.build_engine(
        onnx_path, out, max_batch_size=spec.batching.max_batch_size, precision=precision,
        input_hash=file_sha256(onnx_path), timing_cache=options.timing_cache, preferred_batch_size=preferred,
        compute_capability=capability, optimization_level=options.optimization_level,
        axis_ranges=spec.engine_axis_ranges,
    )
    report = BuildReport(
        model=name, family=spec.family, version=(repo.latest_version(repository, name) or 0) + 1,
        precision=precision, inputs_hash=digest, weights=dict(variant.weights),
        timings_s={"engine_build": meta.build_seconds},
        notes=[
            f"TensorRT engine ({meta.flavour} {meta.tensorrt_version}, compute capability "
            f"{meta.compute_capability}, strongly typed, profile batch 1..{meta.max_batch_size}) from "
            f"{variant.model} v{variant.version}; metadata in {engine.METADATA_NAME}",
            "platform tensorrt_plan: the embedded CPU Triton cannot load it; serve it on a GPU host whose "
            "TensorRT flavour/version and compute capability match engine.json (builders.engine.check_engine)",
            f"engine parity not measured here (no GPU); the ONNX it was built from passed parity as {variant.model}",
        ],
    )
    if meta.flavour == "tensorrt-rtx":
        report.notes.append("built ahead of time by TensorRT for RTX: it runs under the TensorRT-RTX runtime; "
                            "Triton's tensorrt_plan backend needs an engine built by full TensorRT on the GPU host "
                            "(same command there: inferctl build --engines)")
    report.add_artifact("engine_metadata", out / engine.METADATA_NAME)
    config = model_config(name, platform="tensorrt_plan", inputs=spec.inputs, outputs=spec.outputs,
                          batching=spec.batching, gpu=True)
    config.default_model_filename = engine.ENGINE_NAME
    return Publication(report, config, {engine.ENGINE_NAME: out / engine.ENGINE_NAME,
                                        engine.METADATA_NAME: out / engine.METADATA_NAME})

