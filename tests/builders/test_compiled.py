"""The compiled flavours: the inductor one built, checked and served on the CPU (the GPU's is run by
the GPU benchmark); AOTInductor refused without a GPU, and on one built, checked and served."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as http

from builders.compiled import CompiledFlavour, compiled_name, publish_compiled
from builders.errors import BuildError
from builders.report import BuildReport
from loadtest.bench.gpu_sanity import served_in_batches
from serving.launcher import TritonPorts, TritonServer
from tests.support.gpu_repo import cuda_available
from tests.support.reference import sample_reference

SOURCE = "efficientnet_lite0"
NAME = compiled_name(SOURCE, "aoti")
CPU_NAME = "efficientnet_lite0_inductor_cpu"


def _served(server: TritonServer, name: str, images: np.ndarray, max_batch: int) -> np.ndarray:
    with http.InferenceServerClient(server.http_url) as client:
        return served_in_batches(client, name, images, max_batch)


@pytest.mark.skipif(cuda_available(), reason="checks the refusal on a machine without a GPU")
def test_refused_without_a_gpu(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="no CUDA device"):
        publish_compiled(tmp_path, CompiledFlavour(SOURCE, "aoti", max_batch=8))
    assert not (tmp_path / NAME).exists()


def test_refusals_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="unknown flavour 'tensorrt'"):
        publish_compiled(tmp_path, CompiledFlavour(SOURCE, "tensorrt", "cpu"))
    with pytest.raises(BuildError, match="aoti flavour is built for a GPU"):
        publish_compiled(tmp_path, CompiledFlavour(SOURCE, "aoti", "cpu"))
    assert not any(tmp_path.iterdir())


@pytest.fixture(scope="module")
def cpu_compiled_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    repository = tmp_path_factory.mktemp("inductor-repository")
    publish_compiled(
        repository, CompiledFlavour(SOURCE, "inductor", "cpu", name=CPU_NAME, max_batch=8)
    )
    with TritonServer(repository, models=[CPU_NAME], ports=TritonPorts.free()) as server:
        yield server


@pytest.mark.integration
@pytest.mark.slow
def test_inductor_entry_serves_the_pytorch_outputs_on_the_cpu(
    cpu_compiled_triton: TritonServer,
) -> None:
    entry = Path(cpu_compiled_triton.repository) / CPU_NAME
    version = sorted(p for p in entry.iterdir() if p.is_dir())[-1]
    assert (version / "exported.pt2").is_file()
    report = BuildReport.read(version / "build_report.json")
    assert report.parity["logits"]["top1_agreement"] == 1.0 and "compile" in report.timings_s
    assert any("torch.compile" in note for note in report.notes)
    images, expected = sample_reference("efficientnet_lite0")
    served = _served(cpu_compiled_triton, CPU_NAME, images, 8)
    assert (served.argmax(1) == expected.argmax(1)).all()
    assert (
        np.abs(served - expected).max() < 1e-3
    )  # FP32: Inductor's fused kernels round differently


@pytest.fixture(scope="module", params=["inductor", "aoti"])
def compiled_triton(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, TritonServer]]:
    if not cuda_available():
        pytest.skip(
            "needs an NVIDIA GPU with CUDA (the GPU flavours compile for the GPU they are built on)"
        )
    repository = tmp_path_factory.mktemp(f"{request.param}-repository")
    publish_compiled(repository, CompiledFlavour(SOURCE, request.param, max_batch=16))
    name = compiled_name(SOURCE, request.param)
    with TritonServer(repository, models=[name], ports=TritonPorts.free()) as server:
        yield name, server


@pytest.mark.gpu
@pytest.mark.integration
def test_gpu_compiled_entry_matches_pytorch(compiled_triton: tuple[str, TritonServer]) -> None:
    name, server = compiled_triton
    entry = Path(server.repository) / name
    report = BuildReport.read(
        sorted(p for p in entry.iterdir() if p.is_dir())[-1] / "build_report.json"
    )
    assert report.parity["logits"]["top1_agreement"] == 1.0 and "compile" in report.timings_s
    images, expected = sample_reference("efficientnet_lite0")
    served = _served(server, name, images, 16)
    assert (served.argmax(1) == expected.argmax(1)).all()
    assert np.abs(served - expected).max() < 0.1  # the FP16 variant's tolerance
