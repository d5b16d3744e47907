"""The benchmark's report: the machine it ran on, the goal ratios and the printed tables."""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from loadtest.bench.settings import Result

__all__ = [
    "compute_ratios",
    "config_table",
    "cpu_model",
    "machine_description",
    "machine_line",
    "print_report",
    "result_at",
    "share_figure",
]


def config_table(columns: Iterable[str], **table: Any) -> Any:
    """A rich table (``table``: its title, caption) of ``columns``: the configuration's name reads from
    the left, every figure from the right."""
    from rich.table import Table

    made = Table(**table)
    for column in columns:
        made.add_column(column, justify="left" if column == "config" else "right")
    return made


def cpu_model() -> str | None:
    """The CPU's model name as the kernel reports it; None where it does not (no ``/proc/cpuinfo``)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


def machine_description() -> dict[str, Any]:
    """CPU model, cores, memory, GPU (if any), load average and the versions that matter."""
    info: dict[str, Any] = {"platform": platform.platform(), "python": platform.python_version()}
    if (cpu := cpu_model()) is not None:
        info["cpu"] = cpu
    info["logical_cpus"] = os.cpu_count()
    with contextlib.suppress(AttributeError):
        info["usable_cpus"] = len(os.sched_getaffinity(0))
    with contextlib.suppress(OSError, ValueError):
        kib = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
        info["memory_gib"] = round(kib / 2**20, 1)
    with contextlib.suppress(OSError):
        info["load_average_at_start"] = [round(v, 2) for v in os.getloadavg()]
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["cuda"] = torch.version.cuda
    except ImportError:
        pass
    for package in (
        "onnxruntime",
        "nvidia-pytriton",
        "tritonclient",
        "fastapi",
        "uvicorn",
        "aiohttp",
    ):
        with contextlib.suppress(Exception):
            from importlib import metadata

            info[package] = metadata.version(package)
    return info


def machine_line(machine: dict[str, Any]) -> str:
    cpu = machine.get("cpu", "unknown CPU")
    cores = machine.get("usable_cpus", machine.get("logical_cpus"))
    gpu = f", GPU {machine['gpu']}" if machine.get("gpu") else ", no GPU"
    return f"{cpu}, {cores} usable cores{gpu}"


def _best(results: list[Result], config: str) -> Result | None:
    rows = [r for r in results if r.config == config and r.requests > 0]
    return max(rows, key=lambda r: r.throughput) if rows else None


def result_at(results: list[Result], config: str, concurrency: int) -> Result | None:
    """``config``'s row at ``concurrency`` (``None``: not measured)."""
    return next((r for r in results if r.config == config and r.concurrency == concurrency), None)


def share_figure(row: Result, reference: Result) -> dict[str, Any]:
    """The figure of a goal that judges ``row``'s throughput as a share of ``reference``'s."""
    return {"share": row.throughput / reference.throughput, "images_per_s": row.throughput}


def compute_ratios(results: list[Result], concurrency: Sequence[int]) -> dict[str, Any]:
    """The goal figures: batching on/off, platform/naive (tensors, and JPEG through the gateway),
    gateway/direct and platform/raw."""
    ratios: dict[str, Any] = {"per_concurrency": {}}
    for c in concurrency:
        row: dict[str, Any] = {}
        on, off = (
            result_at(results, "triton-batching", c),
            result_at(results, "triton-no-batching", c),
        )
        gw, naive = result_at(results, "gateway", c), result_at(results, "naive", c)
        if on and off and off.throughput > 0:
            row["batching_throughput_x"] = on.throughput / off.throughput
            row["batching_p99_delta_ms"] = on.p99_ms - off.p99_ms
            row["batching_goal_met"] = (
                row["batching_throughput_x"] >= 4 and row["batching_p99_delta_ms"] <= 3
            )
        jpeg, naive_jpeg = (
            result_at(results, "gateway-jpeg", c),
            result_at(results, "naive-jpeg", c),
        )
        for label, platform_result, reference in (
            ("platform", on, naive),
            ("gateway_platform", gw, naive),
            ("jpeg_gateway", jpeg, naive_jpeg),
        ):
            if platform_result and reference and reference.throughput > 0:
                row[f"{label}_vs_naive_throughput_x"] = (
                    platform_result.throughput / reference.throughput
                )
                row[f"{label}_vs_naive_p99_delta_ms"] = platform_result.p99_ms - reference.p99_ms
                row[f"{label}_vs_naive_goal_met"] = (
                    row[f"{label}_vs_naive_throughput_x"] >= 3
                    and platform_result.p99_ms <= reference.p99_ms
                )
        if gw and on and on.throughput > 0:
            row["gateway_vs_direct_throughput_x"] = gw.throughput / on.throughput
            row["gateway_p99_overhead_ms"] = gw.p99_ms - on.p99_ms
        ratios["per_concurrency"][str(c)] = row
    raw, direct, gw = (
        _best(results, "raw"),
        _best(results, "triton-batching"),
        _best(results, "gateway"),
    )
    if raw and raw.throughput > 0:
        ratios["raw_best_batch"] = raw.batch
        ratios["raw_best_images_per_s"] = raw.throughput
        if direct:
            ratios["efficiency_direct"] = direct.throughput / raw.throughput
            ratios["efficiency_direct_goal_met"] = ratios["efficiency_direct"] >= 0.9
        if gw:
            ratios["efficiency_gateway"] = gw.throughput / raw.throughput
    return ratios


