"""Versioned entries in a Triton model repository, published atomically.

An entry is staged beside the repository and moved into place only once it is complete, so a failed
build never leaves a half-written model where Triton (or a later promotion) would find it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from builders.report import REPORT_NAME, BuildReport
from builders.triton_config import write_config

__all__ = ["latest_report", "latest_version", "publish", "versions"]


def versions(repository: Path, name: str) -> list[int]:
    entry = repository / name
    if not entry.is_dir():
        return []
    return sorted(int(p.name) for p in entry.iterdir() if p.is_dir() and p.name.isdigit())


def latest_version(repository: Path, name: str) -> int | None:
    found = versions(repository, name)
    return found[-1] if found else None


def latest_report(repository: Path, name: str) -> BuildReport | None:
    version = latest_version(repository, name)
    if version is None:
        return None
    path = repository / name / str(version) / REPORT_NAME
    return BuildReport.read(path) if path.exists() else None


def publish(
    repository: Path,
    config: mc.ModelConfig,
    files: Mapping[str, Path],
    report: BuildReport,
    *,
    keep_versions: int = 3,
) -> Path:
    """Write ``files`` as version ``report.version`` of ``config.name`` plus its config and report.

    Args:
        files: destination name inside the version folder -> file to copy there.
        keep_versions: older versions beyond this many are pruned (rollback needs a few).

    Returns:
        The published version folder.
    """
    repository.mkdir(parents=True, exist_ok=True)
    entry = repository / config.name
    staging = Path(tempfile.mkdtemp(prefix=f".{config.name}-", dir=repository.parent))
    try:
        version_dir = staging / str(report.version)
        version_dir.mkdir()
        for dest, source in files.items():
            target = version_dir / dest
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
            if dest.startswith("model."):
                report.add_artifact("model", target)
        report.write(version_dir)
        write_config(config, staging / "config.pbtxt")

        entry.mkdir(exist_ok=True)
        final = entry / str(report.version)
        if final.exists():
            shutil.rmtree(final)
        os.replace(version_dir, final)
        # The config goes last: until then Triton keeps serving what was there before.
        os.replace(staging / "config.pbtxt", entry / "config.pbtxt")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for old in versions(repository, config.name)[:-keep_versions]:
        shutil.rmtree(entry / str(old), ignore_errors=True)
    return entry / str(report.version)
