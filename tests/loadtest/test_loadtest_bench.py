"""A bounded smoke of ``loadtest.bench --quick``: every configuration runs and the report is written.

No timing is asserted; the figures of a quick run on a shared machine mean nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.bench import ALL_CONFIGS, BenchSettings, build_parser, run_bench, settings_from_args
from loadtest.bench.gateway_overhead import OverheadSettings, run_overhead
from loadtest.bench.settings import JPEG_CONFIGS
from serving.launcher import TritonServer

pytestmark = pytest.mark.integration


def test_cli_quick_settings() -> None:
    settings = settings_from_args(
        build_parser().parse_args(["--quick", "--concurrency", "1,2", "--configs", "raw,naive"])
    )
    assert (
        settings.quick and settings.concurrency == (1, 2) and settings.configs == ("raw", "naive")
    )
    assert settings.duration_s < 5 and settings.naive_threads == 0
    assert (
        settings_from_args(build_parser().parse_args(["--naive-threads", "1"])).naive_threads == 1
    )


def test_bench_quick_writes_table_json_and_png(
    loadtest_repository: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = BenchSettings.quick_settings(
        repository=loadtest_repository,
        out_dir=tmp_path,
        concurrency=(1, 2),
        duration_s=1.0,
        warmup_s=0.3,
        raw_batches=(1, 4),
        naive_threads=1,
        configs=ALL_CONFIGS,
    )
    document = run_bench(settings)
    out = capsys.readouterr().out
    assert "Side-by-side benchmark" in out and "Ratios" in out

    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["results"] == json.loads(json.dumps(document["results"]))
    assert {r["config"] for r in saved["results"]} == set(ALL_CONFIGS)
    for row in saved["results"]:
        assert row["errors"] == 0, row
        # Every load point stands beside the load generator's own capacity at the same settings.
        assert row["config"] == "raw" or row["capacity"] > 0, row
        # One eager forward can outlast a quick window on a busy machine; the sanity request above
        # already proved the naive server answers.
        assert row["requests"] > 0 or row["config"].startswith("naive"), row
    # Every server answered the same photograph with the same class: as a tensor, and as a JPEG file
    # (re-encoded, so its class may differ from the tensor's).
    tensor_top1 = {
        top1 for config, top1 in saved["sanity_top1"].items() if config not in JPEG_CONFIGS
    }
    jpeg_top1 = {top1 for config, top1 in saved["sanity_top1"].items() if config in JPEG_CONFIGS}
    assert len(tensor_top1) == 1 and len(jpeg_top1) == 1, saved["sanity_top1"]
    assert "jpeg_gateway_vs_naive_throughput_x" in saved["ratios"]["per_concurrency"]["1"]
    assert (
        saved["machine"]["usable_cpus"] >= 1
        and "naive server torch threads 1;" in saved["settings_line"]
    )
    assert "efficiency_direct" in saved["ratios"] and "1" in saved["ratios"]["per_concurrency"]
    png = tmp_path / "bench.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Each gateway point is split by the gateway's own stages, and the parts add up.
    assert {(s["config"], s["concurrency"]) for s in saved["gateway_split"]} == {
        (c, n) for c in ("gateway", "gateway-jpeg") for n in (1, 2)
    }
    for row in saved["gateway_split"]:
        stages = row["gateway"]
        assert stages["requests"] > 0 and stages["upstream_ms"] > 0, row
        parts = sum(
            stages[k]
            for k in (
                "before_app_ms",
                "auth_ms",
                "admit_ms",
                "parse_ms",
                "to_triton_ms",
                "other_ms",
            )
        )
        assert parts == pytest.approx(row["outside_triton_ms"], abs=1e-6), row
    assert "Where the gateway's time goes" in out


def test_cli_refuses_an_unknown_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--configs", "triton-batching,gatway"])
    assert "unknown configuration(s) gatway" in capsys.readouterr().err


def test_gateway_overhead_on_the_load_generator(
    loadtest_triton: TritonServer, gateway: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_overhead(
        loadtest_triton.http_url,
        gateway["url"],
        gateway["key"],
        "efficientnet_lite0",
        OverheadSettings(concurrency=2, duration_s=1.0, rounds=1),
    )
    assert result.direct.requests > 0 and result.gateway.requests > 0
    assert result.direct.errors == 0 and result.gateway.errors == 0, result.gateway.error_summary()
    assert (
        result.capacity > 0 and result.direct.name == "direct" and result.gateway.name == "gateway"
    )
