"""What ``loadtest.multimodel`` measured: the hit rate, cold and hot latencies and the memory
against the budget, as its JSON documents, the table and the plot."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.loadgen.samples import Samples
from loadtest.multimodel_settings import MultiModelSettings
from serving.console import Table
from serving.quantiles import quantile

__all__ = ["MemoryUse", "report_table", "save_plot", "write_report"]


@dataclass(frozen=True)
class MemoryUse:
    """Triton's memory during the on-demand phase: ``(seconds, bytes)`` samples, and what they are
    judged against (the baseline before any model, the budget, one model's footprint)."""

    samples: list[tuple[float, int]]
    baseline: int
    budget: int
    footprint: int


def _ms(values: np.ndarray, q: float) -> float:
    return float(quantile(values, q) * 1000) if values.size else math.nan


def write_report(
    settings: MultiModelSettings,
    on_demand: Samples,
    all_loaded: Samples,
    memory: MemoryUse,
    *,
    device: str = "cpu",
) -> dict[str, Any]:
    """The figures of both phases: ``multimodel.json`` (the issue's), ``multimodel-detail.json``
    (the rest) and ``multimodel.png`` in ``settings.out_dir``; returns the detail."""
    baseline, budget, footprint = memory.baseline, memory.budget, memory.footprint
    ok = on_demand.status == 200
    hits = on_demand.latency_s[ok & (on_demand.correct == 1)]
    cold = on_demand.latency_s[ok & (on_demand.correct == 0)]
    every = all_loaded.latency_s[all_loaded.status == 200]
    over = max((used - baseline - budget for _, used in memory.samples), default=0)
    figures = {
        "device": device,
        "models": settings.models,
        "budget_models": settings.budget_models,
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
        "memory": {
            "baseline_bytes": baseline,
            "budget_bytes": budget,
            "footprint_bytes": footprint,
            "samples": [[round(t, 2), used] for t, used in memory.samples],
        },
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(settings).items()},
    }
    out = settings.out_dir
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
        f"{detail['memory']['footprint_bytes'] / 2**20:.0f} MiB",
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


def save_plot(detail: dict[str, Any], path: Path) -> Path:
    """Latency by kind of request beside the memory sampled against baseline + budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
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
    right.axhline(memory["budget_bytes"] / 2**20, color="tab:red", linestyle="--", label="budget")
    right.set_xlabel("seconds")
    right.set_ylabel("Triton memory above baseline (MiB)")
    right.legend()
    fig.suptitle(
        f"{detail['models']} models, budget {detail['budget_models']}: hit rate "
        f"{100 * detail['hit_rate']:.1f}%"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
