"""The ONNX flavour: ``<model>`` (``onnxruntime_onnx``), its precision variants and their engines.

    spec -> export_onnx -> parity vs PyTorch -> <model> (model.onnx)
                        -> builders.variants: <model>_fp16 / _int8 -> <model>_trt_<p> (TensorRT)

TensorRT is this flavour's last step, not a flavour of its own: an engine is built from a verified
precision variant's ONNX (:mod:`builders.engine_entries`), so its entries come out of
:meth:`OnnxFlavour.variants` beside the variants they are built from.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from builders import variants as precision_variants
from builders.context import BuildContext, onnx_entry_config
from builders.engine import EngineOptions
from builders.export import export_onnx
from builders.flavours.base import (
    Artifact,
    BuildRun,
    Loaded,
    ParentEntry,
    checked_parity,
    load_reference,
    next_version,
)
from builders.hashing import inputs_hash
from builders.parity import ParityResult, run_onnx
from builders.publication import Publication
from builders.report import BuildReport
from builders.spec import ModelSpec

__all__ = ["OnnxArtifact", "OnnxFlavour"]


@dataclass
class OnnxArtifact(Artifact):
    """The verified FP32 graph; ``path`` is the ``model.onnx`` the variants convert."""

    path: Path = Path("model.onnx")


@dataclass(frozen=True)
class OnnxFlavour:
    """How the repository serves the ONNX entries.

    Attributes:
        with_variants: also build the precision variants (FP16/INT8) a spec declares.
        engines: build TensorRT engines of those variants with these options; None: none.
        gpu: the repository is for a GPU host (``KIND_GPU`` instances, TensorRT acceleration).
        native_backends: the repository is for Triton's native backends (no ragged inputs).
    """

    with_variants: bool = True
    engines: EngineOptions | None = None
    gpu: bool = False
    native_backends: bool = False

    exporting = "exporting ONNX"

    def _wants_variants(self, spec: ModelSpec) -> bool:
        return self.with_variants and bool(spec.variants)

    def entry_name(self, spec: ModelSpec) -> str:
        return spec.name

    def digest(self, spec: ModelSpec) -> str:
        return inputs_hash(spec, gpu=self.gpu, native_backends=self.native_backends)

    def current_variants(
        self, spec: ModelSpec, digest: str, run: BuildRun
    ) -> list[BuildReport] | None:
        if not self._wants_variants(spec):
            return []
        if run.force:
            return None
        return precision_variants.up_to_date_variants(
            spec, digest, run.repository, self.engines, run.notify
        )

    def load(self, spec: ModelSpec) -> Loaded:
        return load_reference(spec, held_out=self._wants_variants(spec))

    def export(self, spec: ModelSpec, loaded: Loaded, workdir: Path, run: BuildRun) -> OnnxArtifact:
        exported = export_onnx(loaded.module, spec, loaded.truth.feeds, workdir / "model.onnx")
        return OnnxArtifact(
            files=exported.files(), timings={"export": exported.seconds}, path=exported.path
        )

    def verify(
        self, spec: ModelSpec, loaded: Loaded, artifact: OnnxArtifact
    ) -> dict[str, ParityResult]:
        started = time.perf_counter()
        artifact.outputs = run_onnx(
            artifact.path, dict(loaded.truth.feeds), [o.name for o in spec.outputs]
        )
        parity = checked_parity(
            spec, loaded.truth.reference, artifact.outputs, f"{spec.name} ONNX export"
        )
        artifact.timings["parity"] = time.perf_counter() - started
        return parity

    def entry(
        self,
        spec: ModelSpec,
        loaded: Loaded,
        artifact: OnnxArtifact,
        parity: Mapping[str, ParityResult],
        digest: str,
        run: BuildRun,
    ) -> Publication:
        report = BuildReport(
            model=spec.name,
            family=spec.family,
            version=next_version(run.repository, spec.name),
            inputs_hash=digest,
            weights=loaded.weights.__dict__,
            timings_s={"load": loaded.seconds, **artifact.timings},
            parity={name: result.as_dict() for name, result in parity.items()},
        )
        if not loaded.weights.pretrained:
            report.notes.append(f"weights: {loaded.weights.note or 'random initialisation'}")
        config = onnx_entry_config(
            spec, spec.name, "fp32", gpu=self.gpu, ragged=not self.native_backends
        )
        return Publication(report, config, artifact.files)

    def variants(
        self,
        spec: ModelSpec,
        loaded: Loaded,
        parent: ParentEntry[OnnxArtifact],
        workdir: Path,
        run: BuildRun,
    ) -> list[Publication]:
        if not self._wants_variants(spec):
            return []
        # Without a fresh export the variants derive from the FP32 ONNX that is being served.
        fp32 = (
            parent.artifact.path
            if parent.artifact is not None
            else run.repository / spec.name / str(parent.report.version) / "model.onnx"
        )
        return precision_variants.build_variants(
            BuildContext(
                spec=spec,
                repository=run.repository,
                workdir=workdir,
                parent=parent.report,
                parent_hash=parent.digest,
                fp32_onnx=fp32,
                truth=loaded.truth,
                force=run.force,
                engines=self.engines,
                gpu=self.gpu,
                native_backends=self.native_backends,
                status=run.status,
                notify=run.notify,
            )
        )
