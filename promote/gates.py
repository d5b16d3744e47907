"""The three gates a candidate passes before it may take traffic.

- parity: the candidate's build report shows the artifact within its tolerance of PyTorch, and the
  artifact on disk is the one the report describes.
- accuracy: the family's evaluation (:mod:`builders.evaluation`: class agreement on the golden
  photographs, embedding cosine on held-out sentences, PSNR at a fixed seed, ...) passes against
  production, through Triton.
- latency: under the same fixed load, the candidate's P99 and throughput do not regress past the
  configured budget. Production and candidate are measured in alternating rounds so that noise on a
  shared machine hits both alike.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from builders.report import REPORT_NAME, BuildReport, file_sha256
from builders.spec import ModelSpec
from promote.evaluation import EvaluationData, compare, infer_batch
from promote.measure import LoadResult, LoadShape, run_load

__all__ = ["GateResult", "PromotionPolicy", "accuracy_gate", "latency_gate", "parity_gate"]


@dataclass(frozen=True)
class PromotionPolicy:
    """Thresholds of the latency gate and the canary (accuracy thresholds are the family's: see
    :mod:`builders.evaluation`). Ratios are fractions (0.25 = 25 %).

    Attributes:
        load_warmup_s: sent before each measured round of the latency gate, not measured (the
            round's connections, the first batch shapes a version sees).
        canary_duration_s: the canary lasts at least this long ...
        min_canary_requests: ... and until version N+1 has answered this many requests (a canary
            nobody called proves nothing), but at most ``canary_timeout_s``: then it fails.
        max_canary_error_rate: failed / all requests on N+1 (and its canary pipelines) during the canary.
        settle_s: pause after a weight change that precedes unloading what the old weights named:
            replicas sharing weights through Redis apply a change within their sync interval.
    """

    max_p99_regression: float = 0.5
    max_throughput_drop: float = 0.3
    load_concurrency: int = 8
    load_warmup_s: float = 0.5
    load_duration_s: float = 3.0
    load_rounds: int = 2
    canary_share: float = 0.1
    canary_duration_s: float = 3.0
    min_canary_requests: int = 1
    canary_timeout_s: float = 120.0
    max_canary_error_rate: float = 0.0
    settle_s: float = 1.0


@dataclass
class GateResult:
    name: str
    passed: bool
    reason: str = ""
    figures: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def parity_gate(spec: ModelSpec, entry: Path, version: int) -> GateResult:
    """Check the candidate's recorded parity against its spec's tolerance and the artifact's hash."""
    report_path = entry / str(version) / REPORT_NAME
    if not report_path.exists():
        return GateResult("parity", False, f"no build report at {report_path}")
    report = BuildReport.read(report_path)
    artifact = report.artifacts.get("model")
    if not artifact:
        return GateResult("parity", False, "the build report names no model artifact")
    actual = file_sha256(entry / str(version) / artifact["file"])
    if actual != artifact["sha256"]:
        return GateResult(
            "parity",
            False,
            f"{artifact['file']} does not match its build report (sha256 {actual[:12]})",
        )
    tolerance = spec.tolerance
    if not report.parity:
        return GateResult("parity", False, "the build report has no parity figures")
    from builders.parity import ParityResult

    problems = [
        f"{out}: {p}"
        for out, figures in report.parity.items()
        for p in ParityResult(**figures).failures(tolerance)
    ]
    return GateResult("parity", not problems, "; ".join(problems), {"parity": report.parity})


def accuracy_gate(
    url: str, production: tuple[str, str], candidate: tuple[str, str], data: EvaluationData
) -> GateResult:
    """The family's evaluation of (model, version) ``candidate`` against ``production``, through Triton."""
    outcome = compare(data, infer_batch(url, *production, data), infer_batch(url, *candidate, data))
    return GateResult(
        "accuracy",
        outcome.passed,
        outcome.reason,
        {"metric": type(data.metric).__name__, **outcome.figures},
    )


def latency_gate(
    url: str,
    production: tuple[str, str],
    candidate: tuple[str, str],
    data: EvaluationData,
    policy: PromotionPolicy,
) -> GateResult:
    """Same fixed load on both (one evaluation input per request), alternating rounds; compare
    median-of-rounds P99 and throughput."""
    request = data.first_row()
    runs: dict[str, list[LoadResult]] = {"production": [], "candidate": []}
    for _ in range(policy.load_rounds):
        for label, (model, version) in (("production", production), ("candidate", candidate)):
            runs[label].append(
                run_load(
                    url,
                    model,
                    request,
                    version=version,
                    shape=LoadShape(
                        policy.load_concurrency, policy.load_duration_s, policy.load_warmup_s
                    ),
                )
            )

    def median(label: str, attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in runs[label])

    figures: dict[str, Any] = {
        label: {
            "p99_ms": median(label, "p99_ms"),
            "p50_ms": median(label, "p50_ms"),
            "throughput_rps": median(label, "throughput"),
            "errors": sum(r.errors for r in runs[label]),
            "error_summary": "; ".join(
                sorted({r.error_summary() for r in runs[label] if r.errors})
            ),
        }
        for label in runs
    }
    figures["settings"] = {
        "concurrency": policy.load_concurrency,
        "warmup_s": policy.load_warmup_s,
        "duration_s": policy.load_duration_s,
        "rounds": policy.load_rounds,
    }
    prod, cand = figures["production"], figures["candidate"]
    problems = []
    if cand["errors"]:
        problems.append(f"{cand['errors']} failed requests under load ({cand['error_summary']})")
    if cand["p99_ms"] > prod["p99_ms"] * (1 + policy.max_p99_regression):
        problems.append(
            f"P99 {cand['p99_ms']:.1f} ms > production {prod['p99_ms']:.1f} ms + "
            f"{policy.max_p99_regression:.0%}"
        )
    if cand["throughput_rps"] < prod["throughput_rps"] * (1 - policy.max_throughput_drop):
        problems.append(
            f"throughput {cand['throughput_rps']:.1f}/s < production {prod['throughput_rps']:.1f}/s "
            f"- {policy.max_throughput_drop:.0%}"
        )
    return GateResult("latency", not problems, "; ".join(problems), figures)
