"""The Python-based ``pytorch`` backend serves a TorchScript (``pytorch_libtorch``) entry on CPU.

Against the real Triton binary: the traced EfficientNet-Lite0 answers the real sample photographs
with the eager PyTorch module's logits, batched requests are split back correctly, and a bad
request fails alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from builders.triton_config import read_config
from loadtest.torchscript import publish_torchscript, sample_reference, torchscript_name
from serving.launcher import TritonPorts, TritonServer

pytestmark = pytest.mark.integration

MODEL = torchscript_name("efficientnet_lite0")


@pytest.fixture(scope="module")
def torchscript_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    repository = tmp_path_factory.mktemp("torchscript-repository")
    publish_torchscript(repository, "efficientnet_lite0", gpu=False)
    with TritonServer(repository, models=[MODEL], ports=TritonPorts.free()) as server:
        yield server


@pytest.fixture(scope="module")
def reference() -> tuple[np.ndarray, np.ndarray]:
    return sample_reference("efficientnet_lite0")


def _infer(url: str, batch: np.ndarray) -> np.ndarray:
    client = http.InferenceServerClient(url)
    tensor = http.InferInput("INPUT__0", list(batch.shape), "FP32")
    tensor.set_data_from_numpy(batch)
    return client.infer(MODEL, [tensor]).as_numpy("OUTPUT__0")


def test_entry_uses_libtorch_platform_and_names(torchscript_triton: TritonServer) -> None:
    config = read_config(Path(torchscript_triton.repository) / MODEL / "config.pbtxt")
    assert config.platform == "pytorch_libtorch" and config.default_model_filename == "model.pt"
    assert [i.name for i in config.input] == ["INPUT__0"] and [o.name for o in config.output] == ["OUTPUT__0"]


def test_matches_pytorch_module(torchscript_triton: TritonServer, reference: tuple[np.ndarray, np.ndarray]) -> None:
    images, expected = reference
    got = _infer(torchscript_triton.http_url, images)
    assert got.shape == expected.shape == (len(images), 1000)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)
    assert (got.argmax(1) == expected.argmax(1)).all()


def test_concurrent_requests_are_batched_and_split_back(
    torchscript_triton: TritonServer, reference: tuple[np.ndarray, np.ndarray]
) -> None:
    images, expected = reference
    with ThreadPoolExecutor(max_workers=len(images)) as pool:
        answers = list(pool.map(lambda i: _infer(torchscript_triton.http_url, images[i:i + 1]), range(len(images))))
    for i, got in enumerate(answers):
        np.testing.assert_allclose(got[0], expected[i], atol=1e-4, rtol=1e-4)


def test_bad_request_fails_alone(torchscript_triton: TritonServer, reference: tuple[np.ndarray, np.ndarray]) -> None:
    images, expected = reference
    client = http.InferenceServerClient(torchscript_triton.http_url)
    bad = http.InferInput("INPUT__0", [1, 3, 112, 112], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 3, 112, 112), dtype=np.float32))

    def send_bad() -> str:
        with pytest.raises(InferenceServerException) as info:
            client.infer(MODEL, [bad])
        return str(info.value)

    with ThreadPoolExecutor(max_workers=4) as pool:
        bad_future = pool.submit(send_bad)
        good = [pool.submit(_infer, torchscript_triton.http_url, images[i:i + 1]) for i in range(3)]
        message = bad_future.result()
        for i, future in enumerate(good):
            np.testing.assert_allclose(future.result()[0], expected[i], atol=1e-4, rtol=1e-4)
    assert "INPUT__0" in message or "shape" in message
