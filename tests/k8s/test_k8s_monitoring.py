"""Alert rules and the Grafana dashboard are valid PromQL, unit-tested with promtool, and agree with KEDA.

promtool comes with Debian's ``prometheus`` package (``./run test`` installs it). The rules are the
rendered PrometheusRule's groups; ``k8s/monitoring/alert-tests.yaml`` holds the promtool unit tests.
That the metric names are the ones the gateway and Triton really export is checked against real
scrapes in test_k8s_real_metrics.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.k8s_render import K8S, find, rendered

DASHBOARD = K8S / "base/dashboards/triton-platform.json"
ALERT_TESTS = K8S / "monitoring/alert-tests.yaml"
#: what each alert watches (issue 17.5): a rule must exist for each
REQUIRED_ALERTS = {
    "GatewayP99OverSLO",
    "GatewayErrorRateHigh",
    "TritonQueueTimeHigh",
    "TritonGPUSaturated",
    "GatewayRateLimitRejectionsHigh",
    "GatewayEventLoopLagging",
}


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed: `./run test` installs Debian's prometheus package")
    return path


def _rule_groups() -> dict[str, Any]:
    return dict(find(rendered("base"), "PrometheusRule", "triton-platform-slo")["spec"])


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]]


def test_promtool_checks_the_rules(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(_rule_groups()))
    result = subprocess.run(
        [_promtool(), "check", "rules", str(tmp_path / "rules.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(_rule_groups()))
    shutil.copyfile(ALERT_TESTS, tmp_path / ALERT_TESTS.name)
    result = subprocess.run(
        [_promtool(), "test", "rules", ALERT_TESTS.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    """A rule with a loosened threshold fails its unit test (the tests assert something)."""
    groups = _rule_groups()
    for group in groups["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "TritonQueueTimeHigh":
                rule["expr"] = rule["expr"].replace("100000", "300000")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(groups))
    shutil.copyfile(ALERT_TESTS, tmp_path / ALERT_TESTS.name)
    result = subprocess.run(
        [_promtool(), "test", "rules", ALERT_TESTS.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0 and "TritonQueueTimeHigh" in result.stdout + result.stderr


def test_every_required_alert_exists() -> None:
    alerts = {r["alert"] for g in _rule_groups()["groups"] for r in g["rules"] if "alert" in r}
    assert REQUIRED_ALERTS <= alerts


def test_dashboard_is_grafana_json_with_valid_promql(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["panels"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
    # promtool parses every panel expression (as recording rules of a scratch group).
    scratch = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:expr_{i}", "expr": e}
                    for i, e in enumerate(dashboard_exprs())
                ],
            }
        ]
    }
    (tmp_path / "dashboard.yaml").write_text(yaml.safe_dump(scratch))
    result = subprocess.run(
        [_promtool(), "check", "rules", str(tmp_path / "dashboard.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_ships_in_a_configmap_the_grafana_sidecar_finds() -> None:
    docs = rendered("base")
    (cm,) = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("grafana-dashboard")
    ]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["triton-platform.json"]) == json.loads(DASHBOARD.read_text())


def test_dashboard_plots_every_alerted_signal() -> None:
    exprs = " ".join(dashboard_exprs())
    for record in (
        "model:gateway_request_duration_seconds:p99_5m",
        "model:gateway_request_errors:ratio_5m",
        "triton:queue_us_per_client_request:rate1m",
        "nv_gpu_utilization",
        "reason:gateway_rejected_requests:ratio_5m",
        "pod:gateway_event_loop_lag_seconds:p99_5m",
    ):
        assert record in exprs, record


def _one_line(expr: str) -> str:
    return " ".join(expr.split()).replace("( ", "(").replace(" )", ")")


def test_keda_scales_on_the_recorded_queue_time_of_the_served_models() -> None:
    docs = rendered("base")
    query = _one_line(
        find(docs, "ScaledObject", "triton")["spec"]["triggers"][0]["metadata"]["query"]
    )
    records = {
        r["record"]: _one_line(r["expr"])
        for g in _rule_groups()["groups"]
        for r in g["rules"]
        if "record" in r
    }
    recorded = records["triton:queue_us_per_client_request:rate1m"]
    assert query == f"({recorded}) or vector(0)"
    # The client-facing models the query counts are exactly the served-models list.
    (models,) = re.findall(r'model=~"([^"]+)"', query)
    assert models.split("|") == find(docs, "ConfigMap", "served-models")["data"][
        "READY_MODELS"
    ].split(",")
