"""A bounded, headless smoke of the locust scenarios against real Triton and the real gateway.

It proves the scenarios run and their reports are written; it asserts no timing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.run import LocustSettings, parse_duration, run_locust
from serving.launcher import TritonServer

pytestmark = pytest.mark.integration


def test_parse_duration() -> None:
    assert (
        parse_duration("30s") == 30
        and parse_duration("2m") == 120
        and parse_duration("1h30m") == 5400
    )
    assert parse_duration("15") == 15
    with pytest.raises(ValueError):
        parse_duration("soon")


def test_v2_scenario_direct_to_triton(loadtest_triton: TritonServer, tmp_path: Path) -> None:
    # Ends once 6 requests were answered (the minute is only a bound), so a busy machine cannot
    # make it end before the first answer.
    run = run_locust(
        f"http://{loadtest_triton.http_url}",
        ["v2"],
        LocustSettings(
            users=2,
            spawn_rate=2,
            run_time="60s",
            out_dir=tmp_path,
            prefix="triton",
            max_requests=6,
        ),
        env={"LOADTEST_TARGET": "triton", "LOADTEST_WAIT": "0.05,0.2"},
    )
    assert run.html.exists() and run.html.stat().st_size > 0, run.output[-2000:]
    for suffix in ("_stats.csv", "_stats_history.csv", "_failures.csv"):
        assert Path(f"{run.csv_prefix}{suffix}").exists()
    assert run.count("/v2/models/efficientnet_lite0/infer") > 0, run.output[-2000:]
    assert run.failures == 0, run.output[-2000:]


def test_gateway_scenarios_with_keys_and_tiers(gateway: dict[str, str], tmp_path: Path) -> None:
    env = {
        "LOADTEST_API_KEY": gateway["key"],
        "LOADTEST_API_KEY_FREE": gateway["free_key"],
        "LOADTEST_WAIT": "0.05,0.2",
    }
    # One user per scenario, each sending at once: 30 answers hold several of every route.
    run = run_locust(
        gateway["url"],
        ["classify", "v2", "free"],
        LocustSettings(
            users=3,
            spawn_rate=3,
            run_time="60s",
            out_dir=tmp_path,
            prefix="gateway",
            max_requests=30,
        ),
        env=env,
    )
    assert run.html.exists(), run.output[-2000:]
    assert run.count("/v1/classify") > 0, run.output[-2000:]
    assert run.count("/v2/models/efficientnet_lite0/infer") > 0, run.output[-2000:]
    assert run.failures == 0, run.output[-2000:]


def test_unauthenticated_requests_are_failures(gateway: dict[str, str], tmp_path: Path) -> None:
    # Without a key the gateway answers 401, and the scenario must report that, not hide it.
    run = run_locust(
        gateway["url"],
        ["v2"],
        LocustSettings(
            users=1,
            spawn_rate=1,
            run_time="60s",
            out_dir=tmp_path,
            prefix="nokey",
            max_requests=3,
        ),
        env={"LOADTEST_API_KEY": "", "LOADTEST_WAIT": "0.1,0.2"},
    )
    assert run.requests > 0 and run.failures == run.requests, run.output[-2000:]
