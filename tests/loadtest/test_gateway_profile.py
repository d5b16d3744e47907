"""Smoke test of the gateway CPU profile: a tiny run of each path end to end (real Triton, the real
gateway as the isolation benchmark starts it, once plain and once under cProfile) prints the CPU
figure and the costliest functions. Its timings are printed, never asserted."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.registry import run_named

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("path", ["admitted", "refused"])
def test_gateway_profile_prints_the_cpu_figure_and_the_costliest_functions(
    path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "gateway.prof"
    code = run_named(
        "gateway-profile",
        [
            "--path",
            path,
            "--duration",
            "1",
            "--warmup",
            "0.5",
            "--top",
            "5",
            "--profile",
            str(profile),
        ],
    )
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    # Each gateway run reports its collector's pauses over the load (gateway_gc_pause_seconds).
    pauses = [line for line in lines if line.startswith("  collector pauses")]
    assert len(pauses) == 2 and all("generation 2:" in line for line in pauses), lines
    plain, profiled, served, header, *rows = [line for line in lines if line not in pauses]
    assert plain.startswith(f"{path}: gateway CPU ") and "ms per request" in plain
    assert profiled.startswith(f"under cProfile: {path}: gateway CPU ")
    # Refused means 429: the free key's bucket empties within its first requests.
    assert ("429:" in plain.split("statuses ")[1]) == (path == "refused")
    assert served.endswith("requests served (warm-up included)")
    assert header.split()[-1] == "function"
    assert len(rows) == 5
    # The gateway wrote its statistics on a clean stop (SIGTERM), and the request path is in them.
    assert profile.stat().st_size > 0
    assert "on_headers_complete" in Path(profile).read_bytes().decode("latin-1")


def test_gateway_profile_floors_measure_every_server_beside_the_gateway(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from loadtest.proxy_floor import MODES

    out_dir = tmp_path / "floors"
    code = run_named(
        "gateway-profile", ["--floors", "--duration", "1", "--warmup", "0.5", "--out", str(out_dir)]
    )
    # 0 only when every server answered every request 200 (each proxy passed Triton's answer back).
    assert code == 0, capsys.readouterr().out
    record = json.loads((out_dir / "floors.json").read_text())
    assert sorted(record["floors_ms_per_request"]) == sorted(MODES)
    for cpu in [record["gateway_ms_per_request"], *record["floors_ms_per_request"].values()]:
        assert cpu["answered"] > 0 and set(cpu["statuses"]) == {"200"}
    assert "the gateway (admitted path)" in (out_dir / "floors.txt").read_text()
    assert (out_dir / "floors.png").stat().st_size > 0


def test_gateway_env_takes_only_gateway_settings() -> None:
    with pytest.raises(SystemExit, match="GATEWAY_NAME=VALUE"):
        run_named("gateway-profile", ["--no-profile", "--gateway-env", "PATH=/tmp"])
    with pytest.raises(SystemExit, match="GATEWAY_NAME=VALUE"):
        run_named("gateway-profile", ["--no-profile", "--gateway-env", "GATEWAY_GC_FREEZE"])


def test_a_full_collection_is_measured_with_and_without_the_start_up_freeze() -> None:
    from loadtest.collector_cost import full_collection_ms

    figures = full_collection_ms()
    # The app's start-up objects are many (modules, routes, models): tens of thousands.
    assert figures["frozen_objects"] > 10_000
    assert figures["full_ms"] >= 0 and figures["frozen_full_ms"] >= 0
