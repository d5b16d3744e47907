"""Latency tracking against the real gateway: /v1/stats agrees with the client; /metrics has histograms."""

from __future__ import annotations

import time

import httpx
import pytest

from serving.quantiles import quantile
from tests.support.gateway_procs import ADMIN_TOKEN, METRICS_HEADERS, tiny_request

pytestmark = pytest.mark.integration

INFER = "/v2/models/tiny_linear/infer"
_REQUESTS = 200
_ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def test_reported_p99_agrees_with_client_measurements(gateway, admin) -> None:
    key = admin.create_key(name="stats")
    client_id = f"key:{key['key_id']}"
    latencies_ms: list[float] = []
    with httpx.Client(base_url=gateway.url, headers=admin.headers(key), timeout=10) as client:
        for _ in range(_REQUESTS):
            started = time.perf_counter()
            response = client.post(INFER, json=tiny_request())
            latencies_ms.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200
        stats = client.get("/v1/stats").json()

    mine = stats["clients"][client_id]
    assert mine["count"] == _REQUESTS  # exactly this run's requests: a fresh key
    client_p50, client_p99 = quantile(latencies_ms, 0.50), quantile(latencies_ms, 0.99)
    # Same requests measured twice: the gateway's clock starts later and stops earlier than the
    # client's, so its figure may be lower by the client/network overhead but never higher.
    # Tolerances are generous (a shared 2-core box); they catch unit or window bugs, not jitter.
    assert mine["p99_ms"] <= client_p99 * 1.05 + 0.5, (mine, client_p99)
    assert mine["p99_ms"] >= client_p99 * 0.5 - 5.0, (mine, client_p99)
    assert mine["p50_ms"] <= client_p50 * 1.05 + 0.5, (mine, client_p50)
    assert mine["p50_ms"] >= client_p50 * 0.3 - 2.0, (mine, client_p50)
    assert mine["p50_ms"] <= mine["p95_ms"] <= mine["p99_ms"] <= mine["max_ms"]
    # A client's per-model figures are its own traffic only.
    assert stats["models"]["tiny_linear"]["gateway"]["count"] == _REQUESTS
    assert stats["scope"] == client_id and set(stats["clients"]) == {client_id}


def test_triton_queue_and_compute_time_are_reported(gateway, admin) -> None:
    headers = admin.headers(admin.create_key())
    for _ in range(5):
        assert (
            httpx.post(gateway.url + INFER, json=tiny_request(), headers=headers).status_code == 200
        )
    deadline = time.monotonic() + 15  # the poller runs every 0.5 s in the test gateway
    while True:
        triton = httpx.get(gateway.url + "/v1/stats", headers=_ADMIN).json()["models"][
            "tiny_linear"
        ]["triton"]
        if triton and triton["requests"] > 0:
            break
        assert time.monotonic() < deadline, "Triton's statistics never arrived"
        time.sleep(0.2)
    assert triton["compute_mean_ms"] > 0 and triton["queue_mean_ms"] >= 0
    assert triton["request_mean_ms"] >= triton["compute_mean_ms"]


def test_metrics_expose_fine_histograms(gateway, admin) -> None:
    key = admin.create_key()
    assert (
        httpx.post(gateway.url + INFER, json=tiny_request(), headers=admin.headers(key)).status_code
        == 200
    )
    text = httpx.get(gateway.url + "/metrics", headers=METRICS_HEADERS).text
    buckets = [
        line
        for line in text.splitlines()
        if line.startswith('gateway_request_duration_seconds_bucket{le="')
        or (
            line.startswith("gateway_request_duration_seconds_bucket")
            and 'model="tiny_linear",status="200"' in line
        )
    ]
    assert len(buckets) >= 40  # 25% apart: fine enough to read a P99 within a bucket
    assert f'gateway_client_request_duration_seconds_count{{client="key:{key["key_id"]}"}}' in text
    assert "gateway_triton_compute_mean_seconds" in text
    assert "gateway_rejected_requests_total" in text or "gateway_rejected_requests" in text


def _server_timing(value: str) -> dict[str, float]:
    parts = (part.strip().split(";dur=") for part in value.split(","))
    return {name: float(ms) for name, ms in parts}


def test_server_timing_splits_the_gateways_time_by_stage(gateway, admin) -> None:
    """Each stage a KServe request goes through is timed, sent back as Server-Timing and counted in
    the stage histogram; the stages fit inside the total, and anonymous callers get no timing."""
    headers = admin.headers(admin.create_key())
    before = httpx.get(gateway.url + "/metrics", headers=METRICS_HEADERS).text
    response = httpx.post(gateway.url + INFER, json=tiny_request(), headers=headers)
    assert response.status_code == 200
    stages = _server_timing(response.headers["server-timing"])
    assert list(stages) == ["auth", "admit", "parse", "upstream", "total"]
    assert all(ms >= 0 for ms in stages.values())
    assert (
        stages["auth"] + stages["admit"] + stages["parse"] + stages["upstream"] <= stages["total"]
    )
    after = httpx.get(gateway.url + "/metrics", headers=METRICS_HEADERS).text

    def count(text: str, stage: str) -> float:
        line = f'gateway_stage_duration_seconds_count{{model="tiny_linear",stage="{stage}"}} '
        return sum(
            float(row.removeprefix(line)) for row in text.splitlines() if row.startswith(line)
        )

    assert all(
        count(after, stage) == count(before, stage) + 1
        for stage in ("auth", "admit", "parse", "upstream")
    )
    anonymous = httpx.post(gateway.url + INFER, json=tiny_request())
    assert anonymous.status_code == 401 and "server-timing" not in anonymous.headers
