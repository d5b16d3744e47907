"""The benchmark's model repository: the entry under test and its twin with dynamic batching off."""

from __future__ import annotations

import shutil
from pathlib import Path

from loadtest.bench.settings import DEFAULT_BUILD_REPOSITORY, NOBATCH_SUFFIX, BenchSettings

__all__ = ["copy_pipeline", "model_file", "prepare_repository", "tensor_names"]


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
            build_torchscript(
                source_repo,
                settings.model,
                TorchScriptOptions(gpu=False, precision="fp16", device="cuda"),
            )
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


def copy_pipeline(settings: BenchSettings, target: Path, pipeline: str) -> list[str]:
    """Copy the ensemble ``pipeline`` and its steps (the entry under test among them) into ``target``.

    Returns:
        The names copied, the ensemble first.

    Raises:
        RuntimeError: the source repository has no such ensemble.
    """
    from builders.triton_config import read_config

    source_repo = settings.repository or DEFAULT_BUILD_REPOSITORY
    if not (source_repo / pipeline / "config.pbtxt").exists():
        raise RuntimeError(
            f"the JPEG configurations need {pipeline} in {source_repo}: build the default models "
            "(inferctl build) or pass --repository with a built repository"
        )
    steps = [
        step.model_name
        for step in read_config(source_repo / pipeline / "config.pbtxt").ensemble_scheduling.step
    ]
    if _entry_name(settings) not in steps:
        raise RuntimeError(
            f"{pipeline} in {source_repo} runs {', '.join(steps)}, not {_entry_name(settings)}: "
            "the JPEG and tensor configurations would compare different models"
        )
    names = [pipeline, *steps]
    for name in names:
        shutil.copytree(source_repo / name, target / name, symlinks=True, dirs_exist_ok=True)
    return names


def model_file(repository: Path, name: str) -> Path:
    from builders.triton_config import read_config

    config = read_config(repository / name / "config.pbtxt")
    versions = sorted(
        int(p.name) for p in (repository / name).iterdir() if p.is_dir() and p.name.isdigit()
    )
    return repository / name / str(versions[-1]) / (config.default_model_filename or "model.onnx")


def tensor_names(repository: Path, name: str) -> tuple[str, str]:
    from builders.triton_config import read_config

    config = read_config(repository / name / "config.pbtxt")
    return config.input[0].name, config.output[0].name
