"""Precision variants of a built model: ``<model>_fp16`` / ``<model>_int8`` ONNX entries, and through
:mod:`builders.engine_entries` their ``<model>_trt_fp16`` / ``<model>_trt_int8`` TensorRT engines.

    FP32 ONNX -> precision.convert -> parity vs PyTorch and vs FP32 ONNX -> <model>_<p> (onnxruntime_onnx)
                                   -> engine_entries.build_engine_entry -> <model>_trt_<p>

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

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from builders import precision as precision_module
from builders import precision_fp16, precision_int8
from builders import repository as repo
from builders.context import BuildContext, onnx_entry_config
from builders.engine import EngineOptions
from builders.engine_entries import (
    build_engine_entry,
    current_engine,
    engine_hash,
    engine_name,
    usable_engine_target,
)
from builders.errors import ParityError
from builders.export import onnx_files
from builders.parity import ParityResult, compare, run_onnx
from builders.precision import (
    DEFAULT_FP32_OPS,
    PRECISIONS,
    Fp16Options,
    Int8Options,
    PrecisionError,
    convert,
)
from builders.publication import Publication, current_report, digest_of
from builders.report import BuildReport, file_sha256
from builders.spec import ModelSpec, Tolerance

__all__ = [
    "build_variants",
    "parity_entry",
    "up_to_date_variants",
    "variant_hash",
    "variant_name",
]


def variant_name(model: str, precision: str) -> str:
    return f"{model}_{precision}"


def variant_hash(spec: ModelSpec, parent_hash: str, precision: str) -> str:
    """The parent's hash plus what makes this variant (precision, tolerance, conversion code)."""
    code = (
        file_sha256(Path(precision_module.__file__)),
        file_sha256(Path(precision_fp16.__file__)),
        file_sha256(Path(precision_int8.__file__)),
        file_sha256(Path(__file__)),
    )
    return digest_of(
        parent_hash,
        precision,
        spec.variant_tolerance(precision),
        DEFAULT_FP32_OPS,
        spec.int8_op_types,
        spec.int8_keep_float,
        spec.int8_calibrations,
        spec.fp16_keep_float,
        code,
    )


def up_to_date_variants(
    spec: ModelSpec,
    parent_hash: str,
    repository: Path,
    engines: EngineOptions | None,
    notify: Callable[[str], None] = lambda message: None,
) -> list[BuildReport] | None:
    """The published reports of every variant (and engine) ``spec`` needs, or None if one must be built.

    Engines count only when a TensorRT flavour is installed and the spec can have one: otherwise they
    are skipped, and ``notify`` says why.
    """
    reports = []
    target = usable_engine_target(spec, engines, notify)
    for precision in spec.variants:
        digest = variant_hash(spec, parent_hash, precision)
        current = current_report(repository, variant_name(spec.name, precision), digest)
        if current is None:
            return None
        reports.append(current)
        if engines is not None and target is not None:
            built = current_engine(
                repository,
                engine_name(spec.name, precision),
                engine_hash(digest, target[0], engines, target[1], spec.engine_axis_ranges),
            )
            if built is None:
                return None
            reports.append(built)
    return reports


def parity_entry(
    vs_reference: ParityResult,
    vs_fp32_onnx: ParityResult,
    fp32_vs_reference: ParityResult | None,
    tolerance: Tolerance,
) -> dict[str, object]:
    """One output's parity record: figures vs PyTorch (gated), vs the FP32 ONNX, and the deltas."""
    entry: dict[str, object] = dict(vs_reference.as_dict())
    entry["vs_fp32_onnx"] = vs_fp32_onnx.as_dict()
    if fp32_vs_reference is not None:
        entry["delta_vs_fp32"] = {
            "max_abs_error": vs_reference.max_abs_error - fp32_vs_reference.max_abs_error,
            "mean_abs_error": vs_reference.mean_abs_error - fp32_vs_reference.mean_abs_error,
            "min_cosine": vs_reference.min_cosine - fp32_vs_reference.min_cosine,
            "top1_agreement": (
                None
                if vs_reference.top1_agreement is None or fp32_vs_reference.top1_agreement is None
                else vs_reference.top1_agreement - fp32_vs_reference.top1_agreement
            ),
        }
    entry["tolerance"] = asdict(tolerance)
    return entry


