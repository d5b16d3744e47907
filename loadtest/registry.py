"""Every benchmark by name: the one table behind ``inferctl bench NAME`` and ``python -m loadtest.X``.

A benchmark is a module with two functions, :func:`build_parser` (its options) and :func:`run` (the
parsed options in, an exit status out: 0 when every request of the run succeeded, 1 when some
failed, as each benchmark's help says). The table below names each one with a line of what it
measures; the module is imported only when its benchmark runs, so ``inferctl --help`` imports
neither torch nor the load generator. A module's ``if __name__ == "__main__"`` block goes through
:func:`run_named` too, so ``python -m loadtest.qos`` and ``inferctl bench qos`` are one path (the
GPU host's scripts use ``python -m``: they run from a checkout without ``inferctl`` installed).

Not here, because they are processes a benchmark starts rather than benchmarks:
:mod:`loadtest.naive_server` (the FastAPI + PyTorch baseline server),
:mod:`loadtest._profiled_gateway` (the gateway under cProfile) and :mod:`loadtest.proxy_floor` (the
servers under the gateway's CPU figure). They keep their own ``main``.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, cast

__all__ = [
    "BENCHMARKS",
    "Benchmark",
    "BenchmarkModule",
    "UsageError",
    "find",
    "names",
    "run_named",
]


class UsageError(Exception):
    """Options that parse but do not fit together, found by a benchmark's ``run``: reported as argparse
    reports a bad option (the usage line, ``PROG: error: MESSAGE``, exit status 2)."""


class BenchmarkModule(Protocol):
    """What a benchmark module provides."""

    def build_parser(self) -> argparse.ArgumentParser: ...

    def run(self, args: argparse.Namespace) -> int: ...


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: its name on the command line, what it measures, where its code lives.

    ``forwards``: the benchmark hands the options it does not know to another benchmark (the GPU
    host's one-step wrappers); they arrive in ``args.forwarded`` instead of being refused.
    """

    name: str
    summary: str
    module: str
    forwards: bool = False

    def load(self) -> BenchmarkModule:
        """Import the benchmark's module (the first time this benchmark is asked for)."""
        return cast(BenchmarkModule, importlib.import_module(self.module))

    def parser(self) -> argparse.ArgumentParser:
        """The benchmark's option parser, its usage line naming ``inferctl bench NAME``."""
        parser = self.load().build_parser()
        parser.prog = f"inferctl bench {self.name}"
        return parser

    def parse(
        self, argv: Sequence[str] | None, parser: argparse.ArgumentParser | None = None
    ) -> argparse.Namespace:
        """``argv`` (default: the process's arguments) as the benchmark's options.

        Raises:
            SystemExit: status 2 on options the benchmark does not accept (argparse's report), 0
                after ``--help``.
        """
        parser = parser or self.parser()
        if not self.forwards:
            return parser.parse_args(argv)
        args, forwarded = parser.parse_known_args(argv)
        args.forwarded = forwarded
        return args


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark(
        "platform",
        "side by side: Triton batching on/off, gateway vs direct, naive FastAPI+PyTorch, raw runtime",
        "loadtest.bench.cli",
    ),
    Benchmark(
        "gateway",
        "the gateway's added P50/P99 over direct Triton",
        "loadtest.bench.gateway_overhead",
    ),
    Benchmark(
        "clients",
        "gateway vs direct Triton over KServe v2 HTTP and gRPC with tritonclient",
        "loadtest.clients_bench",
    ),
    Benchmark(
        "qos",
        "premium P99 and free-tier shedding under overload, tier priorities off and on",
        "loadtest.qos",
    ),
    Benchmark(
        "multimodel",
        "many models under a memory budget: hit rate, cold-load latency, memory",
        "loadtest.multimodel",
    ),
    Benchmark(
        "isolation",
        "a protected key's P99 alone and under each attack from a free-tier key",
        "loadtest.isolation",
    ),
    Benchmark(
        "scaling", "direct Triton vs the gateway with 1 and N worker processes", "loadtest.scaling"
    ),
    Benchmark(
        "parse",
        "the gateway's strict KServe v2 parse and re-encode time per request shape",
        "loadtest.parse_bench",
    ),
    Benchmark(
        "propagation",
        "how long a change through one gateway replica takes to apply on another (Redis)",
        "loadtest.propagation",
    ),
    Benchmark(
        "batcher-wakeup",
        "Triton's dynamic batcher with queue policies: the missed wake-up",
        "loadtest.batcher_wakeup",
    ),
    Benchmark(
        "gateway-profile",
        "where the gateway's CPU goes per request (cProfile of the isolation path)",
        "loadtest.gateway_profile",
    ),
    Benchmark(
        "newcomer",
        "`inferctl up` as a newcomer runs it, and what an operator fears",
        "loadtest.newcomer",
    ),
    Benchmark(
        "embeddings",
        "Triton's text_embedding against sentence-transformers' encode",
        "loadtest.bench.embeddings",
    ),
    Benchmark(
        "diffusion",
        "Stable Diffusion through Triton vs diffusers' pipeline, same device and seeds",
        "loadtest.diffusion_bench",
    ),
    Benchmark(
        "diffusion-inprocess",
        "Stable Diffusion in a fixed time: the served pipeline's code in process vs diffusers",
        "loadtest.diffusion_process",
    ),
    Benchmark(
        "gpu", "every serving path of one GPU host side by side, in one run", "loadtest.bench.gpu"
    ),
    Benchmark(
        "gpu-embeddings",
        "the embeddings benchmark on a GPU host in one budgeted step (other options go to embeddings)",
        "loadtest.bench.gpu_embeddings",
        forwards=True,
    ),
    Benchmark(
        "gpu-diffusion",
        "the diffusion benchmark on a GPU host in one step (other options go to diffusion)",
        "loadtest.bench.gpu_diffusion",
        forwards=True,
    ),
    Benchmark(
        "inprocess-jpeg",
        "the JPEG pipeline in one process, no server: serial, pipelined, overlapped",
        "loadtest.bench.inprocess_jpeg",
    ),
    Benchmark(
        "locust",
        "headless locust runs of the scenarios, with CSV and HTML reports",
        "loadtest.run",
    ),
)


def names() -> list[str]:
    """The registered names, in the table's order."""
    return [b.name for b in BENCHMARKS]


def find(name: str) -> Benchmark:
    """The benchmark called ``name``.

    Raises:
        KeyError: no benchmark has that name (the message lists those that exist).
    """
    for benchmark in BENCHMARKS:
        if benchmark.name == name:
            return benchmark
    raise KeyError(f"no benchmark {name!r}; known: {', '.join(names())}")


def run_named(name: str, argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: the process's arguments) with benchmark ``name``'s options and run it.

    Returns:
        The benchmark's exit status.

    Raises:
        KeyError: no benchmark has that name.
        SystemExit: status 2 on bad options (``UsageError`` from ``run`` included), 0 after ``--help``.
    """
    benchmark = find(name)
    module = benchmark.load()
    parser = benchmark.parser()
    args = benchmark.parse(argv, parser)
    try:
        return int(module.run(args) or 0)
    except UsageError as exc:
        parser.error(str(exc))
