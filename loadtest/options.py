"""Options several benchmarks share, declared once so that they read the same in every ``--help``."""

from __future__ import annotations

import argparse

__all__ = ["add_run_time_arguments"]


def add_run_time_arguments(
    parser: argparse.ArgumentParser, *, duration_s: float, warmup_s: float, per: str
) -> None:
    """``--duration`` and ``--warmup``: measured and warm-up seconds of each ``per`` (a run, a phase)."""
    parser.add_argument(
        "--duration", type=float, default=duration_s, help=f"seconds measured per {per}"
    )
    parser.add_argument(
        "--warmup", type=float, default=warmup_s, help=f"seconds of warm-up per {per}"
    )
