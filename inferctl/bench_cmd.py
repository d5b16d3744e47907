"""``inferctl bench``: the benchmarks, each a command that prints a table (and saves a plot)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "bench",
        help="side-by-side benchmarks (platform vs baselines, gateway overhead)",
        description="`inferctl bench platform ...` runs loadtest.bench (batching on/off, gateway vs direct, "
        "naive FastAPI+PyTorch, raw onnxruntime); `inferctl bench gateway ...` runs gateway.bench (the "
        "gateway's added latency). Options after the name go to that benchmark; see "
        "`inferctl bench platform --help`.",
    )
    parser.add_argument("which", choices=["platform", "gateway"])
    parser.add_argument("options", nargs=argparse.REMAINDER, help="the benchmark's own options")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.which == "platform":
        from loadtest.bench import main
    else:
        from gateway.bench import main
    return int(main(args.options) or 0)
