"""The isolation benchmark's files: the figures, the detail, the table and the plot.

:func:`write_report` writes ``isolation.json`` (exactly the issue's figures), ``isolation-detail.json``,
``isolation.txt`` (the table as plain text, the machine beneath it) and ``isolation.png``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from loadtest.plotting import saved_figure
from serving.console import Table, number_cell

__all__ = ["report_table", "save_plot", "write_report"]


def _statuses(side: dict[str, Any]) -> str:
    return " ".join(f"{status}:{count}" for status, count in side["statuses"].items()) or "-"


def report_table(detail: dict[str, Any]) -> Table:
    """One row per attack: the protected P99 alone and attacked, their ratio against the goal."""
    settings = detail["settings"]
    goal = detail["goal_ratio"]
    table = Table(
        title="Tenant isolation: the enterprise key's P99 alone and while a free-tier key attacks",
        columns=[
            "attack",
            "alone P99 ms",
            "attacked P99 ms",
            "ratio",
            f"<= {goal:g}x",
            "protected errors",
            "gateway CPU (alone / attacked)",
            "loop lag ms (alone / attacked)",
            "attacker's outcomes (status:count)",
        ],
        caption=f"model: fixed service time {settings['service_ms']:g} ms, {settings['instances']} "
        f"instances; protected concurrency {settings['protected_concurrency']}; "
        f"{settings['warmup_s']:g} s warm-up + {settings['duration_s']:g} s measured per run; "
        f"gateway CPU {detail['gateway_cpu_ms_per_request']:.3f} ms per request (protected alone); "
        "attacker status 0: refused or reset connection, 499: abandoned, 200 for idle "
        "connections: held the whole time; loop lag: the gateway event loop's mean timer lateness "
        "(gateway_event_loop_lag_seconds) over the run",
    )
    for row in detail["runs"]:
        alone, attacked = row["alone"]["p99_ms"], row["attacked"]["p99_ms"]
        ratio = (
            attacked / alone
            if alone and not math.isnan(alone) and not math.isnan(attacked)
            else math.nan
        )
        share = row["gateway_cpu_share"]
        lag = (
            row["gateway_split"]["alone"]["loop_lag_ms"],
            row["gateway_split"]["attacked"]["loop_lag_ms"],
        )
        table.add_row(
            row["name"],
            number_cell(alone, ".1f"),
            number_cell(attacked, ".1f"),
            "-" if math.isnan(ratio) else f"{ratio:.2f}x",
            "-" if math.isnan(ratio) else ("yes" if ratio <= goal else "NO"),
            row["attacked"]["errors"],
            f"{100 * share['alone']:.0f}% / {100 * share['attacked']:.0f}%",
            f"{lag[0]:.2f} / {lag[1]:.2f}",
            _statuses(row["attacker"]),
        )
    return table


def save_plot(detail: dict[str, Any], path: Path) -> Path:
    """The protected P99 alone beside attacked, per attack, with the goal marked."""
    runs = detail["runs"]
    labels = [row["name"].replace(" (", "\n(") for row in runs]
    alone = [0.0 if math.isnan(r["alone"]["p99_ms"]) else r["alone"]["p99_ms"] for r in runs]
    attacked = [
        0.0 if math.isnan(r["attacked"]["p99_ms"]) else r["attacked"]["p99_ms"] for r in runs
    ]
    with saved_figure(path, figsize=(12, 5), dpi=110) as (fig, ax):
        ys = range(len(runs))
        ax.barh([y - 0.2 for y in ys], alone, height=0.4, label="alone", color="tab:blue")
        ax.barh([y + 0.2 for y in ys], attacked, height=0.4, label="attacked", color="tab:red")
        ax.scatter(
            [detail["goal_ratio"] * a for a in alone],
            [y + 0.2 for y in ys],
            marker="|",
            s=300,
            color="black",
            label=f"goal: {detail['goal_ratio']:g}x alone",
            zorder=3,
        )
        ax.set_yticks(list(ys), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("protected (enterprise) key's P99 latency, ms")
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(
            f"Tenant isolation (gateway CPU {detail['gateway_cpu_ms_per_request']:.3f} ms/request)",
            fontsize=10,
        )
    return path


def write_report(figures: dict[str, Any], detail: dict[str, Any], out: Path) -> Table:
    """Write the four files into ``out`` (created); returns the table."""
    from loadtest.bench.report import machine_line

    out.mkdir(parents=True, exist_ok=True)
    (out / "isolation.json").write_text(json.dumps(figures, indent=2) + "\n")
    (out / "isolation-detail.json").write_text(json.dumps(detail, indent=2) + "\n")
    table = report_table(detail)
    (out / "isolation.txt").write_text(
        f"{table.plain()}\n\nmachine: {machine_line(detail['machine'])}\n"
    )
    save_plot(detail, out / "isolation.png")
    return table
