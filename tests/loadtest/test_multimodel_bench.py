"""Smoke test of the multi-model benchmark: a tiny run end to end (real Triton, real gateways, the load
generator) writes exactly the figures the issue asks for, a detail document and a plot. Its figures
are printed, never asserted beyond their shape and what holds by construction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gateway.backends.residency_metrics import ResidencyMetrics
from loadtest.loadgen.mix import waited_for_load
from loadtest.multimodel import zipf_sequence
from loadtest.multimodel_report import load_figures
from loadtest.registry import run_named

pytestmark = pytest.mark.integration

FIGURES = {
    "device": str,
    "models": int,
    "budget_models": int,
    "hit_rate": float,
    "cold_load_p99_ms": float,
    "hot_p99_ms": float,
    "all_loaded_p99_ms": float,
    "max_memory_over_budget_bytes": int,
}


def test_zipf_traffic_favours_the_first_models() -> None:
    draws = zipf_sequence(["a", "b", "c", "d"], 1.1, 10_000, seed=3)
    counts = [draws.count(m) for m in "abcd"]
    assert counts == sorted(counts, reverse=True) and sum(counts) == 10_000
    assert zipf_sequence(["a", "b"], 1.1, 50, seed=3) == zipf_sequence(["a", "b"], 1.1, 50, seed=3)


def test_a_request_that_waited_for_a_load_is_told_apart() -> None:
    assert waited_for_load(
        "auth;dur=0.1, admit;dur=0.2, load;dur=812.0, upstream;dur=3.0, total;dur=816.0"
    )
    assert not waited_for_load("auth;dur=0.1, admit;dur=0.2, upstream;dur=3.0, total;dur=3.4")
    assert not waited_for_load(None)


def test_multimodel_benchmark_runs_and_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "multimodel"
    # One request at a time: every request is answered (no two cold models contend for one slot).
    code = run_named(
        "multimodel",
        [
            "--models",
            "3",
            "--budget-models",
            "1",
            "--concurrency",
            "1",
            "--duration",
            "4",
            "--warmup",
            "0",
            "--out",
            str(out),
        ],
    )
    assert code == 0
    assert "all models loaded" in capsys.readouterr().out
    figures = json.loads((out / "multimodel.json").read_text())
    assert {k: type(v) for k, v in figures.items()} == FIGURES
    assert (figures["models"], figures["budget_models"]) == (3, 1)
    assert 0.0 <= figures["hit_rate"] <= 1.0 and figures["max_memory_over_budget_bytes"] >= 0
    detail = json.loads((out / "multimodel-detail.json").read_text())
    assert detail["requests"]["errors"] == 0 and detail["requests"]["all_loaded_errors"] == 0, (
        detail["requests"]
    )
    assert (
        detail["requests"]["hits"] + detail["requests"]["cold"] > 0
        and detail["requests"]["all_loaded"] > 0
    )
    assert detail["memory"]["samples"]
    # With a budget of one over three models, the first request of the run loads a model.
    loads = detail["on_demand_loads"]
    assert loads["load_count"] >= 1 and loads["loads"].get("loaded", 0) >= 1, loads
    assert len(loads["load_alone_s"]) == 2 and min(loads["load_alone_s"]) > 0, loads
    assert (out / "multimodel.png").stat().st_size > 0


def test_the_gateway_load_metrics_are_read_back() -> None:
    """What the residency manager records comes back out of the Prometheus text it serves."""
    registry = CollectorRegistry()
    metrics = ResidencyMetrics(registry, budget_bytes=1 << 30)
    for model, seconds in [("a", 0.3), ("b", 0.7), ("a", 3.0)]:
        metrics.loads.labels(model, "loaded").inc()
        metrics.cold_load.labels(model).observe(seconds)
    metrics.loads.labels("c", "failed").inc()
    metrics.evictions.labels("a", "lru").inc()
    metrics.evictions.labels("b", "admin").inc()
    figures = load_figures(generate_latest(registry).decode())
    assert figures["loads"] == {"loaded": 3, "failed": 1}
    assert figures["evictions"] == {"lru": 1, "admin": 1}
    assert figures["load_count"] == 3
    assert figures["load_mean_s"] == pytest.approx(4.0 / 3)
    # bucket upper bounds: 0.7 s lies in (0.5, 1.0], 3.0 s in (2.0, 4.0]
    assert (figures["load_p50_s"], figures["load_p99_s"]) == (1.0, 4.0)
