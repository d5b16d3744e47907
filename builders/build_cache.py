"""Builds reused across repositories by their inputs' hash: a content-addressed cache of entries.

Within one repository a build whose inputs hash matches the published version is skipped
(:mod:`builders.pipeline`). This cache extends that to every repository of the machine: a fresh
checkout, a second ``--repository``, a CI workspace. After a spec is built, the entries it published
(the model and, for a model spec, its precision variants) are copied to
``<cache>/<spec name>/<inputs hash>/<entry>/`` (``config.pbtxt`` plus the version folder); before a
spec is built, a group matching its inputs hash is published into the repository as the entry's next
version, and the usual up-to-date check then finds it. Nothing here knows a model family: whatever a
spec publishes is what is kept.

Not cached: TensorRT engines (their artifacts live beside the repository and depend on the GPU), and
forced builds. The newest :data:`KEEP_PER_SPEC` groups of each spec are kept. The cache lives in
``$TRITON_PLATFORM_BUILD_CACHE``, else ``$XDG_CACHE_HOME/triton-platform/builds`` (``~/.cache``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from builders import repository as repo
from builders.report import REPORT_NAME, BuildReport
from builders.triton_config import read_config

__all__ = ["CACHE_ENV", "KEEP_PER_SPEC", "BuildCache", "default_cache_dir"]

CACHE_ENV = "TRITON_PLATFORM_BUILD_CACHE"
KEEP_PER_SPEC = 3
_OWN = ".own"  # marks the group's entry that is the spec's own (the others are its variants)


def default_cache_dir() -> Path:
    """``$TRITON_PLATFORM_BUILD_CACHE``, else ``$XDG_CACHE_HOME/triton-platform/builds``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "triton-platform" / "builds"


@dataclass(frozen=True)
class BuildCache:
    """The cache under ``root`` (created on first store)."""

    root: Path

    def _group(self, spec_name: str, digest: str) -> Path:
        return self.root / spec_name / digest

    def restore(
        self, repository: Path, spec_name: str, digest: str, *, variants: bool
    ) -> list[str]:
        """Publish the cached entries of ``spec_name`` built from ``digest`` that ``repository`` lacks.

        Args:
            repository: the model repository.
            spec_name: the spec (its own entry is restored; its variants only with ``variants``).
            digest: the spec's inputs hash.
            variants: also restore the variant entries kept with it.

        Returns:
            The entries published, each as the next version of its name.
        """
        group = self._group(spec_name, digest)
        if not group.is_dir():
            return []
        restored = []
        for cached in sorted(p for p in group.iterdir() if p.is_dir()):
            if not variants and not (cached / _OWN).exists():
                continue
            report_path = next(cached.glob(f"*/{REPORT_NAME}"))
            report = BuildReport.read(report_path)
            current = repo.latest_report(repository, cached.name)
            if current is not None and current.inputs_hash == report.inputs_hash:
                continue  # already served here
            version_dir = report_path.parent
            files = {
                str(p.relative_to(version_dir)): p
                for p in sorted(version_dir.rglob("*"))
                if p.is_file() and p.name != REPORT_NAME
            }
            report.version = (repo.latest_version(repository, cached.name) or 0) + 1
            report.notes = [*report.notes, "restored from the build cache (same inputs hash)"]
            repo.publish(repository, read_config(cached / "config.pbtxt"), files, report)
            restored.append(cached.name)
        os.utime(group)  # recently used: pruning keeps it
        return restored

    def store(
        self, repository: Path, spec_name: str, digest: str, reports: Iterable[BuildReport]
    ) -> None:
        """Keep the entries ``reports`` published for ``spec_name`` (built from ``digest``).

        Args:
            repository: where they were published.
            spec_name: the spec built.
            digest: its inputs hash.
            reports: the step's reports, up-to-date ones included (a repository built before the cache
                fills it); entries outside the repository (engine artifacts) are left out. A group
                already kept is not copied again unless something in the step was built.
        """
        reports = list(reports)
        entries = [
            r
            for r in reports
            if (repository / r.model / "config.pbtxt").is_file()
            and (repository / r.model / str(r.version)).is_dir()
        ]
        group = self._group(spec_name, digest)
        if not entries or (group.is_dir() and all(r.skipped for r in reports)):
            return
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / spec_name).mkdir(exist_ok=True)
        with repo.staged_folder(
            group, within=self.root / spec_name, prefix=f".{spec_name}-"
        ) as staging:
            for report in entries:
                target = staging / report.model
                target.mkdir()
                shutil.copy2(repository / report.model / "config.pbtxt", target / "config.pbtxt")
                shutil.copytree(
                    repository / report.model / str(report.version), target / str(report.version)
                )
                if report.model == spec_name:
                    (target / _OWN).touch()
        self._prune(spec_name)

    def _prune(self, spec_name: str) -> None:
        groups = sorted(
            (
                p
                for p in (self.root / spec_name).iterdir()
                if p.is_dir() and not p.name.startswith(".")
            ),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        for old in groups[KEEP_PER_SPEC:]:
            shutil.rmtree(old, ignore_errors=True)
