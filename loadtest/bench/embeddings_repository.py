"""The embeddings benchmark's repository: the text pipeline built (its encoder ONNX or TorchScript)
and copied with one ensemble and encoder per variant under test (:mod:`loadtest.bench.embeddings`
runs them)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "DEFAULT_REPOSITORY",
    "ENCODER",
    "ENSEMBLE",
    "STEPS",
    "build_source",
    "prepare_repository",
    "variant_name",
]

ENSEMBLE, ENCODER, STEPS = "text_embedding", "minilm_encoder", ("text_tokenizer", "text_pooling")
DEFAULT_REPOSITORY = Path(".build") / "bench-embeddings-repository"


def variant_name(label: str) -> str:
    """The suffix of a variant's ensemble and encoder names: ``buckets=16,32`` -> ``b16_32``."""
    return (
        label.replace("buckets=", "b")
        .replace("cost=", "c")
        .replace(",", "_")
        .replace(" ", "")
        .replace("-", "_")
    )


def prepare_repository(
    source: Path,
    target: Path,
    variants: Sequence[tuple[str, bool, dict[str, str]]],
    threads: int = 0,
) -> dict[str, str]:
    """Copy the built text pipeline into ``target`` and add one ensemble + encoder per variant.

    Args:
        variants: ``(label, ragged, parameters)``: the encoder's ragged flag and config parameters to set
            (an empty value removes the parameter).
        threads: the encoders' ONNX Runtime intra-op threads (0: the runtime's default, the cores).

    Returns:
        label -> ensemble name (``triton`` -> ``text_embedding``).
    """
    from builders.triton_config import read_config, write_config

    if target.exists():
        shutil.rmtree(target)
    for name in (ENSEMBLE, ENCODER, *STEPS):
        shutil.copytree(source / name, target / name, symlinks=True)
    built = read_config(target / ENCODER / "config.pbtxt")
    built.parameters["intra_op_thread_count"].string_value = str(threads)
    write_config(built, target / ENCODER / "config.pbtxt")
    names = {"triton": ENSEMBLE}
    for label, ragged, parameters in variants:
        suffix = "__" + variant_name(label)
        encoder = read_config(target / ENCODER / "config.pbtxt")
        encoder.name = ENCODER + suffix
        for message in encoder.input:
            message.allow_ragged_batch = ragged
        for key, value in parameters.items():
            if value:
                encoder.parameters[key].string_value = value
            elif key in encoder.parameters:
                del encoder.parameters[key]
        shutil.copytree(
            target / ENCODER, target / encoder.name, ignore=shutil.ignore_patterns("config.pbtxt")
        )
        write_config(encoder, target / encoder.name / "config.pbtxt")
        ensemble = read_config(target / ENSEMBLE / "config.pbtxt")
        ensemble.name = ENSEMBLE + suffix
        for step in ensemble.ensemble_scheduling.step:
            if step.model_name == ENCODER:
                step.model_name = encoder.name
        (target / ensemble.name).mkdir()
        for version in (p for p in (target / ENSEMBLE).iterdir() if p.is_dir()):
            shutil.copytree(version, target / ensemble.name / version.name)
        write_config(ensemble, target / ensemble.name / "config.pbtxt")
        names[label] = ensemble.name
    return names


def build_source(repository: Path, encoder: str, device: str = "cpu") -> Path:
    """The text pipeline built into ``repository``, its encoder an ONNX or a TorchScript entry.

    ``torchscript``: the encoder traced (FP32) and served by the ``pytorch`` backend on ``device``,
    under the ONNX encoder's name and tensor names, ragged as the ONNX one is: how the pipeline runs
    on a GPU host, which has no onnxruntime-gpu for its CUDA (see the README's known limits).
    """
    from builders.families.text_embedding import (
        GPU_RUN_COST,
        RUN_COST,
        MiniLMEncoder,
        embedding_spec,
    )
    from builders.pipeline import BuildOptions, build

    if encoder == "onnx":
        build([ENSEMBLE], BuildOptions(repository=repository, variants=False))
        return repository
    from builders.torchscript import TorchScriptOptions, build_torchscript
    from builders.triton_config import read_config, write_config

    build(list(STEPS), BuildOptions(repository=repository, variants=False))
    name = ENCODER + "_torchscript"
    build_torchscript(
        repository, ENCODER, TorchScriptOptions(precision="fp32", device=device, name=name)
    )
    spec = MiniLMEncoder()
    config = read_config(repository / name / "config.pbtxt")
    config.name = ENCODER
    for message, tensor in zip(config.input, spec.inputs, strict=True):
        message.name, message.allow_ragged_batch = tensor.name, tensor.name in spec.ragged_inputs
    config.output[0].name = spec.outputs[0].name
    config.parameters["ragged_run_cost"].string_value = str(
        GPU_RUN_COST if device == "cuda" else RUN_COST
    )
    shutil.rmtree(repository / ENCODER, ignore_errors=True)
    (repository / name).rename(repository / ENCODER)
    write_config(config, repository / ENCODER / "config.pbtxt")
    ensemble = embedding_spec().config
    shutil.rmtree(repository / ENSEMBLE, ignore_errors=True)
    (repository / ENSEMBLE / "1").mkdir(parents=True)
    write_config(ensemble, repository / ENSEMBLE / "config.pbtxt")
    return repository