def build_variants(ctx: BuildContext) -> list[Publication]:
    """Build and verify every precision variant ``ctx.spec`` declares (and its engine), publishing nothing.

    Everything is built in ``ctx.workdir`` first; the caller publishes the returned entries once all
    of them (and the FP32 parent) succeeded, so a failure leaves the repository as it was.

    Returns:
        One entry per variant and engine, in build order (already current ones carry no config).

    Raises:
        ParityError: a variant is outside its tolerance.
        PrecisionError: a conversion failed.
        EngineBuildError: TensorRT could not parse or build a variant.
    """
    spec = ctx.spec
    unknown = [p for p in spec.variants if p not in PRECISIONS]
    if unknown:
        raise PrecisionError(
            f"{spec.name} declares unknown precision variants {unknown}; known: {', '.join(PRECISIONS)}"
        )
    fp32_outputs = run_onnx(ctx.fp32_onnx, dict(ctx.truth.feeds), [o.name for o in spec.outputs])
    fp32_parity = {
        out.name: compare(ref, cand, classes=out.name == spec.class_output)
        for out, ref, cand in zip(spec.outputs, ctx.truth.reference, fp32_outputs, strict=True)
    }
    target = usable_engine_target(spec, ctx.engines, ctx.notify)

    pending: list[Publication] = []
    for precision in spec.variants:
        name = variant_name(spec.name, precision)
        digest = variant_hash(spec, ctx.parent_hash, precision)
        current = None if ctx.force else current_report(ctx.repository, name, digest)
        if current is None:
            # A folder per variant: an external data file beside its graph keeps the name it is
            # published with.
            onnx_path = ctx.workdir / name / "model.onnx"
            variant = _build_variant(ctx, precision, digest, onnx_path, fp32_outputs, fp32_parity)
        else:
            variant = Publication(current)
            onnx_path = ctx.repository / name / str(current.version) / "model.onnx"
        pending.append(variant)

        if ctx.engines is not None and target is not None:
            trt, capability = target
            trt_name = engine_name(spec.name, precision)
            trt_digest = engine_hash(digest, trt, ctx.engines, capability, spec.engine_axis_ranges)
            built = None if ctx.force else current_engine(ctx.repository, trt_name, trt_digest)
            if built is None:
                ctx.status(
                    f"{trt_name}: building {trt.flavour} engine for compute capability {capability}"
                )
                pending.append(
                    build_engine_entry(
                        ctx, precision, trt_digest, onnx_path, variant.report, capability
                    )
                )
            else:
                pending.append(Publication(built))
    return pending


def _build_variant(
    ctx: BuildContext,
    precision: str,
    digest: str,
    onnx_path: Path,
    fp32_outputs: Sequence[np.ndarray],
    fp32_parity: Mapping[str, ParityResult],
) -> Publication:
    spec, truth = ctx.spec, ctx.truth
    reference = truth.reference
    name = variant_name(spec.name, precision)
    timings: dict[str, float] = {}
    judged_held_out = (
        precision == "int8" and truth.held_out is not None and truth.held_out_reference is not None
    )
    method, studies = _convert(ctx, name, precision, onnx_path, timings)

    ctx.status(f"{name}: checking parity")
    started = time.perf_counter()
    outputs = run_onnx(onnx_path, dict(truth.feeds), [o.name for o in spec.outputs])
    gated_reference, gated_outputs, gated_fp32 = reference, outputs, fp32_outputs
    if judged_held_out:
        assert truth.held_out is not None and truth.held_out_reference is not None
        gated_reference = truth.held_out_reference
        gated_outputs = run_onnx(onnx_path, dict(truth.held_out), [o.name for o in spec.outputs])
        gated_fp32 = run_onnx(ctx.fp32_onnx, dict(truth.held_out), [o.name for o in spec.outputs])
    tolerance = spec.variant_tolerance(precision)
    parity, failures = {}, []
    for index, out in enumerate(spec.outputs):
        classes = out.name == spec.class_output
        vs_reference = compare(gated_reference[index], gated_outputs[index], classes=classes)
        fp32_own = (
            compare(gated_reference[index], gated_fp32[index], classes=classes)
            if judged_held_out
            else fp32_parity.get(out.name)
        )
        entry = parity_entry(
            vs_reference,
            compare(gated_fp32[index], gated_outputs[index], classes=classes),
            fp32_own,
            tolerance,
        )
        if judged_held_out:
            entry["judged_on"] = "held-out"
            # the same figures on the calibration data, for contrast (not gated: calibration has seen it)
            entry["calibration_set"] = compare(
                reference[index], outputs[index], classes=classes
            ).as_dict()
            entry["calibration_method"] = method
            entry["calibration_methods"] = {m: figures[out.name] for m, figures in studies.items()}
        parity[out.name] = entry
        failures += [f"{out.name}: {p}" for p in vs_reference.failures(tolerance)]
    timings["parity"] = time.perf_counter() - started
    if failures:
        where = "on the held-out inputs" if judged_held_out else "vs the PyTorch reference"
        raise ParityError(
            f"{name} ({precision.upper()} variant of {spec.name}) is outside its tolerance {where}: "
            + "; ".join(failures)
        )

    parent = ctx.parent
    report = BuildReport(
        model=name,
        family=spec.family,
        version=(repo.latest_version(ctx.repository, name) or 0) + 1,
        precision=precision,
        inputs_hash=digest,
        weights=dict(parent.weights),
        timings_s=timings,
        parity=parity,
        notes=[
            f"{precision.upper()} variant of {spec.name} v{parent.version}; parity on "
            f"{len(gated_reference[0])} real samples vs the FP32 PyTorch reference (gated), vs the FP32 ONNX "
            "(vs_fp32_onnx), and the change from the FP32 ONNX's own parity (delta_vs_fp32)"
        ],
    )
    if precision == "int8":
        held_out = len(gated_reference[0]) if judged_held_out else None
        report.notes.append(_int8_note(method, list(studies), len(reference[0]), held_out))
    config = onnx_entry_config(spec, name, precision, gpu=ctx.gpu, ragged=not ctx.native_backends)
    return Publication(report, config, onnx_files(onnx_path))


