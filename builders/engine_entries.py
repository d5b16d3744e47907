"""TensorRT engines of precision variants: ``<model>_trt_fp16`` / ``<model>_trt_int8``.

    <model>_<p>/model.onnx (verified) -> engine.build_engine -> a tensorrt_plan entry when the target
                                         Triton loads it, else an artifact beside the repository

An engine becomes a Triton entry only when the target server (:mod:`builders.engine_target`: the NGC
Triton release's TensorRT version, the GPU's compute capability, full TensorRT) can load it, as its
``engine.json`` says; a TensorRT for RTX engine, or one built with another TensorRT, is kept under
:func:`builders.engine_target.artifact_root` with its metadata, labelled with the runtime it needs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from builders import engine
from builders import engine_target as targets
from builders import repository as repo
from builders.context import BuildContext
from builders.engine import EngineOptions
from builders.errors import EngineBuildError
from builders.publication import Publication, current_report, digest_of
from builders.report import BuildReport, file_sha256
from builders.spec import ModelSpec
from builders.triton_config import spec_config

__all__ = [
    "build_engine_entry",
    "current_engine",
    "engine_hash",
    "engine_name",
    "usable_engine_target",
]


def engine_name(model: str, precision: str) -> str:
    return f"{model}_trt_{precision}"


def engine_hash(
    variant_digest: str,
    trt: engine.TensorRT,
    options: EngineOptions,
    capability: str,
    axis_ranges: Mapping[str, object] | None = None,
) -> str:
    """The variant's hash plus what makes the engine (TensorRT flavour/version, target, builder level,
    this module's code) and where it is published (the target Triton release decides entry or artifact)."""
    code = (
        file_sha256(Path(engine.__file__)),
        file_sha256(Path(targets.__file__)),
        file_sha256(Path(__file__)),
    )
    return digest_of(
        variant_digest,
        trt.flavour,
        trt.version,
        capability,
        options.optimization_level,
        sorted((axis_ranges or {}).items()),
        options.triton_release or targets.DEFAULT_NGC_RELEASE,
        code,
    )


def usable_engine_target(
    spec: ModelSpec, engines: EngineOptions | None, notify: Callable[[str], None]
) -> tuple[engine.TensorRT, str] | None:
    """The engine target to build for, or None (no engines asked, no TensorRT, or a spec that cannot
    have one)."""
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
    missing = [
        t.name for t in spec.inputs if -1 in t.dims and t.name not in spec.engine_axis_ranges
    ]
    if missing:
        return (
            f"{spec.name}: TensorRT engines skipped: inputs {', '.join(missing)} have dynamic non-batch axes "
            "and the spec gives no engine_axis_ranges for them"
        )
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


def current_engine(repository: Path, name: str, digest: str) -> BuildReport | None:
    """An up-to-date engine: a Triton entry of the repository, or an artifact beside it."""
    return current_report(repository, name, digest) or current_report(
        targets.artifact_root(repository), name, digest
    )


def build_engine_entry(
    ctx: BuildContext,
    precision: str,
    digest: str,
    onnx_path: Path,
    variant: BuildReport,
    capability: str,
) -> Publication:
    """Build the TensorRT engine of one verified variant: a ``tensorrt_plan`` entry when the target Triton
    loads it, else an artifact labelled with the runtime it needs."""
    spec, options, repository = ctx.spec, ctx.engines, ctx.repository
    assert options is not None
    name = engine_name(spec.name, precision)
    out = ctx.workdir / name
    preferred = max(spec.batching.preferred_batch_sizes, default=spec.batching.max_batch_size)
    profile = engine.EngineProfile(spec.batching.max_batch_size, preferred, spec.engine_axis_ranges)
    try:
        meta = engine.build_engine(
            onnx_path,
            out,
            profile,
            precision,
            replace(options, compute_capability=capability),
            input_hash=file_sha256(onnx_path),
        )
    except EngineBuildError as error:
        # The ONNX file is always model.onnx; the variant's name is what the user can act on.
        raise EngineBuildError(f"{name} from {variant.model}: {error}") from error
    target = targets.ServingTarget.ngc(
        capability, options.triton_release or targets.DEFAULT_NGC_RELEASE
    )
    refusal = target.refusal(meta, out / engine.ENGINE_NAME)
    where = targets.artifact_root(repository) if refusal else repository
    report = BuildReport(
        model=name,
        family=spec.family,
        version=(repo.latest_version(where, name) or 0) + 1,
        precision=precision,
        inputs_hash=digest,
        weights=dict(variant.weights),
        timings_s={"engine_build": meta.build_seconds},
        notes=[
            f"TensorRT engine ({meta.flavour} {meta.tensorrt_version}, compute capability "
            f"{meta.compute_capability}, strongly typed, profile batch 1..{meta.max_batch_size}) from "
            f"{variant.model} v{variant.version}; metadata in {engine.METADATA_NAME} (runtime: "
            f"{meta.runtime})",
            "engine parity not measured here (no GPU); the ONNX it was built from passed parity "
            f"as {variant.model}",
        ],
    )
    report.add_artifact("engine_metadata", out / engine.METADATA_NAME)
    files = {
        engine.ENGINE_NAME: out / engine.ENGINE_NAME,
        engine.METADATA_NAME: out / engine.METADATA_NAME,
    }
    if refusal is not None:
        report.notes.append(
            f"not a Triton entry: {target.name} cannot load it ({refusal}); kept as an artifact "
            f"for the {meta.runtime} runtime in {where.name}/"
        )
        if meta.flavour != "tensorrt":
            report.notes.append(
                "Triton's tensorrt_plan backend needs an engine built by full TensorRT of its own "
                "version on the GPU host (same command there: inferctl build --engines)"
            )
        ctx.notify(f"{name}: kept as an artifact, not a Triton entry: {refusal}")
        return Publication(report, None, files, artifact=True)
    report.notes.append(
        f"platform tensorrt_plan for {target.name}; the embedded CPU Triton cannot load it "
        "(inferctl up leaves it out)"
    )
    config = spec_config(
        spec, name, platform="tensorrt_plan", filename=engine.ENGINE_NAME, gpu=True
    )
    return Publication(report, config, files)
