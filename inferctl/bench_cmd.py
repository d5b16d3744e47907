"""``inferctl bench NAME [options]``: every benchmark of :mod:`loadtest.registry`, by name.

The benchmark's module is imported only when it runs: listing them (``inferctl bench --help``)
imports none, and ``inferctl bench NAME --help`` shows that benchmark's own options.
"""

from __future__ import annotations

import argparse

from inferctl.command import Command
from loadtest.registry import BENCHMARKS, names, run_named

__all__ = ["COMMAND", "run"]


def _listing() -> str:
    width = max(len(b.name) for b in BENCHMARKS)
    return "benchmarks:\n" + "\n".join(f"  {b.name:<{width}}  {b.summary}" for b in BENCHMARKS)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("which", choices=names(), metavar="NAME", help="the benchmark to run")
    parser.add_argument("options", nargs=argparse.REMAINDER, help="the benchmark's own options")


def run(args: argparse.Namespace) -> int:
    return run_named(args.which, args.options)


COMMAND = Command(
    name="bench",
    help="the benchmarks, by name: each prints a table and writes its JSON and plot",
    description="Run one benchmark. Options after the name go to that benchmark: "
    "`inferctl bench NAME --help` lists them. Each prints its table and writes its files; "
    "the exit status is 1 when any of its requests failed.",
    add_arguments=_add_arguments,
    run=run,
    epilog=_listing,
)
