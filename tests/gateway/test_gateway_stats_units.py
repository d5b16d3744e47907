"""Unit tests of latency bookkeeping: time buckets, series caps, sharing through a store, disclosure."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gateway.observe.latency import OTHER_CLIENT, LatencyWindows
from gateway.observe.stats import LatencyTracker
from gateway.observe.stats_store import SqliteSketchStore
from gateway.routes.stats_report import stats_document
from gateway.tenancy.context import Principal
from serving.quantiles import QUANTILES, LatencySketch

ADMIN = Principal(client_id="admin", scopes=frozenset({"*"}), tier="admin", kind="admin")


def _client(name: str) -> Principal:
    return Principal(client_id=name, scopes=frozenset({"*"}), tier="free", kind="api_key")


def test_windows_forget_buckets_that_left_the_window() -> None:
    windows = LatencyWindows(window_s=10.0, bucket_s=1.0, max_series=10)
    for second in range(30):
        windows.record("m", "a", 1.0, now=1000.0 + second)
    windows.record("m", "a", 0.002, now=1030.5)
    kept = list(windows.entries(now=1030.5))
    # Buckets overlapping [1020.5, 1030.5]: 1020 ... 1030.
    assert sorted(e.bucket for e in kept) == list(range(1020, 1031))
    assert sum(e.sketch.count for e in kept) == 11  # seconds 1020-1029 and the last one
    assert len(windows._buckets) <= 12  # older buckets are gone, not only hidden


def test_series_per_bucket_are_capped() -> None:
    windows = LatencyWindows(window_s=60.0, bucket_s=5.0, max_series=3)
    for index in range(50):
        windows.record("m", f"key:{index}", 0.01, now=100.0)
    series = {(e.model, e.client): e.sketch.count for e in windows.entries(now=100.0)}
    assert len(series) == 4  # three own series, then everyone else shares one
    assert series[("m", OTHER_CLIENT)] == 47


def test_take_dirty_sends_each_changed_sketch_once() -> None:
    windows = LatencyWindows(window_s=60.0, bucket_s=5.0, max_series=10)
    windows.record("m", "a", 0.01, now=100.0)
    windows.record("m", "a", 0.02, now=101.0)
    windows.record("m", "b", 0.03, now=101.0)
    first = windows.take_dirty()
    assert sorted((e.client, e.sketch.count) for e in first) == [("a", 2), ("b", 1)]
    assert windows.take_dirty() == []
    windows.mark_dirty(first)  # a failed publication is retried
    assert len(windows.take_dirty()) == 2


def test_prometheus_client_labels_are_capped() -> None:
    tracker = LatencyTracker(max_client_labels=2)
    for client in ("a", "b", "c", "d"):
        tracker.record("m", client, 200, 0.01)
    text = {s.labels.get("client") for m in tracker.registry.collect() for s in m.samples}
    assert {"a", "b", OTHER_CLIENT} <= text and "c" not in text and "d" not in text


async def test_two_processes_sharing_a_store_merge_to_the_union(tmp_path: Path) -> None:
    store = SqliteSketchStore(tmp_path / "stats.sqlite3")
    first, second = LatencyTracker(), LatencyTracker()
    first.store = second.store = store
    rng = random.Random(5)
    values = {name: [rng.lognormvariate(-4, 1) for _ in range(3000)] for name in ("a", "b")}
    for value in values["a"]:
        first.record("m", "key:a", 200, value)
    for value in values["b"][:1000]:
        first.record("m", "key:b", 200, value)
    for value in values["b"][1000:]:
        second.record("m", "key:b", 200, value)
    await first.publish()
    await second.publish()
    union = LatencySketch.of(values["a"] + values["b"])
    for tracker in (first, second):
        view = await tracker.view()
        assert view.complete
        merged = LatencySketch()
        for sketch in view.series.values():
            merged.merge(sketch)
        assert merged.count == 6000
        assert [merged.quantile(q) for q in QUANTILES] == [union.quantile(q) for q in QUANTILES]
    only_b = await second.view("key:b")
    assert set(only_b.series) == {("m", "key:b")} and only_b.series[("m", "key:b")].count == 3000


async def test_a_client_sees_only_its_own_figures() -> None:
    tracker = LatencyTracker()
    tracker.record("m1", "key:a", 200, 0.010)
    tracker.record("m2", "key:a", 200, 0.020)
    tracker.record("m1", "key:b", 200, 0.500)
    tracker.record("m3", "key:b", 200, 0.700)
    tracker.update_triton("m1", requests=10, queue_ns=0, compute_ns=0, success_ns=0)
    tracker.update_triton(
        "m1", requests=30, queue_ns=20_000_000, compute_ns=100_000_000, success_ns=140_000_000
    )

    mine = await stats_document(tracker, _client("key:a"))
    assert mine["scope"] == "key:a"
    assert set(mine["clients"]) == {"key:a"} and mine["clients"]["key:a"]["count"] == 2
    assert set(mine["models"]) == {"m1", "m2"}
    assert mine["models"]["m1"]["gateway"]["count"] == 1  # its own m1 request, not key:b's
    assert mine["models"]["m1"]["gateway"]["max_ms"] == pytest.approx(10.0)
    assert mine["models"]["m1"]["triton"] == {
        "queue_mean_ms": 1.0,
        "compute_mean_ms": 5.0,
        "request_mean_ms": 7.0,
    }
    assert "model_clients" not in mine and "key:b" not in str(mine)

    everything = await stats_document(tracker, ADMIN)
    assert everything["scope"] == "all"
    assert set(everything["clients"]) == {"key:a", "key:b"}
    assert set(everything["models"]) == {"m1", "m2", "m3"}
    assert everything["models"]["m1"]["gateway"]["count"] == 2
    assert everything["models"]["m1"]["triton"]["requests"] == 20
    assert set(everything["model_clients"]["m1"]) == {"key:a", "key:b"}

    nobody = await stats_document(tracker, _client("key:c"))
    assert nobody["models"] == {} and nobody["clients"] == {}


def test_metrics_need_the_metrics_or_admin_token(tmp_path: Path) -> None:
    from gateway import errors
    from gateway.settings import GatewaySettings
    from gateway.tenancy.auth import Authenticator
    from gateway.tenancy.keys_sqlite import SqliteKeyStore

    store = SqliteKeyStore(tmp_path / "keys.sqlite3")
    auth = Authenticator(GatewaySettings(metrics_token="m-token", admin_token="a-token"), store)
    for token in ("m-token", "a-token"):
        assert auth.check_metrics({"authorization": f"Bearer {token}"}).kind == "metrics"
    for headers in ({}, {"authorization": "Bearer wrong"}, {"x-api-key": "gk_000000000000_x"}):
        with pytest.raises(errors.AuthenticationError):
            auth.check_metrics(headers)
    off = Authenticator(GatewaySettings(), store)
    with pytest.raises(errors.PermissionDenied):
        off.check_metrics({"authorization": "Bearer anything"})


_RECORD = """
import sys
from gateway.observe.stats import LatencyTracker
tracker = LatencyTracker()
tracker.forget_dead_workers()  # as a worker's lifespan does at start
for _ in range(int(sys.argv[1])):
    tracker.record("m", "key:a", 200, 0.01)
