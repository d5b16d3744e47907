"""The three gates a candidate passes before it may take traffic.

- parity: the candidate's build report shows the artifact within its tolerance of PyTorch, and the
  artifact on disk is the one the report describes.
- accuracy: on the golden set, the candidate is as accurate as production (within a drop budget)
  and agrees with it on the unlabelled photographs.
- latency: under the same fixed load, the candidate's P99 and throughput do not regress past the
  configured budget. Production and candidate are measured in alternating rounds so that noise on a
  shared machine hits both alike.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from builders.registry import get_spec
from builders.report import REPORT_NAME, BuildReport, file_sha256
from promote.golden import GoldenItem
from promote.measure import LoadResult, classify, run_load

__all__ = ["GateResult", "PromotionPolicy", "accuracy_gate", "latency_gate", "parity_gate"]


@dataclass(frozen=True)
class PromotionPolicy:
    """Thresholds of the gates and the canary. Ratios are fractions (0.25 = 25 %)."""

    max_accuracy_drop: float = 0.0
    min_agreement: float = 0.9
    max_p99_regression: float = 0.5
    max_throughput_drop: float = 0.3
    load_concurrency: int = 8
    load_duration_s: float = 3.0
    load_rounds: int = 2
    canary_share: float = 0.1
    canary_duration_s: float = 3.0
    max_canary_error_rate: float = 0.0


@dataclass
class GateResult:
    name: str
    passed: bool
    reason: str = ""
    figures: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def parity_gate(model: str, entry: Path, version: int) -> GateResult:
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
        return GateResult("parity", False, f"{artifact['file']} does not match its build report (sha256 {actual[:12]})")
    spec = get_spec(model)
    tolerance = getattr(spec, "tolerance", None)
    if not report.parity or tolerance is None:
        return GateResult("parity", False, "the build report has no parity figures")
    from builders.parity import ParityResult

    problems = [f"{out}: {p}" for out, figures in report.parity.items()
                for p in ParityResult(**figures).failures(tolerance)]
    return GateResult("parity", not problems, "; ".join(problems), {"parity": report.parity})


def accuracy_gate(url: str, production: tuple[str, str], candidate: tuple[str, str], golden: list[GoldenItem],
                  policy: PromotionPolicy) -> GateResult:
    """Compare (model, version) ``candidate`` with ``production`` on the golden set, through Triton."""
    pixels = np.stack([item.pixels for item in golden])
    prod = classify(url, production[0], pixels, version=production[1])
    cand = classify(url, candidate[0], pixels, version=candidate[1])
    labelled = [i for i, item in enumerate(golden) if item.accepted]

    def accuracy(top1: np.ndarray) -> float:
        return float(np.mean([top1[i] in golden[i].accepted for i in labelled])) if labelled else 1.0  # type: ignore[operator]

    figures = {
        "production_accuracy": accuracy(prod),
        "candidate_accuracy": accuracy(cand),
        "agreement": float(np.mean(prod == cand)),
        "golden_items": len(golden),
        "labelled_items": len(labelled),
    }
    problems = []
    if figures["candidate_accuracy"] < figures["production_accuracy"] - policy.max_accuracy_drop:
        problems.append(f"accuracy {figures['candidate_accuracy']:.3f} < production {figures['production_accuracy']:.3f}"
                        f" - {policy.max_accuracy_drop}")
    if figures["agreement"] < policy.min_agreement:
        problems.append(f"top-1 agreement with production {figures['agreement']:.3f} < {policy.min_agreement}")
    return GateResult("accuracy", not problems, "; ".join(problems), figures)


def latency_gate(url: str, production: tuple[str, str], candidate: tuple[str, str], pixels: np.ndarray,
                 policy: PromotionPolicy) -> GateResult:
    """Same fixed load on both, alternating rounds; compare median-of-rounds P99 and throughput."""
    runs: dict[str, list[LoadResult]] = {"production": [], "candidate": []}
    for _ in range(policy.load_rounds):
        for label, (model, version) in (("production", production), ("candidate", candidate)):
            runs[label].append(run_load(url, model, pixels, version=version, concurrency=policy.load_concurrency,
                                        duration_s=policy.load_duration_s))

    def median(label: str, attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in runs[label])

    figures: dict[str, Any] = {
        label: {"p99_ms": median(label, "p99_ms"), "p50_ms": median(label, "p50_ms"),
                "throughput_rps": median(label, "throughput_rps"), "errors": sum(r.errors for r in runs[label])}
        for label in runs
    }
    figures["settings"] = {"concurrency": policy.load_concurrency, "duration_s": policy.load_duration_s,
                           "rounds": policy.load_rounds}
    prod, cand = figures["production"], figures["candidate"]
    problems = []
    if cand["errors"]:
        problems.append(f"{cand['errors']} failed requests under load")
    if cand["p99_ms"] > prod["p99_ms"] * (1 + policy.max_p99_regression):
        problems.append(f"P99 {cand['p99_ms']:.1f} ms > production {prod['p99_ms']:.1f} ms + {policy.max_p99_regression:.0%}")
    if cand["throughput_rps"] < prod["throughput_rps"] * (1 - policy.max_throughput_drop):
        problems.append(f"throughput {cand['throughput_rps']:.1f}/s < production {prod['throughput_rps']:.1f}/s "
                        f"- {policy.max_throughput_drop:.0%}")
    return GateResult("latency", not problems, "; ".join(problems), figures)
