"""The ``pytorch`` backend on ``KIND_GPU``: FP16 channels_last CUDA graphs, host and CUDA
shared-memory inputs.

Against the real Triton binary on a GPU host (marked ``gpu``; skipped with the reason elsewhere): the
traced EfficientNet-Lite0 answers the sample photographs like the eager FP32 module (FP16 tolerance),
concurrent requests are batched, padded to a captured size and split back, a bad request fails
alone, and a tensor sent in CUDA shared memory (it reaches the model on the GPU, no host copy) gives
the same answer as one sent in the HTTP body.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as http

from builders.spec import BatchingPolicy
from builders.torchscript import TorchScriptOptions, build_torchscript
from serving.launcher import TritonPorts, TritonServer
from tests.support.gpu_repo import cuda_available
from tests.support.reference import sample_reference
from tests.support.torchscript_entry import MODEL, infer, infer_in_batches, infer_wrong_shape

pytestmark = [pytest.mark.integration, pytest.mark.gpu]

FP16_ATOL = 0.1  # the FP16 variant's tolerance (builders.spec.DEFAULT_VARIANT_TOLERANCES)
POLICY = BatchingPolicy(max_batch_size=64, preferred_batch_sizes=(16, 64), max_queue_delay_us=2000)


@pytest.fixture(scope="module")
def gpu_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    if not cuda_available():
        pytest.skip("needs an NVIDIA GPU with CUDA (torch.cuda.is_available() is False here)")
    repository = tmp_path_factory.mktemp("torchscript-gpu")
    build_torchscript(
        repository, "efficientnet_lite0", TorchScriptOptions(gpu=True, batching=POLICY)
    )
    with TritonServer(repository, models=[MODEL], ports=TritonPorts.free()) as server:
        yield server


@pytest.fixture(scope="module")
def reference() -> tuple[np.ndarray, np.ndarray]:
    return sample_reference("efficientnet_lite0")


def test_matches_pytorch_in_fp16(
    gpu_triton: TritonServer, reference: tuple[np.ndarray, np.ndarray]
) -> None:
    images, expected = reference
    got = infer_in_batches(gpu_triton.http_url, images, POLICY.max_batch_size)
    assert got.shape == expected.shape
    assert (got.argmax(1) == expected.argmax(1)).all()
    assert np.abs(got - expected).max() < FP16_ATOL


def test_concurrent_requests_are_batched_padded_and_split_back(
    gpu_triton: TritonServer, reference: tuple[np.ndarray, np.ndarray]
) -> None:
    images, expected = reference
    rows = [
        i % len(images) for i in range(45)
    ]  # 45 requests: batches of odd sizes, padded to captured ones
    with ThreadPoolExecutor(max_workers=45) as pool:
        answers = list(pool.map(lambda i: infer(gpu_triton.http_url, images[i : i + 1]), rows))
    for i, got in zip(rows, answers, strict=True):
        assert got[0].argmax() == expected[i].argmax()
        assert np.abs(got[0] - expected[i]).max() < FP16_ATOL


def test_bad_request_fails_alone(
    gpu_triton: TritonServer, reference: tuple[np.ndarray, np.ndarray]
) -> None:
    images, expected = reference
    with ThreadPoolExecutor(max_workers=4) as pool:
        message = pool.submit(infer_wrong_shape, gpu_triton.http_url)
        good = [pool.submit(infer, gpu_triton.http_url, images[i : i + 1]) for i in range(3)]
        assert "INPUT__0" in message.result() or "shape" in message.result()
        for i, future in enumerate(good):
            assert future.result()[0].argmax() == expected[i].argmax()


def test_cuda_shared_memory_input_matches_the_http_body(
    gpu_triton: TritonServer, reference: tuple[np.ndarray, np.ndarray]
) -> None:
    import tritonclient.utils.cuda_shared_memory as cudashm

    images, _ = reference
    batch = np.ascontiguousarray(images[:4])
    with http.InferenceServerClient(gpu_triton.http_url) as client:
        region = cudashm.create_shared_memory_region("test-input", batch.nbytes, 0)
        try:
            cudashm.set_shared_memory_region(region, [batch])
            client.register_cuda_shared_memory(
                "test-input", cudashm.get_raw_handle(region), 0, batch.nbytes
            )
            tensor = http.InferInput("INPUT__0", list(batch.shape), "FP32")
            tensor.set_shared_memory("test-input", batch.nbytes)
            from_shm = client.infer(MODEL, [tensor]).as_numpy("OUTPUT__0")
        finally:
            client.unregister_cuda_shared_memory("test-input")
            cudashm.destroy_shared_memory_region(region)
    np.testing.assert_allclose(from_shm, infer(gpu_triton.http_url, batch), atol=1e-2, rtol=1e-2)
