"""The build: spec -> ONNX -> parity check -> repository entry, skipping what has not changed.

    build(["image_classifier"], BuildOptions(repository=Path("model_repository")))

Each model's inputs (its family's source, its spec, its weights, the tool versions) are hashed; a
model whose hash matches the newest published version is not rebuilt. A changed model is published as
the next version, so Triton's version policy moves traffic to it and the old one stays for rollback.
"""

from __future__ import annotations

import copy
import hashlib
import json
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from rich.console import Console
from rich.progress import Progress, TaskID

from builders import repository as repo
from builders import variants as precision_variants
from builders.build_cache import BuildCache
from builders.context import BuildContext, onnx_entry_config
from builders.engine import DEFAULT_OPTIMIZATION_LEVEL, EngineOptions
from builders.errors import ParityError
from builders.export import export_onnx, torch_reference
from builders.parity import compare, run_onnx
from builders.registry import resolve
from builders.report import BuildReport, file_sha256, package_versions
from builders.spec import AssetSpec, ModelSpec, Spec
from serving.console import LogProgress, Table, make_console, print_table
from serving.console import progress as progress_display
from serving.limits import DEFAULT_LIMITS

__all__ = [
    "BuildOptions",
    "build",
    "build_specs",
    "inputs_hash",
    "print_summary",
    "stale",
    "summary_table",
]


@dataclass(frozen=True)
class BuildOptions:
    repository: Path
    force: bool = False
    #: model name -> local weights file or checkpoint folder
    weights: Mapping[str, str] = field(default_factory=dict)
    #: also build the precision variants (FP16/INT8) a spec declares: ``<model>_fp16``, ``<model>_int8``
    variants: bool = True
    #: also build TensorRT engines of those variants: ``<model>_trt_fp16``, ``<model>_trt_int8``
    engines: bool = False
    #: tactic timings shared by engine builds (default: beside the repository)
    timing_cache: Path | None = None
    #: TensorRT for RTX target compute capability (full TensorRT always builds for the local GPU)
    engine_compute_capability: str | None = None
    engine_optimization_level: int = DEFAULT_OPTIMIZATION_LEVEL
    #: the NGC Triton release the repository is served by: engines its TensorRT cannot load are kept
    #: as artifacts beside the repository, not published as entries (None: the platform's image)
    triton_release: str | None = None
    #: the repository is for a GPU host: ONNX entries get ``KIND_GPU`` instances and the TensorRT
    #: execution accelerator (Python pre/post-processing models stay on the CPU)
    gpu: bool = False
    #: the repository is for Triton's native backends (the NGC container), which take a ragged input
    #: only as one flat tensor: no ``allow_ragged_batch`` on the inputs the Python-based backends pad
    native_backends: bool = False
    #: a content-addressed cache of built entries shared by every repository (builders.build_cache);
    #: None: off (engines and forced builds never use it)
    cache: Path | None = None
    #: INT8: calibrate by every method the spec names and keep the best on its held-out inputs (a
    #: study: ~3x the calibration time); off, the spec's first method (its measured best) alone
    int8_calibration_study: bool = False

    def engine_options(self) -> EngineOptions | None:
        if not (self.variants and self.engines):
            return None
        cache = (
            self.timing_cache
            or self.repository.parent / f".{self.repository.name}.trt-timing-cache"
        )
        return EngineOptions(
            timing_cache=cache,
            compute_capability=self.engine_compute_capability,
            optimization_level=self.engine_optimization_level,
            triton_release=self.triton_release,
        )


