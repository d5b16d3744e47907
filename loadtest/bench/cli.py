"""``python -m loadtest.bench`` / ``inferctl bench platform``: options in, table and files out."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from loadtest.bench.settings import ALL_CONFIGS, DEFAULT_MODEL, DEFAULT_OUT, BenchSettings
from loadtest.bench.side_by_side import run_bench
from loadtest.loadgen.shm import KINDS
from loadtest.options import given_options

__all__ = ["build_parser", "run", "settings_from_args"]


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v.strip())


def _configs(text: str) -> tuple[str, ...]:
    configs = tuple(c.strip() for c in text.split(",") if c.strip())
    unknown = [c for c in configs if c not in ALL_CONFIGS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown configuration(s) {', '.join(unknown)}; known: {', '.join(ALL_CONFIGS)}"
        )
    return configs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Side-by-side benchmark: Triton batching on/off, gateway vs direct, platform vs a naive "
        "FastAPI+PyTorch server, and the raw runtime limit, each point beside the load generator's own "
        "capacity; prints a table, writes bench.json and bench.png. Exits 1 when any request failed.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a few seconds per configuration (smoke test)"
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--concurrency", type=_ints, help="comma separated, default 1,8,32")
    parser.add_argument("--duration", type=float, help="measured seconds per point (default 10)")
    parser.add_argument(
        "--warmup", type=float, help="unmeasured seconds before each point (default 2)"
    )
    parser.add_argument(
        "--raw-batches", type=_ints, help="batch sizes for the raw runtime (default 1,2,4,8,16,32)"
    )
    parser.add_argument(
        "--configs", type=_configs, help=f"comma separated subset of {','.join(ALL_CONFIGS)}"
    )
    parser.add_argument(
        "--repository", type=Path, help="model repository holding the entry (built if missing)"
    )
    parser.add_argument("--clients", type=int, help="load-generator processes (default 1)")
    parser.add_argument(
        "--protocol",
        choices=["http", "grpc"],
        default="http",
        help="how the Triton configurations are called (default http, binary tensors)",
    )
    parser.add_argument(
        "--shared-memory",
        choices=sorted(KINDS),
        help="put the Triton configurations' tensors in shared memory",
    )
    parser.add_argument(
        "--naive-threads",
        type=int,
        help="the naive server's torch intra-op threads (default: PyTorch's, one per physical core)",
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="folder for bench.json and bench.png"
    )
    return parser


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    overrides: dict[str, Any] = {
        "device": args.device,
        "model": args.model,
        "out_dir": args.out,
        "protocol": args.protocol,
        "shared_memory": args.shared_memory,
    }
    overrides.update(
        given_options(
            concurrency=args.concurrency,
            duration_s=args.duration,
            warmup_s=args.warmup,
            raw_batches=args.raw_batches,
            repository=args.repository,
            clients=args.clients,
            configs=args.configs,
            naive_threads=args.naive_threads,
        )
    )
    return BenchSettings.quick_settings(**overrides) if args.quick else BenchSettings(**overrides)


def run(args: argparse.Namespace) -> int:
    """``inferctl bench platform``: the parsed options in, the exit status out."""
    settings = settings_from_args(args)
    document = run_bench(settings)
    print(f"wrote {document['files']['json']} and {document['files']['png']}")
    failed = [r for r in document["results"] if r["errors"]]
    for row in failed:
        print(
            f"FAILED requests: {row['config']} at concurrency {row['concurrency']}: {row['error_messages']}"
        )
    return 1 if failed else 0
