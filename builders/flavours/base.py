"""What a flavour is: the steps every way of serving a PyTorch model implements, and what they pass.

    spec -> load -> export -> verify -> entry -> variants -> publish   (builders.flavours.walk)

A flavour turns a :class:`~builders.spec.ModelSpec` into a Triton repository entry: the ONNX entry
(with its FP16/INT8 variants and their TensorRT engines), the TorchScript entry, or a compiled one.
Each step takes what the one before made; nothing is published until every step of the model, its
variants included, succeeded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from builders import repository as repo
from builders.context import GroundTruth
from builders.errors import ParityError
from builders.export import torch_reference
from builders.parity import ParityResult, compare
from builders.publication import Publication
from builders.report import BuildReport
from builders.spec import ModelSpec, TensorSpec, Tolerance, WeightsInfo

__all__ = [
    "Artifact",
    "BuildRun",
    "Flavour",
    "Loaded",
    "ParentEntry",
    "WithoutVariants",
    "checked_parity",
    "compare_outputs",
    "load_reference",
    "next_version",
    "parity_failures",
    "positional",
]


def _quiet(message: str) -> None:
    del message


@dataclass(frozen=True)
class BuildRun:
    """Where one build publishes and how it talks, shared by every model it builds.

    Attributes:
        repository: the Triton model repository entries are published into (and looked up in).
        force: rebuild entries even when their input hash says they are current.
        status: progress messages (the step a model is in).
        notify: messages for the user (engines skipped, ...).
    """

    repository: Path
    force: bool = False
    status: Callable[[str], None] = _quiet
    notify: Callable[[str], None] = _quiet


@dataclass
class Loaded:
    """The spec's module and the ground truth every artifact of it is checked against.

    Attributes:
        module: the PyTorch module in eval mode (a flavour's ``load`` may have converted it).
        weights: where its weights came from.
        truth: the spec's real inputs and the module's outputs on them, before any conversion.
        seconds: how long loading took.
    """

    module: Any
    weights: WeightsInfo
    truth: GroundTruth
    seconds: float = 0.0


@dataclass
class Artifact:
    """What a flavour's export made in the build's scratch folder.

    Attributes:
        files: destination name in the version folder -> file in the scratch folder.
        outputs: the artifact's outputs on the feeds, run as it is served (set by export or verify).
        timings: seconds per step, as the build report records them.
    """

    files: dict[str, Path]
    outputs: list[np.ndarray] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


ArtifactT = TypeVar("ArtifactT", bound=Artifact)
# Covariant: a flavour that derives nothing takes the parent entry of any artifact.
_ArtifactCo = TypeVar("_ArtifactCo", bound=Artifact, covariant=True)


@dataclass(frozen=True)
class ParentEntry(Generic[_ArtifactCo]):
    """The entry a flavour's variants derive from.

    Attributes:
        report: its build report (the version the variants derive from).
        digest: its input hash, on which the variants' own hashes build.
        artifact: what this build made and verified of it; None when the entry was current, so the
            variants derive from the version being served.
    """

    report: BuildReport
    digest: str
    artifact: _ArtifactCo | None = None


class Flavour(Protocol[ArtifactT]):
    """One way of serving a model; :func:`builders.flavours.walk.build_model` walks its steps."""

    @property
    def exporting(self) -> str:
        """The export step's progress label ("exporting ONNX", ...)."""
        ...

    def entry_name(self, spec: ModelSpec) -> str:
        """The repository entry this flavour makes of ``spec``."""
        ...

    def digest(self, spec: ModelSpec) -> str | None:
        """The entry's input hash; None: it is built every time (nothing says it is current)."""
        ...

    def current_variants(
        self, spec: ModelSpec, digest: str, run: BuildRun
    ) -> list[BuildReport] | None:
        """The reports of the variants the entry needs ([]: none wanted); None: one is stale."""
        ...

    def load(self, spec: ModelSpec) -> Loaded:
        """The module and its reference outputs (see :func:`load_reference`)."""
        ...

    def export(self, spec: ModelSpec, loaded: Loaded, workdir: Path, run: BuildRun) -> ArtifactT:
        """Make the artifact in ``workdir``.

        Raises:
            BuildError: the artifact cannot be made.
        """
        ...

    def verify(
        self, spec: ModelSpec, loaded: Loaded, artifact: ArtifactT
    ) -> dict[str, ParityResult]:
        """The artifact's parity with ``loaded.truth.reference``, per output.

        Raises:
            ParityError: it is outside the flavour's tolerance.
        """
        ...

    def entry(
        self,
        spec: ModelSpec,
        loaded: Loaded,
        artifact: ArtifactT,
        parity: Mapping[str, ParityResult],
        digest: str,
        run: BuildRun,
    ) -> Publication:
        """The verified entry (config, files, build report), not yet published."""
        ...

    def variants(
        self,
        spec: ModelSpec,
        loaded: Loaded,
        parent: ParentEntry[ArtifactT],
        workdir: Path,
        run: BuildRun,
    ) -> list[Publication]:
        """Entries derived from the verified one (``parent.artifact`` None: it is current and
        published).

        Raises:
            BuildError: a variant failed (parity, conversion, engine build); nothing is published.
        """
        ...


def load_reference(spec: ModelSpec, *, held_out: bool = False) -> Loaded:
    """Load ``spec``'s module and run it on its sample (and, with ``held_out``, held-out) inputs."""
    started = time.perf_counter()
    module, weights = spec.load()
    feeds = spec.sample_inputs()
    reference = torch_reference(module, spec, feeds)
    kept = spec.held_out_inputs() if held_out else None
    kept_reference = torch_reference(module, spec, kept) if kept is not None else None
    return Loaded(
        module=module,
        weights=weights,
        truth=GroundTruth(feeds, reference, kept, kept_reference),
        seconds=time.perf_counter() - started,
    )


def compare_outputs(
    spec: ModelSpec, reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray]
) -> dict[str, ParityResult]:
    """Parity of every output of ``spec`` (top-1 agreement on its class output)."""
    return {
        out.name: compare(ref, cand, classes=out.name == spec.class_output)
        for out, ref, cand in zip(spec.outputs, reference, candidate, strict=True)
    }