def print_report(
    results: list[Result], ratios: dict[str, Any], machine: dict[str, Any], settings_line: str
) -> None:
    """The results table (each point beside the load generator's capacity), the ratios, the ceiling."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    table = config_table(
        (
            "config",
            "concurrency",
            "batch",
            "throughput/s",
            "P50 ms",
            "P95 ms",
            "P99 ms",
            "errors",
            "error rate",
            "client capacity/s",
            "capacity used",
        ),
        title=f"Side-by-side benchmark: {machine_line(machine)}",
        caption=settings_line,
    )
    for r in results:
        capacity = "-" if r.capacity is None else f"{r.capacity:,.1f}"
        used = "-" if r.capacity_used is None else f"{r.capacity_used:.0%}"
        table.add_row(
            r.config,
            str(r.concurrency) if r.concurrency else "-",
            str(r.batch),
            f"{r.throughput:,.1f}",
            f"{r.p50_ms:.1f}",
            f"{r.p95_ms:.1f}",
            f"{r.p99_ms:.1f}",
            str(r.errors),
            f"{r.error_rate:.2%}",
            capacity,
            used,
        )
    console.print(table)
    for r in results:
        if r.error_messages:
            console.print(
                f"[red]{r.config} at concurrency {r.concurrency}: {r.error_messages}[/red]",
                soft_wrap=True,
            )
    ratio_table = Table(title="Ratios (same machine, same run)")
    for column in (
        "concurrency",
        "batching on/off",
        "P99 on-off ms",
        "platform/naive",
        "P99 platform-naive ms",
        "gateway/direct",
        "gateway P99 overhead ms",
        "JPEG gateway/naive",
        "P99 JPEG gateway-naive ms",
    ):
        ratio_table.add_column(column, justify="right")

    def fmt(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    for c, row in ratios["per_concurrency"].items():
        ratio_table.add_row(
            c,
            fmt(row.get("batching_throughput_x"), ".2f") + "x",
            fmt(row.get("batching_p99_delta_ms"), "+.1f"),
            fmt(row.get("platform_vs_naive_throughput_x"), ".2f") + "x",
            fmt(row.get("platform_vs_naive_p99_delta_ms"), "+.1f"),
            fmt(row.get("gateway_vs_direct_throughput_x"), ".2f") + "x",
            fmt(row.get("gateway_p99_overhead_ms"), "+.1f"),
            fmt(row.get("jpeg_gateway_vs_naive_throughput_x"), ".2f") + "x",
            fmt(row.get("jpeg_gateway_vs_naive_p99_delta_ms"), "+.1f"),
        )
    console.print(ratio_table)
    if "raw_best_images_per_s" in ratios:
        line = (
            f"raw runtime ceiling: {ratios['raw_best_images_per_s']:,.1f} images/s at batch "
            f"{ratios['raw_best_batch']}; efficiency (best platform / raw): direct "
            f"{fmt(ratios.get('efficiency_direct'), '.1%')}"
        )
        if "efficiency_gateway" in ratios:
            line += f", through the gateway {ratios['efficiency_gateway']:.1%}"
        console.print(line)
