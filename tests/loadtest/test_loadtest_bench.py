"""A bounded smoke of ``loadtest.bench --quick``: every configuration runs and the report is written.

No timing is asserted; the figures of a quick run on a shared machine mean nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.bench import (
    ALL_CONFIGS,
    BenchSettings,
    build_parser,
    gateway_available,
    run_bench,
    settings_from_args,
)

pytestmark = pytest.mark.integration


def test_cli_quick_settings() -> None:
    settings = settings_from_args(build_parser().parse_args(["--quick", "--concurrency", "1,2", "--configs", "raw,naive"]))
    assert settings.quick and settings.concurrency == (1, 2) and settings.configs == ("raw", "naive")
    assert settings.duration_s < 5


def test_bench_quick_writes_table_json_and_png(loadtest_repository: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    settings = BenchSettings.quick_settings(repository=loadtest_repository, out_dir=tmp_path, concurrency=(1, 2),
                                            duration_s=1.0, warmup_s=0.3, raw_batches=(1, 4))
    document = run_bench(settings)
    out = capsys.readouterr().out
    assert "Side-by-side benchmark" in out and "Ratios" in out

    expected = set(ALL_CONFIGS) - ({"gateway"} if not gateway_available() else set())
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["results"] == json.loads(json.dumps(document["results"]))
    assert {r["config"] for r in saved["results"]} == expected
    for row in saved["results"]:
        assert row["errors"] == 0, row
        # One eager forward can outlast a quick window on a busy machine; the sanity request above
        # already proved the naive server answers.
        assert row["requests"] > 0 or row["config"] == "naive", row
    # Every server answered the same photograph with the same class.
    assert len(set(saved["sanity_top1"].values())) == 1
    assert saved["machine"]["usable_cpus"] >= 1 and saved["settings_line"]
    assert "efficiency_direct" in saved["ratios"] and "1" in saved["ratios"]["per_concurrency"]
    png = tmp_path / "bench.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
