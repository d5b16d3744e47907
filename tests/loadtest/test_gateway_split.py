"""The benchmark's split of a gateway point's time: read from the real gateway's stage metrics."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tritonclient.http as http

from loadtest.bench.gateway_split import (
    STAGES,
    bucket_bound_ms,
    gateway_counters,
    gateway_split,
)
from loadtest.bench.triton_split import model_counters, split
from serving.launcher import TritonServer


def test_split_is_the_difference_per_request() -> None:
    before = {
        "auth_s": 0.1,
        "auth_n": 10,
        "admit_s": 0.0,
        "admit_n": 10,
        "parse_s": 0.0,
        "parse_n": 10,
        "upstream_s": 1.0,
        "upstream_n": 10,
        "total_s": 1.5,
        "total_n": 10,
        "loop_lag_s": 0.0,
        "loop_lag_n": 0,
    }
    after = {
        "auth_s": 0.12,
        "auth_n": 30,
        "admit_s": 0.04,
        "admit_n": 30,
        "parse_s": 0.02,
        "parse_n": 30,
        "upstream_s": 1.2,
        "upstream_n": 30,
        "total_s": 1.8,
        "total_n": 30,
        "loop_lag_s": 0.004,
        "loop_lag_n": 8,
    }
    got = gateway_split(before, after)
    assert got.requests == 20
    assert (got.auth_ms, got.admit_ms, got.parse_ms, got.upstream_ms) == pytest.approx(
        (1.0, 2.0, 1.0, 10.0)
    )
    assert got.total_ms == pytest.approx(15.0) and got.other_ms == pytest.approx(1.0)
    assert got.loop_lag_ms == pytest.approx(0.5)
    figures = got.as_dict(client_mean_ms=20.0, in_triton_ms=7.0)
    assert figures["before_app_ms"] == pytest.approx(5.0) and figures[
        "to_triton_ms"
    ] == pytest.approx(3.0)
    # The parts add up to what the client waited outside Triton.
    parts = ("before_app_ms", "auth_ms", "admit_ms", "parse_ms", "to_triton_ms", "other_ms")
    assert sum(figures[p] for p in parts) == pytest.approx(20.0 - 7.0)


def test_the_slowest_requests_are_placed_in_their_histogram_bucket() -> None:
    # Cumulative bucket counts as /metrics gives them (le in seconds), before and after a point:
    # the point added 100 requests, 98 of them within 10 ms, 1 in (10, 50] ms, 1 in (50, 100] ms.
    before = {"total_le_0.01": 5.0, "total_le_0.05": 5.0, "total_le_0.1": 5.0, "total_le_+Inf": 5.0}
    after = {
        "total_le_0.01": 103.0,
        "total_le_0.05": 104.0,
        "total_le_0.1": 105.0,
        "total_le_+Inf": 105.0,
    }
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    assert bucket_bound_ms(delta, "total", 0.98) == pytest.approx(10.0)
    assert bucket_bound_ms(delta, "total", 0.99) == pytest.approx(50.0)
    assert bucket_bound_ms(delta, "total", 1.0) == pytest.approx(100.0)
    assert bucket_bound_ms(delta, "upstream", 0.99) == 0.0  # nothing observed: no bound
    # A histogram that first appears after the point's start has no "before" buckets.
    sums = {f"{name}_{kind}": 0.0 for name in (*STAGES, "total", "loop_lag") for kind in "sn"}
    got = gateway_split(sums, {**sums, "total_s": 1.0, "total_n": 100.0, **delta})
    assert got.total_p99_ms == pytest.approx(50.0) and got.requests == 100


@pytest.mark.integration
def test_counters_of_the_real_gateway_count_its_requests(
    gateway: dict[str, str], loadtest_triton: TritonServer
) -> None:
    model = "efficientnet_lite0"
    before = gateway_counters(gateway["url"], gateway["metrics_token"])
    triton_before = model_counters(loadtest_triton.http_url, model)
    image = np.zeros((1, 3, 224, 224), dtype=np.float32)
    with http.InferenceServerClient(gateway["url"].removeprefix("http://")) as client:
        for _ in range(3):
            tensor = http.InferInput("input", list(image.shape), "FP32")
            tensor.set_data_from_numpy(image)
            client.infer(model, [tensor], headers={"Authorization": f"Bearer {gateway['key']}"})
    after = gateway_counters(gateway["url"], gateway["metrics_token"])
    got = gateway_split(before, after)
    inside = split(model, triton_before, model_counters(loadtest_triton.http_url, model))
    assert got.requests == 3 and inside.requests == 3
    # The buckets of the slowest requests: the gateway's whole request holds its upstream stage.
    assert 0 < got.upstream_p99_ms <= got.total_p99_ms < float("inf")
    assert (
        0 < got.upstream_ms < got.total_ms
        and got.auth_ms > 0
        and got.admit_ms > 0
        and got.parse_ms > 0
    )
    # The event loop's lag is sampled all the while (every 50 ms), whatever the traffic, and the
    # collector's young-generation pauses since the gateway started are counted (handed over once a
    # second; three requests need not set off a collection of their own).
    deadline = time.monotonic() + 10
    while (
        after["loop_lag_n"] <= before["loop_lag_n"] or not after["gc0_n"]
    ) and time.monotonic() < deadline:
        time.sleep(0.1)
        after = gateway_counters(gateway["url"], gateway["metrics_token"])
    assert (
        after["loop_lag_n"] > before["loop_lag_n"] and after["loop_lag_s"] >= before["loop_lag_s"]
    )
    assert after["gc0_n"] > 0 and after["gc0_s"] > 0
    # Triton's own time of a request lies within the gateway's wait on it.
    assert (
        got.as_dict(client_mean_ms=got.total_ms, in_triton_ms=inside.in_triton_ms)["to_triton_ms"]
        > 0
    )
