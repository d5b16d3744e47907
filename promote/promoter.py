"""The promotion sequence, with automatic rollback.

    candidate build -> gates (parity, accuracy, latency) -> publish as version N+1
    -> load N and N+1 side by side (gateway pins traffic to N first) -> smoke test N+1
    -> canary share of gateway traffic -> full traffic -> unload N

Any failure after publishing puts traffic back on N, unloads N+1 and removes it from the repository.
Every attempt leaves a :class:`PromotionRecord`.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from builders import repository as repo
from builders.registry import get_spec
from builders.report import REPORT_NAME, BuildReport
from promote.gates import GateResult, PromotionPolicy, accuracy_gate, latency_gate, parity_gate
from promote.golden import golden_set
from promote.measure import classify
from promote.records import PromotionRecord, history
from promote.triton_control import TritonControl

__all__ = ["ALL_GATES", "GatewayTraffic", "PromotionError", "PromotionTarget", "promote"]

ALL_GATES = ("parity", "accuracy", "latency")


class PromotionError(Exception):
    """The promotion could not start (bad candidate, nothing in production to compare against)."""


@dataclass(frozen=True)
class GatewayTraffic:
    """The gateway's admin API for per-model version weights (canary routing)."""

    url: str
    admin_token: str

    def split(self, model: str, weights: dict[int, float]) -> None:
        response = httpx.put(f"{self.url}/admin/traffic/{model}", timeout=10,
                             headers={"Authorization": f"Bearer {self.admin_token}"},
                             json={"versions": {str(v): w for v, w in weights.items()}})
        response.raise_for_status()

    def clear(self, model: str) -> None:
        response = httpx.delete(f"{self.url}/admin/traffic/{model}", timeout=10,
                                headers={"Authorization": f"Bearer {self.admin_token}"})
        if response.status_code != 404:
            response.raise_for_status()


@dataclass(frozen=True)
class PromotionTarget:
    """Where production lives: the served repository, its Triton, and optionally the gateway."""

    repository: Path
    triton_url: str
    records_dir: Path
    gateway: GatewayTraffic | None = None


def _candidate(candidate_repo: Path, model: str) -> tuple[Path, int, BuildReport]:
    entry = candidate_repo / model
    version = repo.latest_version(candidate_repo, model)
    if version is None or not (entry / "config.pbtxt").exists():
        raise PromotionError(f"no built entry for '{model}' in candidate repository {candidate_repo}")
    report_path = entry / str(version) / REPORT_NAME
    if not report_path.exists():
        raise PromotionError(f"candidate {entry / str(version)} has no {REPORT_NAME}")
    return entry, version, BuildReport.read(report_path)


def _failures(triton: TritonControl, model: str, version: int) -> int:
    stats = triton.client.get_inference_statistics(model, str(version))["model_stats"][0]
    return int(stats["inference_stats"]["fail"]["count"])


def promote(
    model: str,
    candidate_repo: Path,
    target: PromotionTarget,
    *,
    policy: PromotionPolicy | None = None,
    gates: Iterable[str] = ALL_GATES,
    publish: bool = True,
    log: Callable[[str], None] = print,
) -> PromotionRecord:
    """Run the gates on a candidate and, when they pass and ``publish`` is set, roll it out.

    Gates that an earlier record already passed for the same candidate artifact are not run again
    (so CI can run each gate as its own step and publish last).

    Raises:
        PromotionError: the candidate or production entry is missing.
    """
    policy = policy or PromotionPolicy()
    entry, candidate_version, report = _candidate(candidate_repo, model)
    sha = report.artifacts.get("model", {}).get("sha256", "")
    production = repo.latest_version(target.repository, model)
    if production is None:
        raise PromotionError(f"'{model}' has no production version in {target.repository}; build it there first")
    record = PromotionRecord(model=model, candidate=str(candidate_repo.resolve()), candidate_sha256=sha,
                             production_version=production)
    for earlier in history(target.records_dir, model):
        if earlier.candidate_sha256 == sha:
            record.gates.update({k: v for k, v in earlier.gates.items() if v.get("passed")})
    wanted = [g for g in gates if g not in record.gates]
    triton = TritonControl(target.triton_url)
    try:
        _run_gates(model, entry, candidate_version, production, wanted, record, triton, target, policy, log)
        missing = [g for g in ALL_GATES if not record.gates.get(g, {}).get("passed")]
        if any(not record.gates[g]["passed"] for g in wanted):
            failed = {g: record.gates[g]["reason"] for g in wanted if not record.gates[g]["passed"]}
            record.finish("refused", "; ".join(f"{g}: {r}" for g, r in failed.items()))
        elif not publish:
            record.finish("gates-passed")
        elif missing:
            record.finish("refused", f"gates not passed: {', '.join(missing)}")
        else:
            _roll_out(model, entry, candidate_version, report, production, record, triton, target, policy, log)
    finally:
        record.write(target.records_dir)
    log(f"{model}: {record.decision}{' (' + record.reason + ')' if record.reason else ''}")
    return record


