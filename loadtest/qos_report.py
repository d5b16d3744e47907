"""What ``loadtest.qos`` measured: one :class:`TierFigures` per tier and run, as the table (premium
P50/P99 and throughput beside the free tier's shed and timed-out shares) and ``qos.png``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.loadgen import LoadResult
from loadtest.plotting import saved_figure
from serving.console import Table, number_cell

__all__ = ["TierFigures", "report_table", "save_plot", "tier_figures"]


@dataclass(frozen=True)
class TierFigures:
    """One tier's figures in one run."""

    tier: str
    concurrency: int
    throughput: float
    p50_ms: float
    p99_ms: float
    requests: int
    shed: int
    timed_out: int
    other_errors: int

    @property
    def total(self) -> int:
        return self.requests + self.shed + self.timed_out + self.other_errors

    @property
    def shed_rate(self) -> float:
        return self.shed / self.total if self.total else math.nan

    @property
    def timeout_rate(self) -> float:
        return self.timed_out / self.total if self.total else math.nan


def tier_figures(tier: str, result: LoadResult) -> TierFigures:
    """``result`` of one tier, its failures split into shed (429), timed out (504) and the rest."""
    shed = result.statuses.get(429, 0)
    timed_out = result.statuses.get(504, 0)
    return TierFigures(
        tier,
        result.concurrency,
        result.throughput,
        result.p50_ms,
        result.p99_ms,
        result.requests,
        shed,
        timed_out,
        result.errors - shed - timed_out,
    )


def report_table(
    runs: dict[str, list[TierFigures]], document: dict[str, Any], *, model: str
) -> Table:
    """The QoS table: a row per run, premium figures beside the free tier's."""
    offered = document["offered"]
    table = Table(
        title=f"QoS at {document['settings']['load']:g}x the saturating concurrency "
        f"(C={document['saturating_concurrency']}: premium x{offered['premium']}, free x{offered['free']})",
        columns=[
            "run",
            "premium req/s",
            "premium P50 ms",
            "premium P99 ms",
            "free req/s",
            "free shed (429)",
            "free timed out (504)",
            "free P99 ms",
            "other errors",
        ],
        caption=f"model {model}: fixed service time {document['settings']['service_ms']} ms, "
        f"{document['settings']['instances']} instances (capacity {document['capacity_rps']:.0f} req/s); "
        f"gateway in-flight bound {offered['in_flight_bound']}; clients "
        f"{'honour' if document['settings']['polite'] else 'ignore'} Retry-After",
    )
    for label, figures in runs.items():
        by_tier = {f.tier: f for f in figures}
        p, f = by_tier.get("premium"), by_tier.get("free")
        table.add_row(
            label,
            f"{p.throughput:.1f}" if p else "-",
            number_cell(p.p50_ms, ".1f") if p else "-",
            number_cell(p.p99_ms, ".1f") if p else "-",
            f"{f.throughput:.1f}" if f else "-",
            number_cell(f.shed_rate, ".1%") if f else "-",
            number_cell(f.timeout_rate, ".1%") if f else "-",
            number_cell(f.p99_ms, ".1f") if f else "-",
            sum(x.other_errors for x in figures),
        )
    return table


def save_plot(runs: dict[str, list[TierFigures]], document: dict[str, Any], path: Path) -> Path:
    """Premium P50/P99 per run beside the free tier's shed rate."""
    labels = list(runs)
    premium = [next((f for f in runs[k] if f.tier == "premium"), None) for k in labels]
    free = [next((f for f in runs[k] if f.tier == "free"), None) for k in labels]
    with saved_figure(path, 1, 2, figsize=(11, 4.2), dpi=120) as (fig, (left, right)):
        xs = range(len(labels))
        left.bar(
            [x - 0.2 for x in xs], [p.p50_ms if p else 0 for p in premium], width=0.4, label="P50"
        )
        left.bar(
            [x + 0.2 for x in xs], [p.p99_ms if p else 0 for p in premium], width=0.4, label="P99"
        )
        left.set_xticks(list(xs), labels)
        left.set_ylabel("premium latency (ms)")
        left.legend()
        right.bar(list(xs), [100 * f.shed_rate if f else 0 for f in free], color="tab:red")
        right.set_xticks(list(xs), labels)
        right.set_ylabel("free-tier requests shed with 429 (%)")
        fig.suptitle(
            f"QoS at {document['settings']['load']:g}x saturation "
            f"(C={document['saturating_concurrency']}, capacity {document['capacity_rps']:.0f} req/s)"
        )
    return path
