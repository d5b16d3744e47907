"""The benchmarks' plots: latency against throughput per configuration, or bars side by side."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtest.bench.gpu_raw import CEILING_MODES
from loadtest.bench.jpeg_reference import INPROCESS_OVERLAPPED
from loadtest.bench.report import machine_line
from loadtest.bench.settings import Result
from loadtest.plotting import saved_figure

__all__ = ["save_bar_plot", "save_gpu_plot", "save_plot"]


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
            _mark_concurrency(ax, rows, offset=4)
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


def _mark_concurrency(ax: Any, points: Sequence[Result], offset: int) -> None:
    """Each P99 point labelled with its concurrency, ``offset`` points up and to the right of it."""
    for r in points:
        ax.annotate(
            f"c={r.concurrency}",
            (r.throughput, r.p99_ms),
            textcoords="offset points",
            xytext=(offset, offset),
            fontsize=7,
        )


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


#: the in-process ceiling's rows (the best of them is drawn as a line)
_CEILING = tuple(f"raw {mode}" for mode in CEILING_MODES)


def save_gpu_plot(rows: list[Result], document: dict[str, Any], path: Path) -> Path:
    """P99 and P50 latency against throughput per served configuration; the ceiling as a line."""
    import matplotlib.pyplot as plt

    with saved_figure(path, figsize=(12, 7), dpi=110) as (_, ax):
        _draw_gpu_paths(ax, plt.get_cmap("tab10"), rows, document)
    return path


def _draw_gpu_paths(ax: Any, colours: Any, rows: list[Result], document: dict[str, Any]) -> None:
    configs = [
        c
        for c in dict.fromkeys(r.config for r in rows)
        if not c.startswith("raw") and c != INPROCESS_OVERLAPPED
    ]
    for index, config in enumerate(configs):
        points = sorted(
            (r for r in rows if r.config == config and r.requests > 0), key=lambda r: r.concurrency
        )
        if not points:
            continue
        colour = colours(index % 10)
        ax.plot(
            [r.throughput for r in points],
            [r.p99_ms for r in points],
            "-o",
            color=colour,
            label=f"{config} P99",
        )
        ax.plot(
            [r.throughput for r in points],
            [r.p50_ms for r in points],
            "--",
            color=colour,
            alpha=0.5,
        )
        _mark_concurrency(ax, points, offset=3)
    ceiling = max(
        (r for r in rows if r.config in _CEILING), key=lambda r: r.throughput, default=None
    )
    if ceiling is not None:
        ax.axvline(
            ceiling.throughput,
            color="black",
            linestyle=":",
            label=f"in-process ceiling {ceiling.throughput:,.0f}/s ({ceiling.config}, batch {ceiling.batch})",
        )
    inprocess = max(
        (r for r in rows if r.config == INPROCESS_OVERLAPPED),
        key=lambda r: r.throughput,
        default=None,
    )
    if inprocess is not None:  # the served JPEG path's reference (issue 28)
        ax.axvline(
            inprocess.throughput,
            color="tab:red",
            linestyle=":",
            label=f"in-process JPEG pipeline {inprocess.throughput:,.0f}/s (batch {inprocess.batch})",
        )
    ax.axhline(20.0, color="grey", linestyle="-.", linewidth=0.8, label="P99 budget 20 ms")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("throughput (images/s)")
    ax.set_ylabel("latency (ms): P99 solid, P50 dashed")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(f"GPU serving paths: {machine_line(document['machine'])}", fontsize=10)