def inputs_hash(
    spec: Spec,
    requirements: Mapping[str, str] | None = None,
    *,
    gpu: bool = False,
    native_backends: bool = False,
) -> str:
    """Hash of everything that makes this build what it is.

    Args:
        requirements: the input hashes of the entries ``spec`` requires (an ensemble's steps), so an
            ensemble is rebuilt when one of its steps is (its preprocessing changed, say).
        gpu: the repository is for a GPU host (its ONNX entries are served differently).
        native_backends: the repository is for Triton's native backends (no ragged inputs).
    """
    digest = hashlib.sha256()
    for path in sorted(spec.source_files()):
        digest.update(path.name.encode())
        digest.update(file_sha256(path).encode())
    if isinstance(spec, AssetSpec):
        digest.update(text_format.MessageToString(spec.config).encode())
        if spec.produce is not None:  # made by code that may change with the tools' versions
            digest.update(_versions_key().encode())
        for name in spec.requires:
            digest.update(f"{name}={(requirements or {}).get(name, '')}".encode())
    else:
        described = {
            "inputs": spec.inputs,
            "outputs": spec.outputs,
            "batching": spec.batching,
            "tolerance": spec.tolerance,
            "opset": spec.opset,
            "parameters": spec.model_parameters(),
            "weights": str(getattr(spec, "weights", "")),
            **({"host": "gpu"} if gpu else {}),
            **(
                {"ragged": spec.ragged_inputs} if spec.ragged_inputs and not native_backends else {}
            ),
            # the published config carries the queue policies: a change to them is a new build
            "queue": DEFAULT_LIMITS.queue,
        }
        digest.update(repr(described).encode())
        digest.update(_versions_key().encode())
    return digest.hexdigest()


def _versions_key() -> str:
    versions = package_versions()
    versions.pop("platform", None)
    return json.dumps(versions, sort_keys=True)


def _next_version(repository: Path, name: str) -> int:
    return (repo.latest_version(repository, name) or 0) + 1


def _up_to_date(options: BuildOptions, name: str, digest: str) -> BuildReport | None:
    if options.force:
        return None
    previous = repo.latest_report(options.repository, name)
    if previous is not None and previous.inputs_hash == digest:
        previous.skipped = True
        return previous
    return None


def _build_asset(
    spec: AssetSpec,
    options: BuildOptions,
    digest: str,
    status: Callable[[str], None] = lambda message: None,
) -> BuildReport:
    report = BuildReport(
        model=spec.name,
        family=spec.family,
        version=_next_version(options.repository, spec.name),
        precision="n/a",
        inputs_hash=digest,
    )
    if spec.produce is None:
        repo.publish(options.repository, spec.config, spec.files, report)
        return report
    with tempfile.TemporaryDirectory(prefix=f"build-{spec.name}-") as tmp:
        made = spec.produce(Path(tmp), status)
        report.precision, report.weights, report.parity = made.precision, made.weights, made.parity
        report.timings_s, report.notes = made.timings_s, made.notes
        status(f"{spec.name}: publishing")
        repo.publish(options.repository, spec.config, {**spec.files, **made.files}, report)
    return report


def _current_variants(
    spec: ModelSpec, options: BuildOptions, digest: str, notify: Callable[[str], None]
) -> list[BuildReport] | None:
    """Reports of the variants/engines ``spec`` needs when all are up to date ([] if none are wanted)."""
    if not (options.variants and spec.variants):
        return []
    if options.force:
        return None
    return precision_variants.up_to_date_variants(
        spec, digest, options.repository, options.engine_options(), notify
    )


