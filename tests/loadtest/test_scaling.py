"""Smoke of the gateway scaling benchmark and the propagation measurement: every path answers, the
table and plot come out. Figures are printed by the commands, never asserted."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.propagation import measure
from loadtest.scaling import ScalingSettings, run_scaling
from loadtest.scaling_report import report_table, save_plot
from loadtest.scaling_stack import TINY_MODEL
from tests.support.tiny_repo import TINY_MODEL as TINY_LINEAR
from tests.support.tiny_repo import build_tiny_repository

pytestmark = pytest.mark.integration


def test_every_path_answers_for_both_models(tmp_path: Path) -> None:
    repository = build_tiny_repository(tmp_path / "repository")
    rows = run_scaling(
        repository,
        ScalingSettings(
            model=TINY_LINEAR,
            workers=2,
            concurrencies=[2],
            duration_s=1.0,
            rounds=1,
            warmup_s=0.2,
            transports=["grpc"],
            warm_s=0.3,
        ),
    )
    assert [(r.model, r.path) for r in rows] == [
        (model, path)
        for model in (TINY_MODEL, TINY_LINEAR)
        for path in ("direct triton", "gateway 1w grpc", "gateway 2w grpc")
    ]
    assert all(r.requests > 0 and r.errors == 0 for r in rows), rows
    assert [r.vs_direct is None for r in rows] == [True, False, False] * 2
    records = report_table(rows, {"usable_cores": 2}, "smoke").as_records()
    assert len(records) == 6 and records[0]["vs direct"] == "-"
    assert save_plot(rows, "smoke", tmp_path / "scaling.png").stat().st_size > 0


def test_propagation_is_measured_for_both_kinds_of_change() -> None:
    delays = measure(trials=2, sync_interval_s=0.2)
    assert {kind: len(values) for kind, values in delays.items()} == {
        "revocation": 2,
        "canary weights": 2,
    }
    assert all(value > 0 for values in delays.values() for value in values)
