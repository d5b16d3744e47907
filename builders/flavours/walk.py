"""The one build path: a flavour's steps, walked in order for one model.

    current? -> load -> export -> verify -> entry -> variants -> publish      (build_model)
    current? -> produce -> publish                                           (build_asset)

An entry whose input hash matches its newest published version is not rebuilt; when its variants are
current too, nothing is loaded. Everything is made in a scratch folder and verified first: the entry
and its variants are published only once all of them succeeded, so a failure leaves the repository
as it was. An asset (a Python-backend model or an ensemble) has no module: it is published as its
spec declares it, plus what its ``produce`` step makes (and checks) in the scratch folder.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from builders import repository as repo
from builders.flavours.base import ArtifactT, BuildRun, Flavour, ParentEntry, next_version
from builders.publication import Publication, current_report
from builders.report import BuildReport
from builders.spec import AssetSpec, ModelSpec

__all__ = ["build_asset", "build_model"]


def build_model(
    spec: ModelSpec,
    flavour: Flavour[ArtifactT],
    run: BuildRun,
    *,
    digest: str | None = None,
) -> list[BuildReport]:
    """Build ``spec`` as ``flavour`` into ``run.repository`` unless it is current.

    Args:
        digest: the entry's input hash when the caller has it already (default: the flavour's).

    Returns:
        The entry's report first (``skipped`` when it was current), then its variants'.

    Raises:
        BuildError: a step failed (export, parity, a variant); nothing of this model is published.
    """
    name = flavour.entry_name(spec)
    digest = digest if digest is not None else flavour.digest(spec)
    previous = None if run.force or digest is None else current_report(run.repository, name, digest)
    if previous is not None:
        current = flavour.current_variants(spec, digest or "", run)
        if current is not None:
            return [previous, *current]
    run.status(f"{name}: loading weights")
    loaded = flavour.load(spec)
    with tempfile.TemporaryDirectory(prefix=f"build-{name}-") as tmp:
        workdir = Path(tmp)
        artifact: ArtifactT | None = None
        if previous is None:
            run.status(f"{name}: {flavour.exporting}")
            artifact = flavour.export(spec, loaded, workdir, run)
            run.status(f"{name}: checking parity")
            parity = flavour.verify(spec, loaded, artifact)
            main = flavour.entry(spec, loaded, artifact, parity, digest or "", run)
        else:
            # Only variants are missing: they derive from the entry that is being served.
            main = Publication(previous)
        # Variants and engines are built and verified before anything is published.
        parent = ParentEntry(main.report, digest or "", artifact)
        pending = flavour.variants(spec, loaded, parent, workdir, run)
        run.status(f"{name}: publishing")
        return [main.publish(run.repository), *(p.publish(run.repository) for p in pending)]


def build_asset(spec: AssetSpec, run: BuildRun, digest: str) -> BuildReport:
    """Publish ``spec`` into ``run.repository`` unless its newest version was built from ``digest``.

    Returns:
        Its report (``skipped`` when it was current).

    Raises:
        BuildError: its ``produce`` step failed (a check of what it made); nothing is published.
    """
    previous = None if run.force else current_report(run.repository, spec.name, digest)
    if previous is not None:
        return previous
    report = BuildReport(
        model=spec.name,
        family=spec.family,
        version=next_version(run.repository, spec.name),
        precision="n/a",
        inputs_hash=digest,
    )
    if spec.produce is None:
        repo.publish(run.repository, spec.config, spec.files, report)
        return report
    with tempfile.TemporaryDirectory(prefix=f"build-{spec.name}-") as tmp:
        made = spec.produce(Path(tmp), run.status)
        report.precision, report.weights, report.parity = made.precision, made.weights, made.parity
        report.timings_s, report.notes = made.timings_s, made.notes
        run.status(f"{spec.name}: publishing")
        repo.publish(run.repository, spec.config, {**spec.files, **made.files}, report)
    return report
