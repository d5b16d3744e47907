"""What a build hands the pipeline to publish: a verified repository entry or an engine artifact.

Builders build and verify everything in a scratch folder first and return :class:`Publication`
objects; the pipeline publishes them only once every entry of a model succeeded, so a failed build
leaves the repository as it was.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from builders import engine_target as targets
from builders import repository as repo
from builders.report import BuildReport

__all__ = ["Publication", "current_report", "digest_of"]


@dataclass
class Publication:
    """A built and verified entry waiting to be published, or (``config`` and ``artifact`` unset) one
    already current. An ``artifact`` (an engine no Triton of the target loads) goes to
    :func:`builders.engine_target.artifact_root`, never into the model repository."""

    report: BuildReport
    config: mc.ModelConfig | None = None
    files: dict[str, Path] = field(default_factory=dict)
    artifact: bool = False

    def publish(self, repository: Path) -> BuildReport:
        if self.artifact:
            repo.publish_artifact(
                targets.artifact_root(repository), self.report.model, self.files, self.report
            )
            # An entry of this name published as a Triton model before (an engine Triton cannot load)
            # would fail to load under --load-model=*: it goes.
            repo.remove_entry(repository, self.report.model)
        elif self.config is not None:
            repo.publish(repository, self.config, self.files, self.report)
        return self.report


def digest_of(*parts: object) -> str:
    """A stable hash of ``parts`` (their reprs), for build input hashes."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(repr(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()


def current_report(repository: Path, name: str, digest: str) -> BuildReport | None:
    """The latest published report of ``name`` if it was built from ``digest`` (marked skipped), else None."""
    previous = repo.latest_report(repository, name)
    if previous is not None and previous.inputs_hash == digest:
        previous.skipped = True
        return previous
    return None
