"""Options several benchmarks share, declared once so that they read the same in every ``--help``;
and the settings a run used, as every benchmark's JSON document records them."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "FieldOption",
    "add_alternating_round_options",
    "add_field_options",
    "add_run_time_arguments",
    "field_values",
    "given_options",
    "run_time_values",
    "settings_from_options",
    "settings_record",
]

#: ``(flag, type, help)``: an option ``--some-field`` that sets the settings field ``some_field``
FieldOption = tuple[str, Callable[[str], Any], str]

_Settings = TypeVar("_Settings", bound="DataclassInstance")


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


def add_alternating_round_options(
    parser: argparse.ArgumentParser,
    *,
    concurrency: list[int],
    duration_s: float,
    measured: str,
    rounds: int,
) -> None:
    """``--concurrency`` (one or more), ``--duration-s`` and ``--rounds`` of a benchmark that
    measures its paths in alternating rounds; each ``--duration-s`` is measured per ``measured``."""
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=concurrency, help="(default: %(default)s)"
    )
    parser.add_argument(
        "--duration-s",
        type=float,
        default=duration_s,
        help=f"measured seconds per {measured} (default: %(default)s)",
    )
    parser.add_argument(
        "--rounds", type=int, default=rounds, help="alternating rounds (default: %(default)s)"
    )


def run_time_values(args: argparse.Namespace) -> dict[str, Any]:
    """The settings' ``duration_s`` and ``warmup_s`` from ``--duration`` and ``--warmup``."""
    return {"duration_s": args.duration, "warmup_s": args.warmup}


def _field(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")  # argparse's own dest for the flag


def add_field_options(
    parser: argparse.ArgumentParser, defaults: object, options: Sequence[FieldOption]
) -> None:
    """Each option of ``options``, its default the field of the same name in ``defaults``."""
    for flag, kind, text in options:
        parser.add_argument(flag, type=kind, default=getattr(defaults, _field(flag)), help=text)


def field_values(args: argparse.Namespace, options: Sequence[FieldOption]) -> dict[str, Any]:
    """The settings fields ``options`` set, from the parsed ``args``."""
    return {_field(flag): getattr(args, _field(flag)) for flag, _, _ in options}


def settings_from_options(
    defaults: _Settings,
    args: argparse.Namespace,
    options: Sequence[FieldOption],
    **values: Any,
) -> _Settings:
    """``defaults`` with the fields ``options`` set, ``--duration`` and ``--warmup``, and ``values``
    (the options that are no settings field of the same name)."""
    return replace(defaults, **field_values(args, options), **run_time_values(args), **values)


def given_options(**values: Any) -> dict[str, Any]:
    """The options the command line gave (not ``None``), to override a settings class's defaults."""
    return {key: value for key, value in values.items() if value is not None}


def settings_record(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (a run's settings or options) for its JSON document: paths as text, the rest as is."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in values.items()}
