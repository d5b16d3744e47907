"""Smoke test of the QoS benchmark: it runs end to end (real Triton, real gateways, the load generator)
and writes its table, JSON and plot. Its figures are printed, never asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.registry import run_named

pytestmark = pytest.mark.integration


def test_qos_benchmark_runs_and_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "qos"
    code = run_named(
        "qos",
        [
            "--service-ms",
            "10",
            "--instances",
            "1",
            "--duration",
            "1.5",
            "--warmup",
            "0.5",
            "--sweep-seconds",
            "0.5",
            "--out",
            str(out),
        ],
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "priorities off" in printed and "priorities on" in printed
    document = json.loads((out / "qos.json").read_text())
    assert set(document["runs"]) == {"premium alone", "priorities off", "priorities on"}
    for label, tiers in document["runs"].items():
        assert {t["tier"] for t in tiers} == (
            {"premium"} if label == "premium alone" else {"premium", "free"}
        )
        assert all(t["other_errors"] == 0 for t in tiers), (
            tiers
        )  # only 200, 429 and 504 are answers here
    assert (out / "qos.png").stat().st_size > 0
