"""The AOTInductor flavour: refused without a GPU; on one, built, checked and served like TorchScript."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as http

from builders.compiled import compiled_name, publish_compiled
from builders.errors import BuildError
from builders.report import BuildReport
from serving.launcher import TritonPorts, TritonServer
from tests.support.gpu_repo import cuda_available
from tests.support.reference import sample_reference

NAME = compiled_name("efficientnet_lite0")


@pytest.mark.skipif(cuda_available(), reason="checks the refusal on a machine without a GPU")
def test_refused_without_a_gpu(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="no CUDA device"):
        publish_compiled(tmp_path, max_batch=8)
    assert not (tmp_path / NAME).exists()


@pytest.fixture(scope="module")
def compiled_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    if not cuda_available():
        pytest.skip("needs an NVIDIA GPU with CUDA (AOTInductor compiles for the GPU it is built on)")
    repository = tmp_path_factory.mktemp("aoti-repository")
    publish_compiled(repository, max_batch=16)
    with TritonServer(repository, models=[NAME], ports=TritonPorts.free()) as server:
        yield server


@pytest.mark.gpu
@pytest.mark.integration
def test_gpu_compiled_entry_matches_pytorch(compiled_triton: TritonServer) -> None:
    entry = Path(compiled_triton.repository) / NAME
    report = BuildReport.read(sorted(p for p in entry.iterdir() if p.is_dir())[-1] / "build_report.json")
    assert report.parity["logits"]["top1_agreement"] == 1.0 and "compile" in report.timings_s
    images, expected = sample_reference("efficientnet_lite0")
    tensor = http.InferInput("INPUT__0", list(images.shape), "FP32")
    tensor.set_data_from_numpy(images)
    with http.InferenceServerClient(compiled_triton.http_url) as client:
        got = client.infer(NAME, [tensor]).as_numpy("OUTPUT__0")
    assert (got.argmax(1) == expected.argmax(1)).all()
    assert np.abs(got - expected).max() < 0.1  # the FP16 variant's tolerance
