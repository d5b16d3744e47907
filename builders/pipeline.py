"""The build: spec -> ONNX -> parity check -> repository entry, skipping what has not changed.

    build(["image_classifier"], BuildOptions(repository=Path("model_repository")))

This module resolves the names, hashes each spec and restores what the build cache has; the steps
are walked by :mod:`builders.flavours.walk`: a PyTorch model as the ONNX flavour
(:class:`builders.flavours.onnx.OnnxFlavour`: its FP16/INT8 variants and their TensorRT engines
included), a Python-backend model or an ensemble as the asset it declares.

Each model's inputs (its family's source, its spec, its weights, the tool versions) are hashed; a
model whose hash matches the newest published version is not rebuilt. A changed model is published as
the next version, so Triton's version policy moves traffic to it and the old one stays for rollback.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from builders import repository as repo
from builders import variants as precision_variants
from builders.build_cache import BuildCache
from builders.engine import DEFAULT_OPTIMIZATION_LEVEL, EngineOptions
from builders.flavours.base import BuildRun
from builders.flavours.onnx import OnnxFlavour
from builders.flavours.walk import build_asset, build_model
from builders.hashing import inputs_hash
from builders.publication import current_report
from builders.registry import resolve
from builders.report import BuildReport
from builders.spec import AssetSpec, ModelSpec, Spec
from serving.console import Table, make_console, print_table
from serving.console import progress as progress_display

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

    def flavour(self) -> OnnxFlavour:
        """The ONNX flavour these options build (its variants and engines included)."""
        return OnnxFlavour(
            with_variants=self.variants,
            engines=self.engine_options(),
            gpu=self.gpu,
            native_backends=self.native_backends,
        )


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
    flavour = options.flavour()
    with progress_display(console) as progress:
        overall = progress.add_task("building", total=len(specs))
        run = BuildRun(
            options.repository,
            force=options.force,
            status=lambda message: progress.update(overall, description=message),
            notify=notify,
        )
        for spec in specs:
            digest = _digest(spec, digests, options)
            if cache is not None:
                restored = cache.restore(
                    options.repository, spec.name, digest, variants=options.variants
                )
                if restored:
                    progress.update(
                        overall,
                        description=f"{spec.name}: restored {', '.join(restored)} from the cache",
                    )
            step: list[BuildReport]
            if isinstance(spec, AssetSpec):
                step = [build_asset(spec, run, digest)]
            else:
                step = build_model(spec, flavour, run, digest=digest)
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
        digest = _digest(spec, digests, options)
        if options.force or current_report(options.repository, spec.name, digest) is None:
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


def _digest(spec: Spec, digests: dict[str, str], options: BuildOptions) -> str:
    """``spec``'s inputs hash for a build with ``options``, recorded in ``digests`` (the hashes of
    the specs before it, which the specs requiring them hash)."""
    digest = digests[spec.name] = inputs_hash(
        spec,
        _requirement_hashes(spec, digests, options.repository),
        gpu=options.gpu,
        native_backends=options.native_backends,
    )
    return digest


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
