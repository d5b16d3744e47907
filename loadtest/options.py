"""Options several benchmarks share, declared once so that they read the same in every ``--help``;
and the settings a run used, as every benchmark's JSON document records them."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["add_run_time_arguments", "given_options", "settings_record"]


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


def given_options(**values: Any) -> dict[str, Any]:
    """The options the command line gave (not ``None``), to override a settings class's defaults."""
    return {key: value for key, value in values.items() if value is not None}


def settings_record(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (a run's settings or options) for its JSON document: paths as text, the rest as is."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in values.items()}
