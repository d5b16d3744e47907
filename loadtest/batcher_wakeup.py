"""Triton's dynamic batcher with queue policies: the missed wake-up, measured on a real model.

``python -m loadtest.batcher_wakeup --repository DIR --model NAME`` copies one built entry (default
``efficientnet_lite0`` of ``model_repository``, as ``inferctl up`` builds it) into a scratch
repository once per configuration, serves them all from the real Triton binary and drives each with
closed loops of the platform's load generator at each ``--concurrency`` (batch-1 requests of zeros):

- ``queues, 1 instance, spinning``: the builders' priority levels and bounded queues with one
  instance whose onnxruntime pool spins when idle (onnxruntime's default). Queue policies turn off
  the batcher's payload prefetching, and then it can miss the wake-up of the instance that just
  finished (``dynamic_batch_scheduler.cc``, ``WaitForPayloadSlotAvailable``: the instance notifies
  before it counts as waiting again); a queued request then waits for the next arrival or the
  batcher's 500 ms default wait. Spinning threads starve the finishing instance's thread, so the
  race is lost often.
- ``queues, 1 instance``: the same, the pool sleeping when idle (the onnxruntime backend's default).
- ``queues, 2 instances``: what the builders write (``serving.limits.QueueLimits.default_instances``):
  while one instance runs the other is waiting, so a stall lasts at most one execution.
- ``no queues, 1 instance, spinning``: dynamic batching without priority levels or queue policies
  (prefetching on, no stall; also no tiers, no deadlines and no bounded queue).

It prints a table (throughput, P50, P99, max per configuration and concurrency) and writes
``batcher_wakeup.json`` and ``batcher_wakeup.png`` to ``--out``. Figures are measured, never
asserted: compare the rows of one run. ``allow_spinning`` is a parameter of the platform's
onnxruntime backend (the embedded server's); the NGC container's native backend ignores it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import triton_to_np_dtype

from builders.triton_config import read_config, write_config
from loadtest.bench.report import machine_description, machine_line
from loadtest.bench.settings import point_spec
from loadtest.loadgen import LoadResult, TritonTarget, run_load
from loadtest.options import run_time_values, settings_record
from loadtest.plotting import saved_figure
from loadtest.registry import UsageError
from serving.console import Table, make_console, number_cell, print_table
from serving.launcher import TritonPorts, TritonServer

__all__ = [
    "CONFIGS",
    "Configuration",
    "WakeupSettings",
    "build_parser",
    "prepare_repository",
    "run",
    "run_wakeup",
]


@dataclass(frozen=True)
class Configuration:
    """How one copy of the entry is configured."""

    suffix: str
    queues: bool
    instances: int
    spinning: bool


CONFIGS: dict[str, Configuration] = {
    "queues, 1 instance, spinning": Configuration("queues_x1_spin", True, 1, True),
    "queues, 1 instance": Configuration("queues_x1", True, 1, False),
    "queues, 2 instances": Configuration("queues_x2", True, 2, False),
    "no queues, 1 instance, spinning": Configuration("plain_x1_spin", False, 1, True),
}


@dataclass(frozen=True, kw_only=True)
class WakeupSettings:
    """What the benchmark runs: per configuration and concurrency, ``warmup_s`` then ``duration_s``."""

    repository: Path = Path("model_repository")
    model: str = "efficientnet_lite0"
    concurrencies: tuple[int, ...] = (1, 2, 4, 8)
    warmup_s: float = 1.0
    duration_s: float = 5.0
    out_dir: Path = Path("batcher-wakeup-results")
    configs: tuple[str, ...] = field(default_factory=lambda: tuple(CONFIGS))


def configure(base: mc.ModelConfig, name: str, setup: Configuration) -> mc.ModelConfig:
    """``base`` (a built entry's config) renamed and set up as ``setup`` says."""
    config = mc.ModelConfig()
    config.CopyFrom(base)
    config.name = name
    if not setup.queues:
        for field_name in (
            "priority_levels",
            "default_priority_level",
            "priority_queue_policy",
            "default_queue_policy",
        ):
            config.dynamic_batching.ClearField(field_name)
    for group in config.instance_group:
        group.count = (
            setup.instances
        )  # the first configurations exist to go below the builders' minimum
    config.parameters["allow_spinning"].string_value = "1" if setup.spinning else "0"
    return config


def prepare_repository(root: Path, settings: WakeupSettings) -> dict[str, str]:
    """One copy of the entry per configuration under ``root``; returns {label: model name}."""
    source = settings.repository / settings.model
    base = read_config(source / "config.pbtxt")
    names = {}
    for label in settings.configs:
        setup = CONFIGS[label]
        name = f"{settings.model}_{setup.suffix}"
        shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("config.pbtxt"))
        write_config(configure(base, name, setup), root / name / "config.pbtxt")
        names[label] = name
    return names


