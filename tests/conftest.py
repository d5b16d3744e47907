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

from builders.pipeline import BuildOptions, build
from serving.launcher import TritonPorts, TritonServer

ROOT = Path(__file__).resolve().parent.parent
TEST_REPOSITORY = Path(os.environ.get("TEST_MODEL_REPOSITORY", ROOT / ".build" / "test-model-repository"))

#: everything the integration tests expect Triton to serve; dependencies are added by the build
TEST_MODELS: tuple[str, ...] = (
    "efficientnet_lite0",
    "resnet50",
    "image_classifier",
    "text_embedding",
    "text_embedding_fp16",
)


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
    loadable = [n for n in names if "tensorrt_plan" not in (model_repository / n / "config.pbtxt").read_text()]
    server = TritonServer(model_repository, models=loadable, ports=TritonPorts.free())
    server.start()
    yield server
    server.stop()
