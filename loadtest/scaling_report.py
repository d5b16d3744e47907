"""What ``loadtest.scaling`` measured: one :class:`Row` per path, model and concurrency, as the
table (every gateway path against direct Triton) and ``scaling.png``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest.plotting import saved_figure
from serving.console import Table, number_cell

__all__ = ["Row", "report_table", "save_plot"]


@dataclass(frozen=True)
class Row:
    """One path at one concurrency for one model, over every round."""

    model: str
    path: str
    concurrency: int
    requests: int
    errors: int
    throughput: float
    p50_ms: float
    p99_ms: float
    vs_direct: float | None
    added_p50_ms: float | None
    added_p99_ms: float | None
    error_summary: str


def report_table(rows: Sequence[Row], machine: dict[str, object], settings: str) -> Table:
    """The scaling table: every path against direct Triton."""
    table = Table(
        "Gateway scaling: direct Triton vs the gateway (1 and N workers, HTTP or gRPC to Triton)",
        (
            "model",
            "concurrency",
            "path",
            "req/s",
            "P50 ms",
            "P99 ms",
            "vs direct",
            "added P50 ms",
            "added P99 ms",
            "errors",
        ),
        caption=f"{settings}; machine: {machine}",
    )
    for r in rows:
        table.add_row(
            r.model,
            r.concurrency,
            r.path,
            f"{r.throughput:.1f}",
            f"{r.p50_ms:.2f}",
            f"{r.p99_ms:.2f}",
            number_cell(r.vs_direct, ".2f"),
            number_cell(r.added_p50_ms, "+.2f"),
            number_cell(r.added_p99_ms, "+.2f"),
            r.error_summary or str(r.errors),
        )
    return table


def save_plot(rows: Sequence[Row], title: str, path: Path) -> Path:
    """Per model: throughput relative to direct Triton, and the P99 each gateway path adds."""
    models = list(dict.fromkeys(r.model for r in rows))
    with saved_figure(
        path, 2, len(models), figsize=(6 * len(models), 8), squeeze=False, dpi=110
    ) as (fig, axes):
        for column, model in enumerate(models):
            mine = [r for r in rows if r.model == model and r.vs_direct is not None]
            for label in dict.fromkeys(r.path for r in mine):
                series = sorted((r for r in mine if r.path == label), key=lambda r: r.concurrency)
                x = [r.concurrency for r in series]
                axes[0][column].plot(x, [r.vs_direct for r in series], "-o", label=label)
                axes[1][column].plot(x, [r.added_p99_ms for r in series], "-o", label=label)
            axes[0][column].axhline(1.0, color="black", linestyle=":", linewidth=1)
            axes[0][column].set_title(model)
            axes[0][column].set_ylabel("throughput / direct Triton")
            axes[1][column].set_ylabel("added P99 (ms)")
            for ax in (axes[0][column], axes[1][column]):
                ax.set_xscale("log", base=2)
                ax.set_xlabel("concurrency")
                ax.grid(True, alpha=0.3)
                ax.legend(fontsize=8)
        fig.suptitle(title, fontsize=9)
    return path