def _convert(
    ctx: BuildContext, name: str, precision: str, onnx_path: Path, timings: dict[str, float]
) -> tuple[str, dict[str, dict[str, dict[str, object]]]]:
    """The variant's graph at ``onnx_path``; returns what :func:`_calibrate` does (nothing for FP16)."""
    if precision == "int8":
        return _calibrate(ctx, name, onnx_path, timings)
    ctx.status(f"{name}: converting to {precision.upper()}")
    converted = convert(
        precision,
        ctx.fp32_onnx,
        onnx_path,
        ctx.truth.feeds,
        fp16=Fp16Options(keep_float=ctx.spec.fp16_keep_float),
    )
    timings[f"to_{precision}"] = converted.seconds
    return "", {}


def _int8_note(method: str, tried: list[str], calibrated_on: int, held_out: int | None) -> str:
    """How an INT8 variant was calibrated and on what it was judged (``held_out``: samples, if any)."""
    if held_out is not None:
        return (
            f"INT8: static Q/DQ, symmetric per-channel weights; calibrated on {calibrated_on} real "
            f"samples and judged on {held_out} held-out samples no calibration has seen; "
            f"calibration methods tried: {', '.join(tried)} (figures on the held-out samples in "
            f"calibration_methods); kept: {method}"
        )
    return (
        f"INT8: static Q/DQ, symmetric per-channel weights, {method} calibration on the same "
        f"{calibrated_on} real samples it is checked on (the spec has no held-out inputs)"
    )


def _calibrate(
    ctx: BuildContext, name: str, onnx_path: Path, timings: dict[str, float]
) -> tuple[str, dict[str, dict[str, dict[str, object]]]]:
    """INT8 by every calibration method the spec names; the best on the held-out inputs ends up at
    ``onnx_path``.

    Returns:
        The method kept and, per method, its figures per output on the held-out inputs (empty
        without held-out inputs: then the spec's first method is used alone). A build without
        ``BuildOptions.int8_calibration_study`` names one method (``pipeline.as_built``).
    """
    spec, truth = ctx.spec, ctx.truth
    methods = spec.int8_calibrations or ("minmax",)
    if truth.held_out is None or truth.held_out_reference is None:
        methods = methods[:1]
    studies: dict[str, dict[str, dict[str, object]]] = {}
    ranked: list[tuple[tuple[float, ...], str, Path]] = []
    for method in methods:
        ctx.status(f"{name}: calibrating INT8 ({method})")
        path = onnx_path.with_name(f"{onnx_path.stem}.{method}.onnx")
        converted = convert(
            "int8",
            ctx.fp32_onnx,
            path,
            truth.feeds,
            int8=Int8Options(
                op_types=spec.int8_op_types, keep_float=spec.int8_keep_float, method=method
            ),
        )
        timings[f"to_int8_{method}"] = converted.seconds
        if (
            truth.held_out is None or truth.held_out_reference is None
        ):  # one method (above): nothing to rank on
            ranked.append(((0.0,), method, path))
            break
        outputs = run_onnx(path, dict(truth.held_out), [o.name for o in spec.outputs])
        results = {
            out.name: compare(ref, cand, classes=out.name == spec.class_output)
            for out, ref, cand in zip(spec.outputs, truth.held_out_reference, outputs, strict=True)
        }
        studies[method] = {out: r.as_dict() for out, r in results.items()}
        judged = results.get(spec.class_output or "", next(iter(results.values())))
        ranked.append(
            (
                (
                    judged.top1_agreement or 0.0,
                    judged.top5_agreement or 0.0,
                    judged.min_cosine,
                    -judged.max_abs_error,
                ),
                method,
                path,
            )
        )
    _, best, path = max(
        ranked, key=lambda item: item[0]
    )  # ties: the earlier method in the spec's order
    path.replace(onnx_path)
    for _, _, other in ranked:
        other.unlink(missing_ok=True)
    return best, studies