tracker.in_flight.labels("m").inc()
if len(sys.argv) > 2:
    sys.stdout.write(tracker.metrics_text().decode())
"""


def test_metrics_of_several_worker_processes_add_up(tmp_path: Path) -> None:
    """Worker processes with PROMETHEUS_MULTIPROC_DIR set (as the server sets it): any one of them
    answers a scrape with every worker's counts."""
    import os
    import subprocess
    import sys

    from gateway.observe.metrics import MULTIPROCESS_ENV, metrics_directory

    with metrics_directory(workers=2) as directory:
        assert directory is not None and os.environ[MULTIPROCESS_ENV] == directory
        env = dict(os.environ)
        subprocess.run([sys.executable, "-c", _RECORD, "3"], env=env, check=True)
        scrape = subprocess.run(
            [sys.executable, "-c", _RECORD, "4", "scrape"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    assert MULTIPROCESS_ENV not in os.environ and not Path(directory).exists()
    assert 'gateway_request_duration_seconds_count{model="m",status="200"} 7.0' in scrape
    assert 'gateway_client_request_duration_seconds_count{client="key:a"} 7.0' in scrape
    # The first worker has exited: its in-flight count was dropped when the next one started.
    assert 'gateway_in_flight_requests{model="m"} 1.0' in scrape
