"""Fixtures for the load-test smoke tests: a real Triton with the image models, the real gateway.

The session-wide ``triton`` fixture loads every test model (text embeddings and precision variants
too), which takes minutes on two shared cores; these smokes only need the image models, so they
build (hashed, usually already up to date) and serve just those, from the same test repository.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from builders.pipeline import BuildOptions, build
from loadtest.bench.servers import gateway_server
from serving.launcher import TritonPorts, TritonServer
from tests.support.repository import TEST_REPOSITORY

#: what the scenarios and the bench smoke call: the classifier tensors and the JPEG ensemble
LOADTEST_MODELS = (
    "efficientnet_lite0",
    "image_preprocess",
    "image_postprocess",
    "image_classifier",
)


@pytest.fixture(scope="session")
def loadtest_repository() -> Path:
    build(
        ["efficientnet_lite0", "image_classifier"],
        BuildOptions(repository=TEST_REPOSITORY, variants=False),
    )
    return TEST_REPOSITORY


@pytest.fixture(scope="module")
def loadtest_triton(loadtest_repository: Path) -> Iterator[TritonServer]:
    with TritonServer(
        loadtest_repository, models=list(LOADTEST_MODELS), ports=TritonPorts.free()
    ) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(
    loadtest_triton: TritonServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """The gateway as a subprocess, with a high-limit key and a free-tier key.

    Yields ``{"url", "key", "free_key", "metrics_token"}``.
    """
    from gateway.tenancy.keys_sqlite import SqliteKeyStore

    workdir = tmp_path_factory.mktemp("gateway")
    with gateway_server(loadtest_triton.http_url, workdir) as (url, key, metrics_token):
        _, free_key = SqliteKeyStore(Path(workdir) / "gateway_keys.sqlite3").create(
            "loadtest-free", ["*"], "free"
        )
        yield {"url": url, "key": key, "free_key": free_key, "metrics_token": metrics_token}
