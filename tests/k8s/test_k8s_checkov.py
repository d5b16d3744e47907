"""checkov scans what kustomize renders; every finding is either fixed or accepted in one file.

``k8s/checkov-accepted.yaml`` lists each accepted (check, resource) with its reason. The scan fails
on a finding it does not list, and on a listed one checkov no longer reports (a stale acceptance
would hide the next regression of a fixed problem). checkov cannot share the project's environment
(it pins ``packaging<24``): ``./run test`` installs it into ``.tools/checkov``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.k8s_render import K8S, KUSTOMIZATIONS, REPO, rendered

ACCEPTED = K8S / "checkov-accepted.yaml"


def _checkov() -> str:
    for candidate in (
        os.environ.get("CHECKOV", ""),
        str(REPO / ".tools/checkov/bin/checkov"),
        shutil.which("checkov") or "",
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.skip("checkov is not installed: `./run test` installs it into .tools/checkov")


def _accepted() -> dict[tuple[str, str], str]:
    entries = yaml.safe_load(ACCEPTED.read_text())["accepted"]
    return {(e["check"], resource): e["why"] for e in entries for resource in e["resources"]}


def test_every_acceptance_is_explained() -> None:
    for entry in yaml.safe_load(ACCEPTED.read_text())["accepted"]:
        assert entry["check"].startswith("CKV_K8S_") and entry["resources"], entry
        assert len(entry["why"].split()) >= 20, f"{entry['check']}: say why it is accepted"


@pytest.fixture(scope="module")
def findings(tmp_path_factory: pytest.TempPathFactory) -> set[tuple[str, str]]:
    """(check id, resource) of every failed checkov check over every rendered kustomization."""
    checkov = _checkov()
    out = tmp_path_factory.mktemp("rendered")
    for kustomization in KUSTOMIZATIONS:
        (out / (kustomization.replace("/", "_") + ".yaml")).write_text(
            yaml.safe_dump_all(rendered(kustomization))
        )
    result = subprocess.run(
        [
            checkov,
            "--directory",
            str(out),
            "--framework",
            "kubernetes",
            "--output",
            "json",
            "--quiet",
            "--compact",
            "--skip-download",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"},
    )
    assert result.returncode in (0, 1), result.stderr[-2000:]  # 1: some check failed
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    assert sum(r["summary"]["resource_count"] for r in reports) > 0 and not any(
        r["summary"]["parsing_errors"] for r in reports
    )
    return {(f["check_id"], f["resource"]) for r in reports for f in r["results"]["failed_checks"]}


def test_no_finding_is_unaccepted(findings: set[tuple[str, str]]) -> None:
    unaccepted = sorted(findings - set(_accepted()))
    assert unaccepted == [], (
        f"fix these or accept them with a reason in {ACCEPTED.name}: {unaccepted}"
    )


def test_no_acceptance_is_stale(findings: set[tuple[str, str]]) -> None:
    stale = sorted(set(_accepted()) - findings)
    assert stale == [], (
        f"checkov no longer reports these; remove them from {ACCEPTED.name}: {stale}"
    )


def test_the_scan_can_fail(tmp_path: Path) -> None:
    """A privileged container is reported (the scan is not blind to the rendered files)."""
    checkov = _checkov()
    docs = rendered("base")
    gateway = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gateway"
    )
    gateway["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"] = True
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump_all(docs))
    result = subprocess.run(
        [
            checkov,
            "--file",
            str(tmp_path / "broken.yaml"),
            "--framework",
            "kubernetes",
            "--output",
            "json",
            "--quiet",
            "--compact",
            "--skip-download",
            "--check",
            "CKV_K8S_16",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    failed = {
        (f["check_id"], f["resource"])
        for f in json.loads(result.stdout)["results"]["failed_checks"]
    }
    assert ("CKV_K8S_16", "Deployment.inference.gateway") in failed
