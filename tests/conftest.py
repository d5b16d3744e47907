"""Session fixtures shared by every test: a real built model repository and a real Triton server.

The repository is built once into ``.build/test-model-repository`` and reused across runs (builds
are hashed, so only what changed is rebuilt). Triton is the real binary from the nvidia-pytriton
wheel, on free ports bound to 127.0.0.1.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from builders.families.diffusion import PIPELINE, TORCH_PIPELINE, write_tiny_checkpoint
from builders.pipeline import BuildOptions, build
from builders.triton_config import is_tensorrt, read_config
from serving.launcher import TritonPorts, TritonServer
from tests.support.repository import TEST_MODELS, TEST_REPOSITORY


@pytest.fixture(scope="session", autouse=True)
def _private_build_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Commands the tests run (``inferctl build``/``up``, in process or not) keep builds in a cache
    of this session, never in the user's ``~/.cache`` (builders/build_cache.py)."""
    from builders.build_cache import CACHE_ENV

    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("build-cache"))
    yield
    if before is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = before


@pytest.fixture(scope="session")
def model_repository() -> Path:
    """The test model repository, built for real from the PyTorch models."""
    reports = build(TEST_MODELS, BuildOptions(repository=TEST_REPOSITORY))
    assert {r.model for r in reports} >= set(TEST_MODELS)
    return TEST_REPOSITORY


@pytest.fixture(scope="session")
def triton(model_repository: Path) -> Iterator[TritonServer]:
    """A real Triton server serving every entry of the test repository."""
    names = sorted(p.name for p in model_repository.iterdir() if (p / "config.pbtxt").exists())
    # The embedded server has no TensorRT backend: engine entries are built but not served here.
    loadable = [
        n for n in names if not is_tensorrt(read_config(model_repository / n / "config.pbtxt"))
    ]
    server = TritonServer(model_repository, models=loadable, ports=TritonPorts.free())
    server.start()
    yield server
    server.stop()


SD_MODELS = ("sd_text_encoder", "sd_unet", "sd_vae_decoder", PIPELINE, TORCH_PIPELINE)


@pytest.fixture(scope="session")
def sd_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny, seeded, randomly initialised Stable Diffusion checkpoint folder (diffusers layout)."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("sd-checkpoint") / "tiny-sd", seed=0)


@pytest.fixture(scope="session")
def sd_repository(sd_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``stable_diffusion`` over its three ONNX networks (and ``sd_unet_fp16``), and
    ``stable_diffusion_torch`` (the networks in process; FP32 on a CPU), built for real from the
    tiny checkpoint."""
    repository = tmp_path_factory.mktemp("sd-repo") / "model_repository"
    reports = build(
        [PIPELINE, TORCH_PIPELINE],
        BuildOptions(repository=repository, weights={PIPELINE: str(sd_checkpoint)}),
    )
    assert {r.model for r in reports} == {*SD_MODELS, "sd_unet_fp16"}
    for report in reports:
        if report.model != PIPELINE:
            assert (
                report.weights["pretrained"] is False
                and "tiny random-init" in report.weights["note"]
            )
    return repository


@pytest.fixture(scope="session")
def sd_triton(sd_repository: Path) -> Iterator[TritonServer]:
    """A real Triton serving the tiny Stable Diffusion pipelines (BLS over ONNX, and torch in process)."""
    with TritonServer(sd_repository, models=list(SD_MODELS), ports=TritonPorts.free()) as server:
        yield server
