"""The multimodel benchmark's report: its figures and detail documents, the table and the plot, and
what the gateway's own residency metrics say of the loads (:mod:`loadtest.multimodel` runs it)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.loadgen.samples import Samples
from loadtest.options import settings_record
from loadtest.plotting import saved_figure
from serving.console import Table
from serving.quantiles import quantile

__all__ = [
    "MemoryRecord",
    "load_figures",
    "report_table",
    "save_plot",
    "scrape_metrics",
    "write_report",
]


def load_figures(metrics_text: str) -> dict[str, Any]:
    """What the gateway's residency metrics say of the loads it ran (all models together).

    Returns:
        ``loads`` by outcome, ``evictions`` by reason, and the Triton load time alone (queueing
        excluded): ``load_count``, ``load_mean_s`` and ``load_p50_s``/``load_p99_s`` (the upper bound
        of the histogram bucket holding that quantile).
    """
    from prometheus_client.parser import text_string_to_metric_families

    loads: dict[str, float] = {}
    evictions: dict[str, float] = {}
    buckets: dict[float, float] = {}
    total = count = 0.0
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "gateway_model_loads_total":
                outcome = sample.labels["outcome"]
                loads[outcome] = loads.get(outcome, 0) + sample.value
            elif sample.name == "gateway_model_evictions_total":
                reason = sample.labels["reason"]
                evictions[reason] = evictions.get(reason, 0) + sample.value
            elif sample.name == "gateway_model_cold_load_seconds_bucket":
                bound = float(sample.labels["le"])
                buckets[bound] = buckets.get(bound, 0) + sample.value
            elif sample.name == "gateway_model_cold_load_seconds_sum":
                total += sample.value
            elif sample.name == "gateway_model_cold_load_seconds_count":
                count += sample.value

    def bucket_quantile(q: float) -> float:
        for bound, cumulative in sorted(buckets.items()):
            if count and cumulative >= q * count:
                return bound
        return math.nan

    return {
        "loads": loads,
        "evictions": evictions,
        "load_count": int(count),
        "load_mean_s": total / count if count else math.nan,
        "load_p50_s": bucket_quantile(0.50),
        "load_p99_s": bucket_quantile(0.99),
    }


def scrape_metrics(url: str, token: str) -> str:
    """The gateway's ``/metrics`` text (the admin token reads it)."""
    import urllib.request

    request = urllib.request.Request(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return str(response.read().decode())


def _ms(values: np.ndarray, q: float) -> float:
    return float(quantile(values, q) * 1000) if values.size else math.nan


@dataclass(frozen=True)
class MemoryRecord:
    """The memory side of a run, in bytes: what the meter read before any model was loaded, the
    budget the gateway was given, one model's footprint, and the ``(seconds, used)`` samples."""

    baseline: int
    budget: int
    footprint: int
    samples: list[tuple[float, int]]


def write_report(
    settings: dict[str, Any],
    on_demand: Samples,
    all_loaded: Samples,
    loads: dict[str, Any],
    memory: MemoryRecord,
    *,
    device: str = "cpu",
) -> dict[str, Any]:
    baseline, budget, footprint = memory.baseline, memory.budget, memory.footprint
    ok = on_demand.status == 200
    hits = on_demand.latency_s[ok & (on_demand.correct == 1)]
    cold = on_demand.latency_s[ok & (on_demand.correct == 0)]
    every = all_loaded.latency_s[all_loaded.status == 200]
    over = max((used - baseline - budget for _, used in memory.samples), default=0)
    figures = {
        "device": device,
        "models": settings["models"],
        "budget_models": settings["budget_models"],
        "hit_rate": float(hits.size / max(1, hits.size + cold.size)),
        "cold_load_p99_ms": _ms(cold, 0.99),
        "hot_p99_ms": _ms(hits, 0.99),
        "all_loaded_p99_ms": _ms(every, 0.99),
        "max_memory_over_budget_bytes": int(max(0, over)),
    }
    detail = {
        **figures,
        "cold_load_p50_ms": _ms(cold, 0.50),
        "hot_p50_ms": _ms(hits, 0.50),
        "all_loaded_p50_ms": _ms(every, 0.50),
        "requests": {
            "hits": int(hits.size),
            "cold": int(cold.size),
            "errors": int((~ok).sum()),
            "all_loaded": int(every.size),
            "all_loaded_errors": int((all_loaded.status != 200).sum()),
            "first_error_by_status": {
                str(k): v for k, v in {**all_loaded.messages, **on_demand.messages}.items()
            },
        },
        "on_demand_loads": loads,
        "memory": {
            "baseline_bytes": baseline,
            "budget_bytes": budget,
            "footprint_bytes": footprint,
            "samples": [[round(t, 2), used] for t, used in memory.samples],
        },
        "settings": settings_record(settings),
    }
    out = Path(settings["out_dir"])
    (out / "multimodel.json").write_text(json.dumps(figures, indent=2) + "\n")
    (out / "multimodel-detail.json").write_text(json.dumps(detail, indent=2) + "\n")
    save_plot(detail, out / "multimodel.png")
    return detail


def report_table(detail: dict[str, Any]) -> Table:
    table = Table(
        title=f"{detail['models']} models, a budget of {detail['budget_models']} "
        f"({detail['memory']['budget_bytes'] / 2**20:.0f} MiB), Zipf s={detail['settings']['zipf_s']}",
        columns=["traffic", "requests", "P50 ms", "P99 ms"],
        caption=f"hit rate {100 * detail['hit_rate']:.1f}%; memory above baseline + budget at most "
        f"{detail['max_memory_over_budget_bytes']} bytes; one model's footprint "
        f"{detail['memory']['footprint_bytes'] / 2**20:.0f} MiB; "
        + _loads_caption(detail["on_demand_loads"]),
    )
    counts = detail["requests"]
    table.add_row(
        "hits (model loaded)",
        counts["hits"],
        f"{detail['hot_p50_ms']:.1f}",
        f"{detail['hot_p99_ms']:.1f}",
    )
    table.add_row(
        "cold (waited for a load)",
        counts["cold"],
        f"{detail['cold_load_p50_ms']:.1f}",
        f"{detail['cold_load_p99_ms']:.1f}",
    )
    table.add_row(
        "all models loaded",
        counts["all_loaded"],
        f"{detail['all_loaded_p50_ms']:.1f}",
        f"{detail['all_loaded_p99_ms']:.1f}",
    )
    return table


def _loads_caption(loads: dict[str, Any]) -> str:
    """The on-demand phase's loads as the gateway counted them, and the stub's start on the GPU."""
    text = (
        f"{loads['load_count']} loads ({loads['loads'].get('failed', 0):.0f} failed), Triton's part "
        f"{loads['load_mean_s']:.2f} s on average (P99 <= {loads['load_p99_s']:g} s), "
        f"{sum(loads['evictions'].values()):.0f} evictions"
    )
    if loads.get("load_alone_s"):
        text += (
            "; loads alone (no traffic): "
            + ", ".join(f"{v:.2f}" for v in loads["load_alone_s"])
            + " s"
        )
    stub = loads.get("stub_start_s")
    if stub:
        text += "; a stub's start: " + ", ".join(f"{k} {v:.2f} s" for k, v in stub.items())
    return text


def save_plot(detail: dict[str, Any], path: Path) -> Path:
    """Latency by kind of request beside the memory sampled against baseline + budget."""
    with saved_figure(path, 1, 2, figsize=(11, 4.2), dpi=120) as (fig, (left, right)):
        labels = ["hits", "all loaded", "cold"]
        p50 = [detail["hot_p50_ms"], detail["all_loaded_p50_ms"], detail["cold_load_p50_ms"]]
        p99 = [detail["hot_p99_ms"], detail["all_loaded_p99_ms"], detail["cold_load_p99_ms"]]
        xs = range(len(labels))
        left.bar(
            [x - 0.2 for x in xs], [0 if math.isnan(v) else v for v in p50], width=0.4, label="P50"
        )
        left.bar(
            [x + 0.2 for x in xs], [0 if math.isnan(v) else v for v in p99], width=0.4, label="P99"
        )
        left.set_xticks(list(xs), labels)
        left.set_yscale("log")
        left.set_ylabel("latency (ms)")
        left.legend()
        memory = detail["memory"]
        samples = memory["samples"]
        right.plot(
            [t for t, _ in samples],
            [(u - memory["baseline_bytes"]) / 2**20 for _, u in samples],
            label="models",
        )
        right.axhline(
            memory["budget_bytes"] / 2**20, color="tab:red", linestyle="--", label="budget"
        )
        right.set_xlabel("seconds")
        right.set_ylabel("Triton memory above baseline (MiB)")
        right.legend()
        fig.suptitle(
            f"{detail['models']} models, budget {detail['budget_models']}: hit rate "
            f"{100 * detail['hit_rate']:.1f}%"
        )
    return path
