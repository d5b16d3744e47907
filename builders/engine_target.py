"""Which TensorRT engines a Triton server can load, decided from the engine's own metadata.

A ``tensorrt_plan`` entry is served by Triton's TensorRT backend, which deserializes the plan with
the TensorRT library *it* was built with, on the GPU it runs on. A plan loads only when

- it was built by full TensorRT (a TensorRT for RTX engine needs the RTX runtime, which Triton's
  backend is not),
- with the same TensorRT version (major.minor.patch) as the server's,
- for the compute capability of the server's GPU.

Each of these is read from the engine's ``engine.json`` (whose recorded sha256 must match the plan
beside it), never guessed from an entry's name. :class:`ServingTarget` describes a server; its
:meth:`ServingTarget.refusal` says why an engine cannot be loaded there, or ``None``.

The builders publish an engine as a Triton entry only when the target accepts it; any other engine
is kept as an artifact outside the model repository (:func:`artifact_root`), labelled with the
runtime it needs. ``inferctl up`` asks the same of every entry before it serves a repository.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from builders.engine import (
    ENGINE_NAME,
    METADATA_NAME,
    RUNTIME_RTX,
    RUNTIME_TRITON,
    EngineMetadata,
    EngineMismatchError,
    read_metadata,
)
from builders.report import file_sha256
from builders.triton_config import is_tensorrt, read_config

__all__ = [
    "DEFAULT_NGC_RELEASE",
    "NGC_TENSORRT",
    "RUNTIME_RTX",
    "RUNTIME_TRITON",
    "ServingTarget",
    "artifact_root",
    "check_repository_engines",
    "engine_refusals",
]

#: TensorRT inside each NGC Triton release the platform deploys (docker/triton.Dockerfile's base)
NGC_TENSORRT = {"24.10": "10.5.0"}
DEFAULT_NGC_RELEASE = "24.10"


def artifact_root(repository: Path) -> Path:
    """Where engines that no Triton of the target loads are kept: beside the repository, never in it
    (Triton loads every folder of its repository with ``--load-model=*``)."""
    return repository.parent / f"{repository.name}-engine-artifacts"


def _release(version: str) -> tuple[str, ...]:
    return tuple(version.split(".")[:3])


@dataclass(frozen=True)
class ServingTarget:
    """A Triton server engines are published for.

    Attributes:
        name: for messages.
        tensorrt_version: the TensorRT its ``tensorrt_plan`` backend links; ``None``: no TensorRT backend.
        compute_capability: its GPU's, e.g. ``"8.9"``; ``None``: no GPU.
    """

    name: str
    tensorrt_version: str | None
    compute_capability: str | None

    @classmethod
    def embedded(cls) -> ServingTarget:
        """The embedded Triton (``nvidia-pytriton``, what ``inferctl up`` runs): Python backend only."""
        return cls("the embedded Triton (no TensorRT backend)", None, None)

    @classmethod
    def ngc(cls, compute_capability: str, release: str = DEFAULT_NGC_RELEASE) -> ServingTarget:
        """The platform's Triton image (NGC ``tritonserver:<release>-py3``) on a GPU of
        ``compute_capability``.

        Raises:
            ValueError: a release whose TensorRT version is not recorded in :data:`NGC_TENSORRT`.
        """
        if release not in NGC_TENSORRT:
            raise ValueError(
                f"unknown NGC Triton release {release!r}; known: {', '.join(sorted(NGC_TENSORRT))}"
            )
        return cls(
            f"NGC Triton {release} (TensorRT {NGC_TENSORRT[release]}) on compute capability "
            f"{compute_capability}",
            NGC_TENSORRT[release],
            compute_capability,
        )

    def refusal(self, meta: EngineMetadata, plan: Path | None = None) -> str | None:
        """Why this server cannot load the engine ``meta`` describes; ``None`` when it can.

        Args:
            meta: the engine's metadata (``engine.json``).
            plan: the plan file; when given, its sha256 must be the one ``meta`` records.
        """
        if plan is not None and (
            not plan.is_file() or (meta.engine_sha256 and file_sha256(plan) != meta.engine_sha256)
        ):
            return f"{plan.name} is missing or is not the plan engine.json describes (sha256)"
        if meta.flavour != "tensorrt":
            return (
                f"built by {meta.flavour} {meta.tensorrt_version}: it runs under the TensorRT-RTX runtime, "
                "which Triton's tensorrt_plan backend is not"
            )
        if self.tensorrt_version is None:
            return f"{self.name} cannot load TensorRT plans"
        problems = []
        if _release(meta.tensorrt_version) != _release(self.tensorrt_version):
            problems.append(
                f"built with TensorRT {meta.tensorrt_version}, {self.name} has {self.tensorrt_version}"
            )
        if (
            self.compute_capability is not None
            and meta.compute_capability != self.compute_capability
        ):
            problems.append(
                f"built for compute capability {meta.compute_capability}, not {self.compute_capability}"
            )
        return "; ".join(problems) or None

    def entry_refusal(self, version_dir: Path) -> str | None:
        """:meth:`refusal` for a published entry's version folder (``engine.json`` + ``model.plan``)."""
        if not (version_dir / METADATA_NAME).is_file():
            return (
                f"no {METADATA_NAME} beside the plan: its TensorRT version and target are unknown"
            )
        return self.refusal(read_metadata(version_dir), version_dir / ENGINE_NAME)


def engine_refusals(
    repository: Path, target: ServingTarget, models: Iterable[str] | None = None
) -> dict[str, str | None]:
    """Every ``tensorrt_plan`` entry (of ``models``, or all) -> why ``target`` cannot load its latest
    version (``None``: it can). Entries are recognised by their config, never by their name."""
    names = (
        sorted(models)
        if models is not None
        else sorted(p.name for p in repository.iterdir() if p.is_dir())
    )
    out: dict[str, str | None] = {}
    for name in names:
        config = repository / name / "config.pbtxt"
        if not config.is_file() or not is_tensorrt(read_config(config)):
            continue
        versions = sorted(
            (p for p in (repository / name).iterdir() if p.is_dir() and p.name.isdigit()),
            key=lambda p: int(p.name),
        )
        out[name] = (
            target.entry_refusal(versions[-1]) if versions else "no version folder with an engine"
        )
    return out


def check_repository_engines(
    repository: Path, target: ServingTarget, models: Iterable[str] | None = None
) -> list[str]:
    """The ``tensorrt_plan`` entries ``target`` loads; refuses a repository holding one it cannot.

    Raises:
        EngineMismatchError: naming each entry and why (its metadata, not its name, says so).
    """
    refusals = engine_refusals(repository, target, models)
    problems = [f"{name}: {reason}" for name, reason in refusals.items() if reason is not None]
    if problems:
        raise EngineMismatchError(f"{target.name} cannot load: " + "; ".join(problems))
    return sorted(refusals)
