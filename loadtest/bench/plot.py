"""The benchmarks' plots: latency against throughput per configuration, or bars side by side."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtest.bench.report import machine_line
from loadtest.bench.settings import Result
from loadtest.plotting import saved_figure

__all__ = ["save_bar_plot", "save_plot"]


def save_plot(
    results: list[Result],
    ratios: dict[str, Any],
    machine: dict[str, Any],
    settings_line: str,
    path: Path,
) -> Path:
    """Latency (P50 dashed, P99 solid) against throughput, one line per configuration."""
    with saved_figure(path, figsize=(11, 7), dpi=120, rect=(0, 0.05, 1, 1)) as (fig, ax):
        colours = {
            "triton-batching": "tab:green",
            "triton-no-batching": "tab:orange",
            "gateway": "tab:blue",
            "naive": "tab:red",
            "gateway-jpeg": "tab:purple",
            "naive-jpeg": "tab:brown",
        }
        for config, colour in colours.items():
            rows = sorted(
                (r for r in results if r.config == config and r.requests > 0),
                key=lambda r: r.concurrency,
            )
            if not rows:
                continue
            x = [r.throughput for r in rows]
            ax.plot(x, [r.p99_ms for r in rows], "-o", color=colour, label=f"{config} P99")
            ax.plot(
                x, [r.p50_ms for r in rows], "--", color=colour, alpha=0.6, label=f"{config} P50"
            )
            for r in rows:
                ax.annotate(
                    f"c={r.concurrency}",
                    (r.throughput, r.p99_ms),
                    textcoords="offset points",
                    xytext=(4, 4),
                    fontsize=7,
                )
        raw = [r for r in results if r.config == "raw"]
        if raw:
            best = max(raw, key=lambda r: r.throughput)
            ax.axvline(
                best.throughput,
                color="black",
                linestyle=":",
                label=f"raw runtime limit ({best.throughput:,.0f}/s at batch {best.batch})",
            )
        ax.set_xlabel("throughput (requests/s; raw: images/s)")
        ax.set_ylabel("latency (ms)")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
        eff = ratios.get("efficiency_direct")
        ax.set_title(
            f"Latency vs throughput: {machine_line(machine)}"
            + (f"\nefficiency {eff:.1%} of raw" if eff else ""),
            fontsize=10,
        )
        fig.text(0.01, 0.01, settings_line, fontsize=7, wrap=True)
    return path


def save_bar_plot(path: Path, title: str, rows: Sequence[Any]) -> None:
    """Throughput (``texts_per_s``) and P99 (``p99_ms``) per configuration (``config``), side by side."""
    labels = [r.config.replace(" (", "\n(") for r in rows]
    with saved_figure(path, 1, 2, figsize=(12, 4.5), dpi=110) as (figure, (left, right)):
        left.barh(labels, [r.texts_per_s for r in rows], color="tab:blue")
        left.set_xlabel("texts/s (higher is better)")
        right.barh(labels, [r.p99_ms for r in rows], color="tab:orange")
        right.set_xlabel("P99 latency, ms (lower is better)")
        right.set_yticklabels([])
        for axis in (left, right):
            axis.invert_yaxis()
            axis.grid(axis="x", alpha=0.3)
        figure.suptitle(title, fontsize=10)
