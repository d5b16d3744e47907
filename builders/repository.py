"""Versioned entries in a Triton model repository, published atomically.

An entry is staged beside the repository and moved into place only once it is complete, so a failed
build never leaves a half-written model where Triton (or a later promotion) would find it.

A version can also be published *unfinished*: its folder carries an :data:`UNFINISHED` marker from
the moment it appears until :func:`mark_finished` removes it (the commit). Promotion publishes
version N+1 that way, so a rollout that dies half-way leaves a version nothing takes for production:

- :func:`versions` (and so :func:`latest_version`, the builders' next version number and the pruning
  of old versions) skips it;
- the entry's ``config.pbtxt`` on disk serves only finished versions while it is there (those its
  own policy picks among them, as ``version_policy: specific``), so a Triton that starts on the
  repository (a restarted pod, ``--load-model=*``) loads N, never N+1. The configuration to restore
  is the marker's content; :func:`mark_finished` writes it back, then removes the marker;
- :func:`discard_unfinished` (run by ``inferctl up`` before Triton starts, and by the next promotion
  after it has taken the version out of service) restores the configuration and removes the folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from builders.report import REPORT_NAME, BuildReport
from builders.triton_config import read_config, write_config
from serving.model_card import PARAM_CREATED

__all__ = [
    "UNFINISHED",
    "discard_unfinished",
    "discard_version",
    "latest_report",
    "latest_version",
    "mark_finished",
    "publish",
    "publish_artifact",
    "remove_entry",
    "replace_folder",
    "staged_folder",
    "unfinished_versions",
    "versions",
]

#: file in a version folder whose rollout has not finished (see the module docstring)
UNFINISHED = "UNFINISHED"


def _version_dirs(repository: Path, name: str) -> list[Path]:
    entry = repository / name
    if not entry.is_dir():
        return []
    return sorted(
        (p for p in entry.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)
    )


def versions(repository: Path, name: str) -> list[int]:
    """The finished versions of ``name``, oldest first (unfinished ones are not versions yet)."""
    return [int(p.name) for p in _version_dirs(repository, name) if not (p / UNFINISHED).exists()]


def unfinished_versions(repository: Path, name: str) -> list[int]:
    """Versions of ``name`` published unfinished and not (yet) marked finished."""
    return [int(p.name) for p in _version_dirs(repository, name) if (p / UNFINISHED).exists()]


def _served(policy: mc.ModelVersionPolicy, finished: list[int]) -> list[int]:
    """The versions ``policy`` serves when only the ``finished`` ones exist (Triton's default: newest one)."""
    kind = policy.WhichOneof("policy_choice")
    if kind == "all":
        return finished
    if kind == "specific":
        return [v for v in policy.specific.versions if v in finished]
    newest = policy.latest.num_versions if kind == "latest" else 1
    return finished[-newest:]


def _restore_config(repository: Path, name: str, version: int) -> None:
    """Write back the configuration an unfinished version's marker keeps (a no-op without one)."""
    marker = repository / name / str(version) / UNFINISHED
    if not marker.exists():
        return
    staging = repository / name / ".config.pbtxt.restore"
    write_config(read_config(marker), staging)
    os.replace(staging, repository / name / "config.pbtxt")


def mark_finished(repository: Path, name: str, version: int) -> None:
    """Make an unfinished version a version: its configuration back on disk (serving the newest
    versions again, this one included), then its marker removed (a no-op when it has none)."""
    _restore_config(repository, name, version)
    (repository / name / str(version) / UNFINISHED).unlink(missing_ok=True)


def discard_version(repository: Path, name: str, version: int) -> bool:
    """Remove an unfinished version: the configuration restored first, then the folder.

    Returns:
        Whether there was such a folder.

    Raises:
        ValueError: ``version`` is a finished version (those are never removed here).
    """
    folder = repository / name / str(version)
    if not folder.exists():
        return False
    if not (folder / UNFINISHED).exists():
        raise ValueError(f"{folder} is a finished version; not removing it")
    _restore_config(repository, name, version)
    shutil.rmtree(folder)
    return True


def discard_unfinished(repository: Path, names: Iterable[str] | None = None) -> list[Path]:
    """Remove every unfinished version folder (of ``names``, or of every entry).

    Only safe while no Triton serves those versions: ``inferctl up`` calls it before starting Triton,
    a promotion after unloading them.

    Returns:
        The folders removed.
    """
    if names is None:
        names = (
            sorted(p.name for p in repository.iterdir() if p.is_dir())
            if repository.is_dir()
            else []
        )
    removed = []
    for name in names:
        for version in unfinished_versions(repository, name):
            discard_version(repository, name, version)
            removed.append(repository / name / str(version))
    return removed


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
    unfinished: bool = False,
) -> Path:
    """Write ``files`` as version ``report.version`` of ``config.name`` plus its config and report.

    Args:
        files: destination name inside the version folder -> file to copy there.
        keep_versions: older versions beyond this many are pruned (rollback needs a few).
        unfinished: the version appears with the :data:`UNFINISHED` marker already inside it, and the
            entry's configuration serves only the finished versions until :func:`mark_finished`.

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
            # Readable by the server whatever user it runs as (ONNX writes external data as 0600).
            target.chmod(0o644)
            # Every file is hashed in the report: the model file as "model", the rest (ONNX external
            # data, weights folders, tokenizer files) by their path in the version folder.
            report.add_artifact(
                "model" if dest.startswith("model.") and not dest.endswith(".data") else dest,
                target,
            )
        report.write(version_dir)
        published = mc.ModelConfig()
        published.CopyFrom(config)
        # Clients see this as the model's creation time (OpenAI's ``created``); Triton has no such field.
        published.parameters[PARAM_CREATED].string_value = str(int(time.time()))
        finished = versions(repository, config.name)
        if unfinished:
            # The marker keeps the configuration to restore; until then the one on disk serves only
            # the finished versions (see the module docstring).
            write_config(published, version_dir / UNFINISHED)
            if finished:
                published.version_policy.CopyFrom(
                    mc.ModelVersionPolicy(
                        specific=mc.ModelVersionPolicy.Specific(
                            versions=_served(config.version_policy, finished)
                        )
                    )
                )
        write_config(published, staging / "config.pbtxt")

        entry.mkdir(exist_ok=True)
        replace_folder(version_dir, entry / str(report.version))
        # The config goes last: until then Triton keeps serving what was there before.
        os.replace(staging / "config.pbtxt", entry / "config.pbtxt")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return _keep_newest(repository, config.name, report.version, keep_versions)


def publish_artifact(
    root: Path, name: str, files: Mapping[str, Path], report: BuildReport, *, keep_versions: int = 3
) -> Path:
    """Write ``files`` and the report as version ``report.version`` of ``name`` under ``root``: a build
    output that is not a Triton entry (no config; ``root`` is never a model repository).

    Returns:
        The version folder.
    """
    entry = root / name
    entry.mkdir(parents=True, exist_ok=True)
    with staged_folder(entry / str(report.version), within=root, prefix=f".{name}-") as staging:
        for dest, source in files.items():
            shutil.copy2(source, staging / dest)
            if dest.startswith("model."):
                report.add_artifact("model", staging / dest)
        report.write(staging)
    return _keep_newest(root, name, report.version, keep_versions)


def replace_folder(source: Path, final: Path) -> None:
    """Move the folder ``source`` to ``final``, replacing whatever is there (``os.replace`` moves a
    folder onto a missing or empty one only)."""
    if final.exists():
        shutil.rmtree(final)
    os.replace(source, final)


@contextlib.contextmanager
def staged_folder(final: Path, *, within: Path, prefix: str) -> Iterator[Path]:
    """A new folder in ``within`` for the block to fill: it becomes ``final`` (replacing it) when the
    block ends without an error, and is removed if it fails, so ``final`` is never half-written."""
    staging = Path(tempfile.mkdtemp(prefix=prefix, dir=within))
    try:
        yield staging
        replace_folder(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _keep_newest(root: Path, name: str, version: int, keep_versions: int) -> Path:
    """Prune ``name``'s finished versions beyond the newest ``keep_versions``; ``version``'s folder."""
    for old in versions(root, name)[:-keep_versions]:
        shutil.rmtree(root / name / str(old), ignore_errors=True)
    return root / name / str(version)


def remove_entry(repository: Path, name: str) -> bool:
    """Remove the entry ``name`` (config and versions) from ``repository``; whether there was one."""
    entry = repository / name
    if not entry.is_dir():
        return False
    shutil.rmtree(entry)
    return True