def _run_gates(model: str, entry: Path, version: int, production: int, wanted: list[str], record: PromotionRecord,
               triton: TritonControl, target: PromotionTarget, policy: PromotionPolicy,
               log: Callable[[str], None]) -> None:
    if "parity" in wanted:
        _keep(record, parity_gate(model, entry, version), log)
    served = [g for g in wanted if g != "parity"]
    if not served:
        return
    spec = get_spec(model)
    golden = golden_set(getattr(spec, "preprocessing", {}))
    candidate_name = f"{model}__candidate"
    triton.load_candidate(entry, version, candidate_name)
    record.step("candidate loaded", as_model=candidate_name)
    try:
        prod, cand = (model, str(production)), (candidate_name, "1")
        if "accuracy" in served:
            _keep(record, accuracy_gate(target.triton_url, prod, cand, golden, policy), log)
        if "latency" in served:
            _keep(record, latency_gate(target.triton_url, prod, cand, golden[0].pixels, policy), log)
    finally:
        triton.unload(candidate_name)
        record.step("candidate unloaded")


def _keep(record: PromotionRecord, result: GateResult, log: Callable[[str], None]) -> None:
    record.gates[result.name] = result.as_dict()
    record.step(f"gate {result.name}", passed=result.passed)
    log(f"gate {result.name}: {'passed' if result.passed else 'FAILED ' + result.reason}")


def _roll_out(model: str, entry: Path, candidate_version: int, report: BuildReport, production: int,
              record: PromotionRecord, triton: TritonControl, target: PromotionTarget, policy: PromotionPolicy,
              log: Callable[[str], None]) -> None:
    from builders.triton_config import read_config

    new = production + 1
    record.new_version = new
    gateway = target.gateway
    try:
        if gateway:
            gateway.split(model, {production: 1.0})  # pin traffic before N+1 becomes loadable
        report.version = new
        files = {p.name: p for p in (entry / str(candidate_version)).iterdir() if p.is_file() and p.name != REPORT_NAME}
        config = read_config(target.repository / model / "config.pbtxt")
        repo.publish(target.repository, config, files, report)
        record.step("published", version=new)
        triton.serve_versions(target.repository, model, [production, new])
        record.step("loaded side by side", versions=[production, new])

        golden = golden_set(getattr(get_spec(model), "preprocessing", {}))
        pixels = np.stack([g.pixels for g in golden])
        before = classify(target.triton_url, model, pixels, version=str(production))
        after = classify(target.triton_url, model, pixels, version=str(new))
        record.step("smoke test", agreement=float(np.mean(before == after)))

        if gateway:
            failures = _failures(triton, model, new)
            gateway.split(model, {production: 1 - policy.canary_share, new: policy.canary_share})
            record.step("canary", share=policy.canary_share, seconds=policy.canary_duration_s)
            log(f"canary: {policy.canary_share:.0%} of traffic on version {new} for {policy.canary_duration_s:.0f} s")
            time.sleep(policy.canary_duration_s)
            failed = _failures(triton, model, new) - failures
            if failed > 0 and policy.max_canary_error_rate == 0:
                raise RuntimeError(f"{failed} requests failed on version {new} during the canary")
            gateway.split(model, {new: 1.0})
        record.step("full traffic", version=new)
        triton.serve_versions(target.repository, model, [new])
        if gateway:
            gateway.clear(model)
        record.step("retired", version=production)
        record.finish("promoted")
    except Exception as exc:
        log(f"rolling back: {exc}")
        if gateway:
            gateway.split(model, {production: 1.0})
        triton.serve_versions(target.repository, model, [production])
        shutil.rmtree(target.repository / model / str(new), ignore_errors=True)
        if gateway:
            gateway.clear(model)
        record.step("rolled back", to=production)
        record.finish("rolled-back", f"{type(exc).__name__}: {exc}")
