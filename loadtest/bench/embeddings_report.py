"""What ``loadtest.bench.embeddings`` measured: one :class:`Row` per configuration, as the table
(texts/s against sentence-transformers, percentiles, parity, the encoder's batching), ``embeddings.txt``,
``embeddings.json`` and ``embeddings.png``; and the same drawn again from a saved ``embeddings.json``.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from loadtest.bench.plot import save_bar_plot
from serving.console import Table, print_table

__all__ = ["Row", "describe_machine", "report_saved", "write_report"]


@dataclass(frozen=True)
class Row:
    """One configuration over every round."""

    config: str
    texts_per_s: float
    p50_ms: float
    p99_ms: float
    requests: int
    errors: int
    min_cosine: float | None  # vs sentence-transformers' encode, every text
    inferences_per_execution: float | None  # the encoder's, from Triton's statistics


def describe_machine(args: argparse.Namespace, loads: list[float]) -> str:
    """The machine as the table's caption says it: CPUs, GPU where CUDA ran, threads, load average."""
    parts = [f"{os.cpu_count()} CPUs"]
    if "cuda" in (args.device, *args.st_device):
        import torch

        parts.append(
            f"GPU {torch.cuda.get_device_name(0)}"
            if torch.cuda.is_available()
            else "no CUDA device"
        )
    parts.append(f"intra-op threads {args.threads or 'runtime default'}")
    parts.append(
        f"1-minute load average {min(loads):.1f}-{max(loads):.1f} during the run (this benchmark's own "
        "processes included)"
    )
    if args.machine_note:
        parts.append(args.machine_note)
    return "; ".join(parts)


def write_report(
    args: argparse.Namespace, rows: list[Row], loads: list[float], duration: float, machine: str
) -> None:
    """Print the table; write ``embeddings.txt``, ``embeddings.json`` and ``embeddings.png`` to
    ``args.out``."""
    baseline = next(
        (r.texts_per_s for r in rows if r.config.startswith("sentence-transformers")), 0.0
    )
    encoder = f"{args.encoder} encoder on {args.device if args.encoder == 'torchscript' else 'cpu'}"
    table = Table(
        f"Embeddings ({encoder}), one text per request, concurrency {args.concurrency}, {args.rounds} "
        f"alternating rounds of {args.warmup:g}+{duration:g} s",
        (
            "configuration",
            "texts/s",
            "vs ST",
            "P50 ms",
            "P99 ms",
            "requests",
            "errors",
            "min cosine vs ST",
            "encoder inferences/execution",
        ),
    )
    for r in rows:
        table.add_row(
            r.config,
            f"{r.texts_per_s:.1f}",
            f"{r.texts_per_s / baseline:.2f}x" if baseline else "-",
            f"{r.p50_ms:.1f}",
            f"{r.p99_ms:.1f}",
            str(r.requests),
            str(r.errors),
            f"{r.min_cosine:.6f}" if r.min_cosine is not None else "-",
            f"{r.inferences_per_execution:.2f}" if r.inferences_per_execution else "-",
        )
    table.caption = machine
    print_table(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "embeddings.txt").write_text(table.plain() + "\n")
    settings = {k: v for k, v in vars(args).items() if k not in ("func", "deadline")}
    (out / "embeddings.json").write_text(
        json.dumps(
            {
                "settings": {**settings, "measured_s_per_round": duration},
                "machine": table.caption,
                "load_average": loads,
                "rows": [asdict(r) for r in rows],
            },
            indent=2,
        )
        + "\n"
    )
    save_bar_plot(out / "embeddings.png", table.title, rows)


def report_saved(saved_json: Path, out: str) -> None:
    """Draw the table and plot of a saved ``embeddings.json`` again, into ``out``."""
    saved = json.loads(saved_json.read_text())
    settings = argparse.Namespace(**{**saved["settings"], "out": out})
    write_report(
        settings,
        [Row(**r) for r in saved["rows"]],
        saved["load_average"],
        saved["settings"]["measured_s_per_round"],
        saved["machine"],
    )
