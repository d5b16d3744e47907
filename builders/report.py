"""The build report: one JSON file next to every artifact, saying what was built from what."""

from __future__ import annotations

import hashlib
import json
import platform
import sys
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["BuildReport", "REPORT_NAME", "file_sha256", "package_versions"]

REPORT_NAME = "build_report.json"
_TRACKED_PACKAGES = (
    "torch",
    "onnx",
    "onnxruntime",
    "onnxconverter-common",
    "transformers",
    "diffusers",
    "tensorrt-rtx",
)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def package_versions() -> dict[str, str]:
    versions = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in _TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


@dataclass
class BuildReport:
    model: str
    family: str
    version: int
    precision: str = "fp32"
    inputs_hash: str = ""
    weights: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, dict[str, Any]] = field(default_factory=dict)
    parity: dict[str, Any] = field(default_factory=dict)
    timings_s: dict[str, float] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=package_versions)
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    notes: list[str] = field(default_factory=list)
    skipped: bool = False

    def add_artifact(self, role: str, path: Path) -> None:
        self.artifacts[role] = {
            "file": path.name,
            "sha256": file_sha256(path),
            "bytes": path.stat().st_size,
        }

    def artifact_files(self) -> list[str]:
        """The published files, by their path in the version folder."""
        return sorted(
            role if role != "model" else entry["file"] for role, entry in self.artifacts.items()
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    def write(self, directory: Path) -> Path:
        path = directory / REPORT_NAME
        path.write_text(self.to_json() + "\n", encoding="utf-8")
        return path

    @classmethod
    def read(cls, path: Path) -> BuildReport:
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls(**data)
