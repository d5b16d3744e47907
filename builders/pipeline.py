"""The build: spec -> ONNX -> parity check -> repository entry, skipping what has not changed.

    build(["image_classifier"], BuildOptions(repository=Path("model_repository")))

Each model's inputs (its family's source, its spec, its weights, the tool versions) are hashed; a
model whose hash matches the newest published version is not rebuilt. A changed model is published as
the next version, so Triton's version policy moves traffic to it and the old one stays for rollback.
"""

from __future__ import annotations

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
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from builders import repository as repo
from builders import variants as precision_variants
from builders.engine import DEFAULT_OPTIMIZATION_LEVEL
from builders.errors import ParityError
from builders.export import export_onnx, torch_reference
from builders.parity import compare, run_onnx
from builders.registry import resolve
from builders.report import BuildReport, file_sha256, package_versions
from builders.spec import AssetSpec, ModelSpec, Spec
from builders.triton_config import model_config

__all__ = ["BuildOptions", "build", "build_specs", "inputs_hash", "print_summary"]


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

    def engine_options(self) -> precision_variants.EngineOptions | None:
        if not (self.variants and self.engines):
            return None
        cache = self.timing_cache or self.repository.parent / f".{self.repository.name}.trt-timing-cache"
        return precision_variants.EngineOptions(timing_cache=cache, compute_capability=self.engine_compute_capability,
                                                optimization_level=self.engine_optimization_level)


def inputs_hash(spec: Spec) -> str:
    """Hash of everything that makes this build what it is."""
    digest = hashlib.sha256()
    for path in sorted(spec.source_files()):
        digest.update(path.name.encode())
        digest.update(file_sha256(path).encode())
    if isinstance(spec, AssetSpec):
        digest.update(text_format.MessageToString(spec.config).encode())
    else:
        described = {
            "inputs": spec.inputs, "outputs": spec.outputs, "batching": spec.batching,
            "tolerance": spec.tolerance, "opset": spec.opset, "parameters": spec.model_parameters(),
            "weights": str(getattr(spec, "weights", "")),
        }
        digest.update(repr(described).encode())
        versions = package_versions()
        versions.pop("platform", None)
        digest.update(json.dumps(versions, sort_keys=True).encode())
    return digest.hexdigest()


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


def _build_asset(spec: AssetSpec, options: BuildOptions, digest: str) -> BuildReport:
    report = BuildReport(model=spec.name, family=spec.family, version=_next_version(options.repository, spec.name),
                         precision="n/a", inputs_hash=digest)
    repo.publish(options.repository, spec.config, spec.files, report)
    return report


def _current_variants(spec: ModelSpec, options: BuildOptions, digest: str,
                      notify: Callable[[str], None]) -> list[BuildReport] | None:
    """Reports of the variants/engines ``spec`` needs when all are up to date ([] if none are wanted)."""
    if not (options.variants and spec.variants):
        return []
    if options.force:
        return None
    return precision_variants.up_to_date_variants(spec, digest, options.repository, options.engine_options(), notify)


def _build_model(spec: ModelSpec, options: BuildOptions, digest: str, progress: Progress, task: TaskID,
                 previous: BuildReport | None = None,
                 notify: Callable[[str], None] = lambda message: None) -> list[BuildReport]:
    """Export, verify and publish ``spec`` (unless ``previous`` is its current entry), then its variants."""
    timings: dict[str, float] = {}
    started = time.perf_counter()
    progress.update(task, description=f"{spec.name}: loading weights")
    module, weights = spec.load()
    feeds = spec.sample_inputs()
    reference = torch_reference(module, spec, feeds)
    timings["load"] = time.perf_counter() - started

    with tempfile.TemporaryDirectory(prefix=f"build-{spec.name}-") as tmp:
        if previous is not None:
            # Only variants are missing: derive them from the FP32 ONNX that is being served.
            fp32 = options.repository / spec.name / str(previous.version) / "model.onnx"
            pending = _build_variants(spec, options, digest, fp32, feeds, reference, previous, Path(tmp),
                                      progress, task, notify)
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
        failures = [f"{name}: {p}" for name, result in parity.items() for p in result.failures(spec.tolerance)]
        if failures:
            raise ParityError(f"{spec.name} ONNX export is outside tolerance: " + "; ".join(failures))

        report = BuildReport(
            model=spec.name, family=spec.family, version=_next_version(options.repository, spec.name),
            inputs_hash=digest, weights=weights.__dict__, timings_s=timings,
            parity={name: result.as_dict() for name, result in parity.items()},
        )
        if not weights.pretrained:
            report.notes.append(f"weights: {weights.note or 'random initialisation'}")
        config = model_config(spec.name, platform="onnxruntime_onnx", inputs=spec.inputs, outputs=spec.outputs,
                              batching=spec.batching, parameters=spec.model_parameters())
        config.default_model_filename = "model.onnx"
        # Variants and engines are built and verified before anything is published.
        pending = _build_variants(spec, options, digest, exported.path, feeds, reference, report, Path(tmp),
                                  progress, task, notify)
        progress.update(task, description=f"{spec.name}: publishing")
        repo.publish(options.repository, config, {"model.onnx": exported.path}, report)
        return [report, *(p.publish(options.repository) for p in pending)]


