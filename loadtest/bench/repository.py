"""The benchmark's model repository: the entry under test and its twin with dynamic batching off."""

from __future__ import annotations

import shutil
from pathlib import Path

from loadtest.bench.settings import DEFAULT_BUILD_REPOSITORY, NOBATCH_SUFFIX, BenchSettings

__all__ = ["model_file", "prepare_repository", "tensor_names"]


def _entry_name(settings: BenchSettings) -> str:
    if settings.device == "cuda":
        from builders.torchscript import torchscript_name

        return torchscript_name(settings.model)
    return settings.model


def prepare_repository(settings: BenchSettings, target: Path) -> tuple[str, str]:
    """Lay out the bench repository in ``target``: the entry and its copy without dynamic batching.

    Returns:
        ``(batching entry, no-batching entry)`` names.
    """
    from builders.triton_config import read_config, write_config

    source_repo = settings.repository or DEFAULT_BUILD_REPOSITORY
    name = _entry_name(settings)
    if not (source_repo / name / "config.pbtxt").exists():
        if settings.device == "cuda":
            from builders.torchscript import TorchScriptOptions, build_torchscript

            # A CPU instance computing on CUDA: see TorchScriptOptions.device for why.
            build_torchscript(source_repo, settings.model, TorchScriptOptions(gpu=False, precision="fp16", device="cuda"))
        else:
            from builders.pipeline import BuildOptions, build

            build([settings.model], BuildOptions(repository=source_repo, variants=False))
    target.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source_repo / name, target / name, symlinks=True, dirs_exist_ok=True)
    config = read_config(target / name / "config.pbtxt")
    nobatch_name = name + NOBATCH_SUFFIX
    config.name = nobatch_name
    config.ClearField("dynamic_batching")
    (target / nobatch_name).mkdir(exist_ok=True)
    for version in (p for p in (target / name).iterdir() if p.is_dir() and p.name.isdigit()):
        shutil.copytree(version, target / nobatch_name / version.name, dirs_exist_ok=True)
    write_config(config, target / nobatch_name / "config.pbtxt")
    return name, nobatch_name


def model_file(repository: Path, name: str) -> Path:
    from builders.triton_config import read_config

    config = read_config(repository / name / "config.pbtxt")
    versions = sorted(int(p.name) for p in (repository / name).iterdir() if p.is_dir() and p.name.isdigit())
    return repository / name / str(versions[-1]) / (config.default_model_filename or "model.onnx")


def tensor_names(repository: Path, name: str) -> tuple[str, str]:
    from builders.triton_config import read_config

    config = read_config(repository / name / "config.pbtxt")
    return config.input[0].name, config.output[0].name