def _build_model(
    spec: ModelSpec,
    options: BuildOptions,
    digest: str,
    progress: Progress | LogProgress,
    task: TaskID,
    previous: BuildReport | None = None,
    notify: Callable[[str], None] = lambda message: None,
) -> list[BuildReport]:
    """Export, verify and publish ``spec`` (unless ``previous`` is its current entry), then its variants."""
    timings: dict[str, float] = {}
    started = time.perf_counter()
    progress.update(task, description=f"{spec.name}: loading weights")
    module, weights = spec.load()
    feeds = spec.sample_inputs()
    reference = torch_reference(module, spec, feeds)
    held_out = spec.held_out_inputs() if options.variants and spec.variants else None
    held_out_reference = torch_reference(module, spec, held_out) if held_out is not None else None
    timings["load"] = time.perf_counter() - started

    def context(parent: BuildReport, fp32: Path, workdir: Path) -> BuildContext:
        return BuildContext(
            spec=spec,
            repository=options.repository,
            workdir=workdir,
            parent=parent,
            parent_hash=digest,
            fp32_onnx=fp32,
            feeds=feeds,
            reference=reference,
            held_out=held_out,
            held_out_reference=held_out_reference,
            force=options.force,
            engines=options.engine_options(),
            gpu=options.gpu,
            native_backends=options.native_backends,
            status=lambda message: progress.update(task, description=message),
            notify=notify,
        )

    with tempfile.TemporaryDirectory(prefix=f"build-{spec.name}-") as tmp:
        if previous is not None:
            # Only variants are missing: derive them from the FP32 ONNX that is being served.
            fp32 = options.repository / spec.name / str(previous.version) / "model.onnx"
            pending = _build_variants(context(previous, fp32, Path(tmp)), options)
            return [previous, *(p.publish(options.repository) for p in pending)]
        progress.update(task, description=f"{spec.name}: exporting ONNX")
        exported = export_onnx(module, spec, feeds, Path(tmp) / "model.onnx")
        timings["export"] = exported.seconds

        progress.update(task, description=f"{spec.name}: checking parity")
        started = time.perf_counter()
        candidate = run_onnx(exported.path, feeds, [o.name for o in spec.outputs])
        parity = {
            out.name: compare(ref, cand, classes=out.name == spec.class_output)
            for out, ref, cand in zip(spec.outputs, reference, candidate, strict=True)
        }
        timings["parity"] = time.perf_counter() - started
        failures = [
            f"{name}: {p}"
            for name, result in parity.items()
            for p in result.failures(spec.tolerance)
        ]
        if failures:
            raise ParityError(
                f"{spec.name} ONNX export is outside tolerance: " + "; ".join(failures)
            )

        report = BuildReport(
            model=spec.name,
            family=spec.family,
            version=_next_version(options.repository, spec.name),
            inputs_hash=digest,
            weights=weights.__dict__,
            timings_s=timings,
            parity={name: result.as_dict() for name, result in parity.items()},
        )
        if not weights.pretrained:
            report.notes.append(f"weights: {weights.note or 'random initialisation'}")
        config = onnx_entry_config(
            spec, spec.name, "fp32", gpu=options.gpu, ragged=not options.native_backends
        )
        # Variants and engines are built and verified before anything is published.
        pending = _build_variants(context(report, exported.path, Path(tmp)), options)
        progress.update(task, description=f"{spec.name}: publishing")
        repo.publish(options.repository, config, exported.files(), report)
        return [report, *(p.publish(options.repository) for p in pending)]


def _build_variants(
    ctx: BuildContext, options: BuildOptions
) -> list[precision_variants.Publication]:
    if not (options.variants and ctx.spec.variants):
        return []
    return precision_variants.build_variants(ctx)


def as_built(spec: Spec, options: BuildOptions) -> Spec:
    """``spec`` as ``options`` build it: INT8 calibrated by its first method alone unless
    ``options.int8_calibration_study`` (the variant's hash names the methods, so the two never mix).

    Returns:
        ``spec`` itself, or a shallow copy with one calibration method.
    """
    if (
        not isinstance(spec, ModelSpec)
        or options.int8_calibration_study
        or len(spec.int8_calibrations) <= 1
    ):
        return spec
    single = copy.copy(spec)
    single.int8_calibrations = spec.int8_calibrations[:1]
    return single


def build(
    names: Iterable[str], options: BuildOptions, console: Console | None = None
) -> list[BuildReport]:
    """Build ``names`` (and what they require) into ``options.repository``.

    Raises:
        BuildError: a spec is unknown, an input is missing, parity failed (for the model or one of
            its precision variants) or TensorRT could not parse/build a variant. Models built before
            the failure stay published; the failing one leaves its entry as it was. Missing TensorRT
            is not an error: engines are skipped with a message.
    """
    return build_specs(resolve(names, options.weights), options, console)