def zeros_request(config: mc.ModelConfig) -> dict[str, np.ndarray]:
    """One batch-1 request of zeros for every input (batch axis added where the model batches)."""
    batch = (1,) if config.max_batch_size > 0 else ()
    dtype = {value: key for key, value in mc.DataType.items()}
    return {
        t.name: np.zeros(
            batch + tuple(max(1, d) for d in t.dims),
            dtype=triton_to_np_dtype(dtype[t.data_type].removeprefix("TYPE_")),
        )
        for t in config.input
    }


@dataclass(frozen=True)
class Row:
    config: str
    concurrency: int
    throughput: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    requests: int
    errors: int


def _row(label: str, result: LoadResult) -> Row:
    return Row(
        label,
        result.concurrency,
        result.throughput,
        result.p50_ms,
        result.p99_ms,
        result.max_ms,
        result.requests,
        result.errors,
    )


def run_wakeup(settings: WakeupSettings) -> dict[str, Any]:
    """Run the benchmark; returns the JSON document it also writes."""
    console = make_console(stderr=True)
    settings.out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    request = zeros_request(read_config(settings.repository / settings.model / "config.pbtxt"))
    with tempfile.TemporaryDirectory(prefix="wakeup-") as tmp:
        names = prepare_repository(Path(tmp), settings)
        console.print(f"starting Triton: {settings.model} in {len(names)} configurations")
        with TritonServer(
            Path(tmp), models=list(names.values()), ports=TritonPorts.free()
        ) as triton:
            for concurrency in settings.concurrencies:
                for label, name in names.items():
                    target = TritonTarget(
                        url=triton.http_url, model=name, inputs=(request,), name=label
                    )
                    spec = point_spec(target, concurrency, settings, label)
                    rows.append(_row(label, run_load(spec)))
                    last = rows[-1]
                    console.print(
                        f"c={concurrency:<3} {label:32s} {last.throughput:8.1f}/s  P50 {last.p50_ms:7.1f} ms"
                        f"  P99 {last.p99_ms:7.1f} ms  max {last.max_ms:7.1f} ms"
                    )
    document: dict[str, Any] = {
        "settings": settings_record(asdict(settings)),
        "machine": machine_description(),
        "rows": [asdict(r) for r in rows],
    }
    table = report_table(rows, settings)
    print_table(table)
    document["table"] = table.as_records()
    json_path = settings.out_dir / "batcher_wakeup.json"
    json_path.write_text(json.dumps(document, indent=2))
    document["files"] = {
        "json": str(json_path),
        "png": str(save_plot(rows, settings, settings.out_dir / "batcher_wakeup.png")),
    }
    return document


