"""The Python-based ``pytorch`` backend serves a TorchScript (``pytorch_libtorch``) entry on CPU.

Against the real Triton binary: the traced EfficientNet-Lite0 answers the real sample photographs
with the eager PyTorch module's logits, batched requests are split back correctly, and a bad
request fails alone.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from builders.torchscript import TorchScriptOptions, build_torchscript
from builders.triton_config import read_config
from serving.launcher import TritonPorts, TritonServer
from tests.support.reference import sample_reference
from tests.support.torchscript_entry import MODEL, infer, infer_in_batches, infer_wrong_shape

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def torchscript_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    repository = tmp_path_factory.mktemp("torchscript-repository")
    report = build_torchscript(repository, "efficientnet_lite0", TorchScriptOptions(gpu=False))
    assert report.parity["logits"]["top1_agreement"] == 1.0 and report.inputs_hash
    with TritonServer(repository, models=[MODEL], ports=TritonPorts.free()) as server:
        yield server


@pytest.fixture(scope="module")
def reference() -> tuple[np.ndarray, np.ndarray]:
    return sample_reference("efficientnet_lite0")


def test_entry_uses_libtorch_platform_and_names(torchscript_triton: TritonServer) -> None:
    config = read_config(Path(torchscript_triton.repository) / MODEL / "config.pbtxt")
    assert config.platform == "pytorch_libtorch" and config.default_model_filename == "model.pt"
    assert [i.name for i in config.input] == ["INPUT__0"] and [o.name for o in config.output] == [
        "OUTPUT__0"
    ]


def test_an_unchanged_flavour_is_not_rebuilt(torchscript_triton: TritonServer) -> None:
    repository = Path(torchscript_triton.repository)
    again = build_torchscript(repository, "efficientnet_lite0", TorchScriptOptions(gpu=False))
    assert again.skipped and again.version == 1
    assert [p.name for p in (repository / MODEL).iterdir() if p.is_dir()] == ["1"]


def test_matches_pytorch_module(
    torchscript_triton: TritonServer, reference: tuple[np.ndarray, np.ndarray]
) -> None:
    images, expected = reference
    config = read_config(Path(torchscript_triton.repository) / MODEL / "config.pbtxt")
    got = infer_in_batches(torchscript_triton.http_url, images, config.max_batch_size)
    assert got.shape == expected.shape == (len(images), 1000)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)
    assert (got.argmax(1) == expected.argmax(1)).all()


def test_concurrent_requests_are_batched_and_split_back(
    torchscript_triton: TritonServer, reference: tuple[np.ndarray, np.ndarray]
) -> None:
    images, expected = reference
    # No more in flight than the entry's queue holds (Triton refuses the rest with 503).
    config = read_config(Path(torchscript_triton.repository) / MODEL / "config.pbtxt")
    in_flight = min(len(images), config.dynamic_batching.default_queue_policy.max_queue_size)
    with ThreadPoolExecutor(max_workers=in_flight) as pool:
        answers = list(
            pool.map(
                lambda i: infer(torchscript_triton.http_url, images[i : i + 1]), range(len(images))
            )
        )
    for i, got in enumerate(answers):
        np.testing.assert_allclose(got[0], expected[i], atol=1e-4, rtol=1e-4)


def test_bad_request_fails_alone(
    torchscript_triton: TritonServer, reference: tuple[np.ndarray, np.ndarray]
) -> None:
    images, expected = reference
    with ThreadPoolExecutor(max_workers=4) as pool:
        bad_future = pool.submit(infer_wrong_shape, torchscript_triton.http_url)
        good = [
            pool.submit(infer, torchscript_triton.http_url, images[i : i + 1]) for i in range(3)
        ]
        message = bad_future.result()
        for i, future in enumerate(good):
            np.testing.assert_allclose(future.result()[0], expected[i], atol=1e-4, rtol=1e-4)
    assert "INPUT__0" in message or "shape" in message


def test_execute_reports_its_steps_on_tritons_metrics_page(
    torchscript_triton: TritonServer, reference: tuple[np.ndarray, np.ndarray]
) -> None:
    from loadtest.bench.triton_split import model_counters, split

    images, _ = reference
    url, metrics = torchscript_triton.http_url, torchscript_triton.metrics_url
    before = model_counters(url, MODEL, metrics)
    for i in range(3):
        infer(url, images[i : i + 1])
    # The stub hands its sums to Triton at most once a second, with an execution that finds them
    # due.
    deadline = time.monotonic() + 30
    after = model_counters(url, MODEL, metrics)
    while after.get("step:respond", 0.0) <= before.get("step:respond", 0.0):
        assert time.monotonic() < deadline, f"no step metrics for {MODEL}: {after}"
        time.sleep(1.1)
        infer(url, images[:1])
        after = model_counters(url, MODEL, metrics)
    got = split(MODEL, before, after)
    assert set(got.steps_ms) == {"inputs", "run", "wait", "respond"}
    assert got.steps_ms["run"] > 0 and got.steps_ms["inputs"] > 0