def build_specs(
    specs: Iterable[Spec], options: BuildOptions, console: Console | None = None
) -> list[BuildReport]:
    """Build specs that are already resolved (a caller's own spec, e.g. a candidate under test)."""
    console = console or make_console(stderr=True)
    specs = [as_built(spec, options) for spec in specs]
    told: set[str] = set()

    def notify(message: str) -> None:  # each skip reason once per build
        if message not in told:
            told.add(message)
            console.print(f"[yellow]{message}[/yellow]")

    reports: list[BuildReport] = []
    digests: dict[str, str] = {}
    cache = (
        BuildCache(options.cache)
        if options.cache and not options.force and not options.engines
        else None
    )
    with progress_display(console) as progress:
        overall = progress.add_task("building", total=len(specs))
        for spec in specs:
            digest = digests[spec.name] = inputs_hash(
                spec,
                _requirement_hashes(spec, digests, options.repository),
                gpu=options.gpu,
                native_backends=options.native_backends,
            )
            if cache is not None:
                restored = cache.restore(
                    options.repository, spec.name, digest, variants=options.variants
                )
                if restored:
                    progress.update(
                        overall,
                        description=f"{spec.name}: restored {', '.join(restored)} from the cache",
                    )
            previous = _up_to_date(options, spec.name, digest)
            step: list[BuildReport]
            if isinstance(spec, AssetSpec):
                step = [
                    previous
                    or _build_asset(
                        spec,
                        options,
                        digest,
                        lambda message: progress.update(overall, description=message),
                    )
                ]
            else:
                current = (
                    _current_variants(spec, options, digest, notify)
                    if previous is not None
                    else None
                )
                if previous is not None and current is not None:
                    step = [previous, *current]
                else:
                    step = _build_model(spec, options, digest, progress, overall, previous, notify)
            if cache is not None:
                cache.store(options.repository, spec.name, digest, step)
            reports.extend(step)
            progress.advance(overall)
    return reports


def stale(names: Iterable[str], options: BuildOptions) -> list[str]:
    """The entries a build of ``names`` (and what they require) would build now, without building.

    An entry is stale when its inputs changed since its newest version (any file it depends on, its
    spec, the tool versions, or an entry it requires) or when it was never built.
    """
    found: list[str] = []
    digests: dict[str, str] = {}
    for spec in (as_built(s, options) for s in resolve(names, options.weights)):
        digest = digests[spec.name] = inputs_hash(
            spec,
            _requirement_hashes(spec, digests, options.repository),
            gpu=options.gpu,
            native_backends=options.native_backends,
        )
        if _up_to_date(options, spec.name, digest) is None:
            found.append(spec.name)
        if isinstance(spec, ModelSpec) and options.variants:
            for precision in spec.variants:
                name = precision_variants.variant_name(spec.name, precision)
                current = repo.latest_report(options.repository, name)
                if (
                    options.force
                    or current is None
                    or current.inputs_hash
                    != precision_variants.variant_hash(spec, digest, precision)
                ):
                    found.append(name)
    return found


def _requirement_hashes(spec: Spec, built: Mapping[str, str], repository: Path) -> dict[str, str]:
    """Input hashes of what ``spec`` requires: from this build, else from the published entry."""
    if not isinstance(spec, AssetSpec):
        return {}
    hashes = {}
    for name in spec.requires:
        if name in built:
            hashes[name] = built[name]
        else:
            report = repo.latest_report(repository, name)
            hashes[name] = report.inputs_hash if report is not None else ""
    return hashes


def summary_table(reports: Iterable[BuildReport]) -> Table:
    """One row per artifact with its parity figures."""
    table = Table(
        "Build summary",
        (
            "model",
            "version",
            "precision",
            "status",
            "weights",
            "max abs err",
            "min cosine",
            "top-1 agree",
        ),
    )
    for r in reports:
        first: dict[str, Any] = next(iter(r.parity.values()), {}) if r.parity else {}
        top1 = first.get("top1_agreement")
        table.add_row(
            r.model,
            str(r.version),
            r.precision,
            "up to date" if r.skipped else "built",
            r.weights.get("source", "-") if r.weights else "-",
            f"{first['max_abs_error']:.2e}" if first else "-",
            f"{first['min_cosine']:.6f}" if first else "-",
            f"{top1:.3f}" if top1 is not None else "-",
        )
    return table


def print_summary(reports: Iterable[BuildReport], console: Console | None = None) -> None:
    """The summary table: boxed on a terminal, full-width plain columns in a log."""
    print_table(summary_table(reports), console)