def parity_failures(parity: Mapping[str, ParityResult], tolerance: Tolerance) -> list[str]:
    """Every reason an output is outside ``tolerance``, prefixed by its name (empty: it passes)."""
    return [f"{name}: {p}" for name, result in parity.items() for p in result.failures(tolerance)]


def checked_parity(
    spec: ModelSpec, reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray], what: str
) -> dict[str, ParityResult]:
    """:func:`compare_outputs`, for a ``candidate`` that must be within ``spec.tolerance``.

    Raises:
        ParityError: an output is outside it; the message names ``what`` drifted and every reason.
    """
    parity = compare_outputs(spec, reference, candidate)
    failures = parity_failures(parity, spec.tolerance)
    if failures:
        raise ParityError(f"{what} is outside tolerance: " + "; ".join(failures))
    return parity


def positional(tensors: Sequence[TensorSpec], prefix: str) -> list[TensorSpec]:
    """``tensors`` renamed ``<prefix>__0``, ``<prefix>__1`` ... (libtorch's positional names)."""
    return [replace(t, name=f"{prefix}__{i}") for i, t in enumerate(tensors)]


def next_version(repository: Path, name: str) -> int:
    """The version a new build of ``name`` is published as."""
    return (repo.latest_version(repository, name) or 0) + 1


class WithoutVariants:
    """For a flavour that publishes its one entry and derives nothing from it (no precision
    variants, no engines): the two variant steps of :class:`Flavour`, empty."""

    def current_variants(
        self, spec: ModelSpec, digest: str, run: BuildRun
    ) -> list[BuildReport] | None:
        return []

    def variants(
        self,
        spec: ModelSpec,
        loaded: Loaded,
        parent: ParentEntry[Artifact],
        workdir: Path,
        run: BuildRun,
    ) -> list[Publication]:
        return []
