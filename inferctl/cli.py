"""The ``inferctl`` command line: one entry point, one subcommand per job.

    inferctl build [MODEL ...]    export, verify and publish models into the repository
    inferctl up                   build what is missing, start Triton and the gateway
    inferctl bench ...            the side-by-side benchmarks
    inferctl promote / history    gated model promotion and its records

Each subcommand lives in its own module and registers its arguments here.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from inferctl import bench_cmd, build_cmd, promote_cmd, up_cmd

__all__ = ["build_parser", "main"]

_COMMANDS = [build_cmd, up_cmd, promote_cmd, bench_cmd]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inferctl",
        description="Build PyTorch models into a Triton repository and serve them behind the gateway.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _COMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args) or 0)