def report_table(rows: Sequence[Row], settings: WakeupSettings) -> Table:
    table = Table(
        title="Triton's dynamic batcher, queue policies and instances: "
        f"{machine_line(machine_description())}",
        columns=["configuration", "concurrency", "req/s", "P50 ms", "P99 ms", "max ms", "errors"],
        caption=f"{settings.model}, batch-1 requests; {settings.warmup_s:g} s warm-up, "
        f"{settings.duration_s:g} s measured per row; closed loops straight to Triton (HTTP)",
    )
    for r in rows:
        table.add_row(
            r.config,
            r.concurrency,
            f"{r.throughput:.1f}",
            number_cell(r.p50_ms, ".1f"),
            number_cell(r.p99_ms, ".1f"),
            number_cell(r.max_ms, ".1f"),
            r.errors,
        )
    return table


def save_plot(rows: Sequence[Row], settings: WakeupSettings, path: Path) -> Path:
    """P99 (solid), P50 (dashed) and the slowest request (x) against concurrency, one colour per
    configuration; log scale."""
    with saved_figure(path, figsize=(9, 5), dpi=120) as (fig, ax):
        for label in settings.configs:
            mine = sorted((r for r in rows if r.config == label), key=lambda r: r.concurrency)
            xs = [r.concurrency for r in mine]
            (line,) = ax.plot(xs, [r.p99_ms for r in mine], "-o", label=f"{label} P99")
            colour = line.get_color()
            ax.plot(
                xs, [r.p50_ms for r in mine], "--", color=colour, alpha=0.6, label=f"{label} P50"
            )
            ax.plot(
                xs, [r.max_ms for r in mine], "x", color=colour, markersize=9, label=f"{label} max"
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(settings.concurrencies), [str(c) for c in settings.concurrencies])
        ax.set_yscale("log")
        ax.set_xlabel("concurrency (closed loops)")
        ax.set_ylabel("latency (ms)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        ax.set_title(
            f"Triton dynamic batcher, {settings.model}: queue policies, instances, spinning"
        )
    return path


def build_parser() -> argparse.ArgumentParser:
    d = WakeupSettings()
    parser = argparse.ArgumentParser(
        description="Latency of one built model behind Triton's dynamic batcher with the builders' "
        "queue policies (one instance spinning or not, two instances) and without them, side by "
        "side (real Triton, the platform's load generator). Prints a table, writes "
        "batcher_wakeup.json and batcher_wakeup.png.",
    )
    parser.add_argument(
        "--repository", type=Path, default=d.repository, help="a built model repository"
    )
    parser.add_argument(
        "--model", default=d.model, help="the entry to copy (any model with a dynamic batcher)"
    )
    parser.add_argument(
        "--concurrency",
        default=",".join(map(str, d.concurrencies)),
        help="comma-separated closed-loop concurrencies",
    )
    parser.add_argument(
        "--warmup", type=float, default=d.warmup_s, help="seconds of warm-up per row"
    )
    parser.add_argument(
        "--duration", type=float, default=d.duration_s, help="seconds measured per row"
    )
    parser.add_argument(
        "--out", type=Path, default=d.out_dir, help="where the JSON and the plot go"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """``inferctl bench batcher-wakeup``: the parsed options in, the exit status out."""
    try:
        concurrencies = tuple(int(v) for v in args.concurrency.split(",") if v.strip())
    except ValueError as exc:
        raise UsageError(
            f"--concurrency: expected comma-separated integers, got {args.concurrency!r}"
        ) from exc
    if not concurrencies or min(concurrencies) < 1:
        raise UsageError("--concurrency: at least one value, each at least 1")
    if not (args.repository / args.model / "config.pbtxt").exists():
        raise UsageError(
            f"no entry {args.model} in {args.repository}: build it first (inferctl build)"
        )
    run_wakeup(
        WakeupSettings(
            repository=args.repository,
            model=args.model,
            concurrencies=concurrencies,
            **run_time_values(args),
            out_dir=args.out,
        )
    )
    return 0


if __name__ == "__main__":
    from loadtest.registry import run_named

    raise SystemExit(run_named("batcher-wakeup"))
