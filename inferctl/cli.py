"""The ``inferctl`` command line: one entry point, one subcommand per job.

    inferctl build [MODEL ...]    export, verify and publish models into the repository
    inferctl up                   build what is missing, start Triton and the gateway
    inferctl bench NAME ...       every benchmark, by name (`inferctl bench --help` lists them)
    inferctl promote / history    gated model promotion and its records

Output reads well anywhere: on a terminal, tables and progress bars; in a pipe or a CI log, full-width
plain columns and one log line per step; ``--json`` on the commands that print results.

Each subcommand lives in its own module, described there by an :class:`inferctl.command.Command`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from importlib import metadata

from inferctl import bench_cmd, build_cmd, promote_cmd, up_cmd

__all__ = ["build_parser", "main", "version_line"]

_COMMANDS = [
    build_cmd.COMMAND,
    up_cmd.COMMAND,
    promote_cmd.PROMOTE,
    promote_cmd.HISTORY,
    bench_cmd.COMMAND,
]


def version_line() -> str:
    """``inferctl <version>`` plus the versions that decide what it serves with."""

    def installed(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return (
        f"inferctl {installed('triton-platform')} (nvidia-pytriton {installed('nvidia-pytriton')}, "
        f"tritonclient {installed('tritonclient')})"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inferctl",
        description="Build PyTorch models into a Triton repository and serve them behind the gateway.",
    )
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in _COMMANDS:
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args) or 0)