def _build_variants(spec: ModelSpec, options: BuildOptions, digest: str, fp32: Path, feeds: dict, reference: list,
                    parent: BuildReport, workdir: Path, progress: Progress, task: TaskID,
                    notify: Callable[[str], None]) -> list[precision_variants.Publication]:
    if not (options.variants and spec.variants):
        return []
    return precision_variants.build_variants(
        spec, fp32_onnx=fp32, feeds=feeds, reference=reference, parent=parent, parent_hash=digest,
        repository=options.repository, workdir=workdir, force=options.force, engines=options.engine_options(),
        status=lambda message: progress.update(task, description=message),
        notify=notify,
    )


def build(names: Iterable[str], options: BuildOptions, console: Console | None = None) -> list[BuildReport]:
    """Build ``names`` (and what they require) into ``options.repository``.

    Raises:
        BuildError: a spec is unknown, an input is missing, parity failed (for the model or one of
            its precision variants) or TensorRT could not parse/build a variant. Models built before
            the failure stay published; the failing one leaves its entry as it was. Missing TensorRT
            is not an error: engines are skipped with a message.
    """
    return build_specs(resolve(names, options.weights), options, console)


def build_specs(specs: Iterable[Spec], options: BuildOptions, console: Console | None = None) -> list[BuildReport]:
    """Build specs that are already resolved (a caller's own spec, e.g. a candidate under test)."""
    console = console or Console(stderr=True)
    specs = list(specs)
    told: set[str] = set()

    def notify(message: str) -> None:  # each skip reason once per build
        if message not in told:
            told.add(message)
            console.print(f"[yellow]{message}[/yellow]")

    reports: list[BuildReport] = []
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        overall = progress.add_task("building", total=len(specs))
        for spec in specs:
            digest = inputs_hash(spec)
            previous = _up_to_date(options, spec.name, digest)
            if isinstance(spec, AssetSpec):
                reports.append(previous or _build_asset(spec, options, digest))
                progress.advance(overall)
                continue
            current = _current_variants(spec, options, digest, notify) if previous is not None else None
            if previous is not None and current is not None:
                reports.extend([previous, *current])
            else:
                reports.extend(_build_model(spec, options, digest, progress, overall, previous, notify))
            progress.advance(overall)
    return reports


def print_summary(reports: Iterable[BuildReport], console: Console | None = None) -> None:
    """One row per artifact with its parity figures."""
    console = console or Console()
    table = Table(title="Build summary")
    for column in ("model", "version", "precision", "status", "weights", "max abs err", "min cosine", "top-1 agree"):
        table.add_column(column)
    for r in reports:
        first: dict[str, Any] = next(iter(r.parity.values()), {}) if r.parity else {}
        top1 = first.get("top1_agreement")
        table.add_row(
            r.model, str(r.version), r.precision, "up to date" if r.skipped else "built",
            r.weights.get("source", "-") if r.weights else "-",
            f"{first['max_abs_error']:.2e}" if first else "-",
            f"{first['min_cosine']:.6f}" if first else "-",
            f"{top1:.3f}" if top1 is not None else "-",
        )
    console.print(table)
