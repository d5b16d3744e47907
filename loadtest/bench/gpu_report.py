"""The GPU benchmark's report: the tables of one run (its rows, the in-process ceiling, the targets of
``loadtest.bench.gpu_goals``, where the time goes), the JPEG profile, the sweep and the errors."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from loadtest.bench.gateway_split import gateway_table
from loadtest.bench.gpu_goals import CEILING_CONFIGS
from loadtest.bench.report import config_table, machine_line
from loadtest.bench.settings import Result, result_row
from loadtest.bench.triton_split import OUTSIDE_COLUMNS, outside_cells

__all__ = ["print_gpu_report", "result_row"]


def _tables(rows: list[Result], document: dict[str, Any]) -> list[Any]:
    from rich.table import Table

    machine = document["machine"]
    served = config_table(
        (
            "config",
            "concurrency",
            "images/s",
            "P50 ms",
            "P95 ms",
            "P99 ms",
            "slowest 1% in 100 ms",
            "errors",
            "client capacity/s",
            "capacity used",
        ),
        title=f"GPU benchmark: {machine_line(machine)}",
    )
    for r in rows:
        if r.config.startswith("raw"):
            continue
        served.add_row(
            r.config,
            str(r.concurrency) if r.concurrency else f"batch {r.batch}",  # in-process: no clients
            f"{r.throughput:,.0f}",
            f"{r.p50_ms:.1f}",
            f"{r.p95_ms:.1f}",
            f"{r.p99_ms:.1f}",
            "-" if r.tail_burst is None else f"{r.tail_burst:.0%}",
            str(r.errors),
            "-" if r.capacity is None else f"{r.capacity:,.0f}",
            "-" if r.capacity_used is None else f"{r.capacity_used:.0%}",
        )
    raw = Table(title="In-process ceiling (images/s; batch already on the GPU)")
    modes = sorted(
        {r.config for r in rows if r.config.startswith("raw")},
        key=lambda c: (c not in CEILING_CONFIGS, c),
    )
    raw.add_column("batch", justify="right")
    for mode in modes:
        raw.add_column(mode.removeprefix("raw "), justify="right")
    for batch in sorted({r.batch for r in rows if r.config.startswith("raw")}):
        cells = []
        for mode in modes:
            found = next((r for r in rows if r.config == mode and r.batch == batch), None)
            cells.append("-" if found is None else f"{found.throughput:,.0f}")
        raw.add_row(str(batch), *cells)
    goals = Table(title="Targets (issue 16), this run")
    for column in ("target", "goal", "figure", "met"):
        goals.add_column(column)
    for name, target in document["targets"].items():
        figure = target["figure"]
        text = (
            "-"
            if figure is None
            else ", ".join(
                f"{k} {v:,.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in figure.items()
            )
        )
        goals.add_row(
            name, target["goal"], text, {True: "yes", False: "NO", None: "-"}[target["met"]]
        )
    tables = [served, raw, goals] if modes else [served, goals]
    if document.get("triton_split"):
        tables.append(_split_table(document["triton_split"]))
        if any(row.get("steps_ms") for row in document["triton_split"]):
            tables.append(_steps_table(document["triton_split"]))
        if any(row.get("gateway") for row in document["triton_split"]):
            tables.append(gateway_table(document["triton_split"]))
        if any(row.get("cpu") for row in document["triton_split"]):
            tables.append(
                _cpu_table(
                    document["triton_split"],
                    int(machine.get("usable_cpus") or machine.get("logical_cpus") or 0),
                )
            )
    return tables


def _cpu_table(rows: list[dict[str, Any]], cpus: int) -> Any:
    """Each point's busy cores per process group (and CPU ms per request), beside the host's."""
    # The groups that did something (an idle model's stubs would only widen the table).
    groups = sorted(
        {
            g
            for row in rows
            for g, used in row.get("cpu", {}).items()
            if g != "host" and used["cores"] >= 0.05
        }
    )
    table = config_table(
        ("config", "concurrency", "host", *groups),
        title="Who used the CPUs: cores busy over each point (CPU ms per request; the busiest "
        f"process's cores); the host has {cpus or '?'} cores",
    )
    for row in rows:
        cpu = row.get("cpu", {})
        if not cpu:
            continue
        cells = [
            f"{cpu[g]['cores']:.1f} ({cpu[g]['cpu_ms_per_request']:.2f}; "
            f"{cpu[g].get('busiest_process_cores', 0.0):.1f})"
            if g in cpu
            else "-"
            for g in groups
        ]
        table.add_row(row["config"], str(row["concurrency"]), f"{cpu['host']['cores']:.1f}", *cells)
    return table


def _split_table(rows: list[dict[str, Any]]) -> Any:
    """Each Triton point's mean request time: outside Triton (client, HTTP, gateway) and in its stages."""
    table = config_table(
        (*OUTSIDE_COLUMNS, "queue", "input", "infer (stub)", "output", "images per execution"),
        title="Where the time goes (means per request, ms; Triton's statistics over each point)",
    )
    for row in rows:
        table.add_row(
            *outside_cells(row),
            f"{row['queue_ms']:.2f}",
            f"{row['compute_input_ms']:.2f}",
            f"{row['compute_infer_ms']:.2f}",
            f"{row['compute_output_ms']:.2f}",
            f"{row['inferences_per_execution']:.1f}",
        )
    return table


