"""Bounded state under a flood of keys: client label values and stats series stay at their caps
through a real gateway, every request still counted (12.3). The flood of made-up model names is
``test_gateway_admission.py::test_unknown_name_flood_leaves_no_buckets_or_labels``."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.support.gateway_procs import ADMIN_TOKEN, METRICS_HEADERS, create_key, tiny_request

pytestmark = pytest.mark.integration

INFER = "/v2/models/tiny_linear/infer"
_MAX_CLIENT_LABELS = 3
_MAX_SERIES = 4
_KEYS = 12


def _label_values(metrics: str, metric: str, label: str) -> set[str]:
    return set(re.findall(rf'^{metric}\{{[^}}]*{label}="([^"]*)"', metrics, re.M))


def test_a_flood_of_keys_keeps_labels_and_series_bounded(  # type: ignore[no-untyped-def]
    gateway_factory, tiny_triton
) -> None:
    gateway = gateway_factory(
        tiny_triton.http_url,
        max_client_labels=_MAX_CLIENT_LABELS,
        stats_max_series=_MAX_SERIES,
        # One time bucket for the whole test: the per-bucket cap is then the cap of the answer.
        stats_window_s=600,
        stats_bucket_s=600,
    )
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        for index in range(_KEYS):
            headers, _ = create_key(gateway, name=f"flood-{index}")
            assert client.post(INFER, json=tiny_request(), headers=headers).status_code == 200
        metrics = client.get("/metrics", headers=METRICS_HEADERS).text
        stats = client.get("/v1/stats", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()

    clients = _label_values(metrics, "gateway_client_request_duration_seconds_count", "client")
    assert len(clients) == _MAX_CLIENT_LABELS + 1 and "_other" in clients, clients
    served = stats["model_clients"]["tiny_linear"]
    # The bucket may have turned once (wall-clock buckets): at most two buckets' worth of series.
    assert len(served) <= 2 * _MAX_SERIES + 1 and "_other" in served, served
    assert sum(s["count"] for s in served.values()) == _KEYS  # folded, not lost
    assert stats["models"]["tiny_linear"]["gateway"]["count"] == _KEYS
