"""The benchmark's split of a load point's time inside Triton: read from a real Triton's statistics."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as http

from loadtest.bench.triton_split import model_counters, split
from serving.launcher import TritonServer


def test_split_is_the_difference_per_request() -> None:
    before = {
        "requests": 10,
        "executions": 5,
        "inferences": 10,
        "queue_ns": 10_000_000,
        "compute_input_ns": 0,
        "compute_infer_ns": 50_000_000,
        "compute_output_ns": 0,
        "success_ns": 80_000_000,
    }
    after = {
        "requests": 30,
        "executions": 10,
        "inferences": 30,
        "queue_ns": 50_000_000,
        "compute_input_ns": 2_000_000,
        "compute_infer_ns": 90_000_000,
        "compute_output_ns": 4_000_000,
        "success_ns": 180_000_000,
    }
    got = split("m", before, after)
    assert (got.requests, got.executions, got.inferences_per_execution) == (20, 5, 4.0)
    assert got.queue_ms == pytest.approx(2.0) and got.compute_infer_ms == pytest.approx(2.0)
    assert got.in_triton_ms == pytest.approx(5.0)
    assert got.as_dict(client_mean_ms=7.5)["outside_triton_ms"] == pytest.approx(2.5)


@pytest.mark.integration
def test_counters_of_a_real_model_count_its_requests(triton: TritonServer) -> None:
    model = "efficientnet_lite0"
    before = model_counters(triton.http_url, model)
    image = np.zeros((1, 3, 224, 224), dtype=np.float32)
    with http.InferenceServerClient(triton.http_url) as client:
        for _ in range(3):
            tensor = http.InferInput("input", list(image.shape), "FP32")
            tensor.set_data_from_numpy(image)
            client.infer(model, [tensor])
    got = split(model, before, model_counters(triton.http_url, model))
    assert got.requests == 3 and got.inferences == 3 and 1 <= got.executions <= 3
    assert 0 < got.compute_infer_ms <= got.in_triton_ms