def _steps_table(rows: list[dict[str, Any]]) -> Any:
    """Inside the stub's execute(): the model's own steps (``serving/step_metrics.py``), per execution."""
    steps = list(dict.fromkeys(step for row in rows for step in row.get("steps_ms", {})))
    # Triton counts an execution's whole duration against each of its requests, so 'infer (stub)' is
    # already an execution's time (weighted by requests); what the steps leave of it is the stub's IPC.
    table = config_table(
        ("config", "concurrency", "infer (stub)", *steps, "steps together"),
        title="Inside execute() (means per execution, ms; the model's step metrics beside Triton's "
        "'infer (stub)')",
    )
    for row in rows:
        found = row.get("steps_ms", {})
        if not found:
            continue
        table.add_row(
            row["config"],
            str(row["concurrency"]),
            f"{row['compute_infer_ms']:.2f}",
            *(f"{found[s]:.2f}" if s in found else "-" for s in steps),
            f"{sum(found.values()):.2f}",
        )
    return table


def print_gpu_report(rows: list[Result], document: dict[str, Any], path: Path) -> None:
    """Print the tables (and the profile, the sweep, the errors) and save the same text to ``path``."""
    from rich.console import Console

    buffer = io.StringIO()
    for console in (Console(width=170), Console(file=buffer, width=170)):
        for table in _tables(rows, document):
            console.print(table)
        for profile in document.get("jpeg_profile", []):
            steps = ", ".join(f"{k} {v:.2f}" for k, v in profile["ms_per_batch"].items())
            pipelined = (
                (
                    f"; pipelined in chunks of {profile['chunk']}: "
                    f"{profile['pipelined_ms_per_batch']:.2f} ms, "
                    f"{profile['pipelined_images_per_s']:,.0f} images/s"
                )
                if "pipelined_ms_per_batch" in profile
                else ""
            )
            console.print(
                f"JPEG pipeline in process ({profile.get('classifier', 'TorchScript')} classifier), "
                f"batch {profile['batch']} (ms per batch): {steps}; "
                f"{profile['serial_images_per_s']:,.0f} images/s serial{pipelined}"
            )
        for choice in document.get("sweep", []):
            if "error" in choice:
                console.print(f"[red]sweep {choice['entry']}: {choice['error']}[/red]")
                continue
            console.print(
                f"sweep {choice['entry']} at concurrency {choice['concurrency']}: chosen {choice['chosen']} "
                f"from {len(choice['candidates'])} candidates ({choice['rule']})"
            )
            for row in choice["candidates"]:
                figures = (
                    f"{row['throughput']:,.0f}/s, P99 {row['p99_ms']:.1f} ms, errors {row['errors']}"
                    if row.get("measured", True)
                    else f"not measured ({row.get('reason', '')})"
                )
                policies = (
                    ""
                    if row.get("queue_policies", True)
                    else ", NO queue policies (measured, never chosen)"
                )
                console.print(
                    f"    {row['instances']} instance(s), delay {row['max_queue_delay_us']} us, preferred "
                    f"{row['preferred_batch_sizes']}{policies}: {figures}"
                )
        if "compiled_error" in document.get("build", {}):
            console.print(
                "[red]the compiled flavour's build failed: "
                f"{document['build']['compiled_error'][:500]}[/red]",
                soft_wrap=True,
            )
        console.print(f"sanity: {document.get('sanity')}", soft_wrap=True)
        for r in rows:
            if r.error_messages:
                console.print(
                    f"[red]{r.config} at concurrency {r.concurrency}: {r.error_messages}[/red]",
                    soft_wrap=True,
                )
    path.write_text(buffer.getvalue(), encoding="utf-8")
