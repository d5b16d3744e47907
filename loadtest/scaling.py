"""The gateway scaling benchmark: direct Triton vs the gateway with 1 and N worker processes, with its
transport to Triton over HTTP and over gRPC, for a tiny model and an image model.

    python -m loadtest.scaling --repository .build/test-model-repository   # this machine (CPU)
    loadtest/gpu_bench.sh scaling OUT_DIR                                   # a GPU host

Starts the embedded Triton (explicit model control) with the image model and a tiny model (a Python
model that answers at once: what is left is the cost of the path, written beside links to the
repository's entries in a temporary folder), a redis-server (the shared store
several workers need; every gateway here uses it, as a deployment does), and one gateway per
configuration ({1, N} workers x {http, grpc} to Triton), all at once. Clients always speak KServe v2
HTTP with binary tensors (tritonclient aio, from the one load generator). At each concurrency the
paths (direct Triton HTTP, then each gateway) take turns in short rounds, so noise hits all of them
alike; the table quotes every gateway path against direct Triton: throughput ratio and the P50/P99
it adds. How busy the machine was before the run (and its load average after) is printed with it.

The processes: :mod:`loadtest.scaling_stack`; the table and plot: :mod:`loadtest.scaling_report`.

Results: the table on stdout, ``scaling.json`` and ``scaling.png`` in ``--out``. Ratios are what to
compare; absolute times depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from loadtest.loadgen import LoadResult, LoadRun, LoadSpec, TritonTarget, merge_runs
from loadtest.loadgen import run as run_specs
from loadtest.options import add_alternating_round_options
from loadtest.scaling_report import Row, report_table, save_plot
from loadtest.scaling_stack import TINY_MODEL, PathConfig, machine_load, services
from serving.console import make_console, print_table, progress
from serving.triton_clients import triton_client

__all__ = ["ScalingSettings", "build_parser", "run", "run_scaling"]

DEFAULT_OUT = Path("reports/scaling")


def _model_inputs(triton_http_url: str, model: str) -> tuple[dict[str, np.ndarray], ...]:
    """Requests for ``model``: one per sample photograph for an image model (FP32 [3, 224, 224]
    input), else one request of ones in every input's declared shape (batch 1)."""
    from tritonclient.utils import triton_to_np_dtype

    client = triton_client(triton_http_url)
    try:
        inputs = client.get_model_metadata(model)["inputs"]
    finally:
        client.close()
    shapes = {i["name"]: [1 if int(d) < 0 else int(d) for d in i["shape"]] for i in inputs}
    if (
        len(inputs) == 1
        and shapes[inputs[0]["name"]][-3:] == [3, 224, 224]
        and inputs[0]["datatype"] == "FP32"
    ):
        from loadtest.payloads import image_tensors

        return tuple({inputs[0]["name"]: image[None]} for image in image_tensors())
    if any(i["datatype"] == "BYTES" for i in inputs):
        raise SystemExit(f"{model} takes BYTES inputs: pick a tensor model for this benchmark")
    return (
        {
            i["name"]: np.ones(shapes[i["name"]], dtype=triton_to_np_dtype(i["datatype"]))
            for i in inputs
        },
    )


def _rows(model: str, results: dict[PathConfig, LoadResult], concurrency: int) -> list[Row]:
    direct = results[PathConfig(0)]
    rows = []
    for path, result in results.items():
        through = path.workers > 0
        rows.append(
            Row(
                model=model,
                path=path.label,
                concurrency=concurrency,
                requests=result.requests,
                errors=result.errors,
                throughput=result.throughput,
                p50_ms=result.p50_ms,
                p99_ms=result.p99_ms,
                vs_direct=result.throughput / direct.throughput
                if through and direct.throughput
                else None,
                added_p50_ms=result.p50_ms - direct.p50_ms if through else None,
                added_p99_ms=result.p99_ms - direct.p99_ms if through else None,
                error_summary=result.error_summary(),
            )
        )
    return rows


@dataclass(frozen=True)
class ScalingSettings:
    """What :func:`run_scaling` measures.

    Attributes:
        model: the image model (e.g. ``efficientnet_lite0``); the tiny model is measured beside it.
        workers: N, the larger worker count (1 is always measured).
        concurrencies: the concurrencies measured, each on every path.
        duration_s: measured seconds per path, model and concurrency, split over ``rounds``.
        rounds: alternating rounds over the paths (drift in the machine spreads over all of them).
        warmup_s: unmeasured seconds at the start of each measured run.
        processes: load-generator processes.
        transports: how the gateway reaches Triton (``http``, ``grpc``).
        warm_s: each path is driven this long at the largest concurrency first (unmeasured), so
            every worker and connection is up before the rounds.
    """

    model: str
    workers: int
    concurrencies: Sequence[int]
    duration_s: float
    rounds: int = 2
    warmup_s: float = 0.5
    processes: int = 1
    transports: Sequence[str] = ("http", "grpc")
    warm_s: float = 1.0


def run_scaling(repository: Path, settings: ScalingSettings) -> list[Row]:
    """Start everything, measure every path at every concurrency for both models, stop everything.

    Args:
        repository: a built model repository holding ``settings.model``.
        settings: what to measure.

    Returns:
        One :class:`Row` per (model, concurrency, path).
    """
    model, workers, concurrencies = settings.model, settings.workers, settings.concurrencies
    rounds, processes = settings.rounds, settings.processes
    counts = sorted({1, workers})
    paths = [PathConfig(0)] + [PathConfig(w, t) for w in counts for t in settings.transports]
    console = make_console()
    rows: list[Row] = []
    with (
        tempfile.TemporaryDirectory(prefix="scaling-") as tmp,
        services(repository, model, paths[1:], Path(tmp)) as (triton_url, urls, key),
    ):
        urls[PathConfig(0)] = triton_url
        steps = 2 * len(concurrencies) * rounds * len(paths)
        with progress(console) as bar:
            task = bar.add_task("measuring", total=steps)
            for name in (TINY_MODEL, model):
                inputs = _model_inputs(triton_url, name)
                targets = {
                    path: TritonTarget(
                        url=urls[path],
                        model=name,
                        inputs=inputs,
                        name=path.label,
                        headers={"authorization": f"Bearer {key}"} if path.workers else {},
                    )
                    for path in paths
                }
                # (loadgen's Target protocol declares ``name`` settable; frozen targets only read it)
                for target in targets.values():  # every worker and connection warm before measuring
                    warm = LoadSpec(
                        target=target,
                        concurrency=max(concurrencies),  # type: ignore[arg-type]
                        duration_s=settings.warm_s,
                        warmup_s=0.0,
                    )
                    run_specs([warm], processes)
                for concurrency in concurrencies:
                    runs: dict[PathConfig, list[LoadRun]] = {path: [] for path in paths}
                    for round_ in range(rounds):
                        for path in paths:
                            bar.update(
                                task,
                                description=f"{name} c={concurrency} round {round_ + 1}: {path.label}",
                            )
                            spec = LoadSpec(
                                target=targets[path],
                                concurrency=concurrency,  # type: ignore[arg-type]
                                duration_s=settings.duration_s / rounds,
                                warmup_s=settings.warmup_s,
                            )
                            runs[path].extend(run_specs([spec], processes))
                            bar.advance(task)
                    rows.extend(
                        _rows(name, {p: merge_runs(r) for p, r in runs.items()}, concurrency)
                    )
    return rows


def build_parser() -> argparse.ArgumentParser:
    from gateway.settings import usable_cores
    from inferctl.build_cmd import add_repository_option

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_repository_option(parser, "a built model repository holding --model")
    parser.add_argument(
        "--model", default="efficientnet_lite0", help="the image model (default: %(default)s)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=usable_cores(),
        help="N, the larger gateway worker count (default: usable cores, %(default)s)",
    )
    add_alternating_round_options(
        parser,
        concurrency=[1, 8, 32],
        duration_s=6.0,
        measured="model, path and concurrency",
        rounds=2,
    )
    parser.add_argument(
        "--warmup-s", type=float, default=0.5, help="unmeasured lead-in of each round"
    )
    parser.add_argument(
        "--processes", type=int, default=1, help="load generator processes (default: %(default)s)"
    )
    parser.add_argument(
        "--transports", nargs="+", choices=["http", "grpc"], default=["http", "grpc"]
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="where scaling.json/png go (default: %(default)s)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """``inferctl bench scaling``: the parsed options in, the exit status out."""
    if not (args.repository / args.model / "config.pbtxt").exists():
        raise SystemExit(
            f"{args.repository}/{args.model} is not a model entry: build it first "
            f"(inferctl build {args.model} --repository {args.repository})"
        )
    before = machine_load()
    rows = run_scaling(
        args.repository,
        ScalingSettings(
            model=args.model,
            workers=args.workers,
            concurrencies=args.concurrency,
            duration_s=args.duration_s,
            rounds=args.rounds,
            warmup_s=args.warmup_s,
            processes=args.processes,
            transports=args.transports,
        ),
    )
    machine = {**before, "load_average_after": [round(v, 2) for v in os.getloadavg()]}
    settings = (
        f"{args.duration_s:g} s per path in {args.rounds} alternating rounds, {args.processes} load "
        f"process(es), KServe v2 binary over HTTP from tritonclient aio; percentiles from serving.quantiles"
    )
    print_table(report_table(rows, machine, settings), make_console())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scaling.json").write_text(
        json.dumps(
            {"machine": machine, "settings": settings, "rows": [asdict(r) for r in rows]}, indent=2
        )
    )
    save_plot(rows, f"{settings}\n{machine}", args.out / "scaling.png")
    print(f"wrote {args.out / 'scaling.json'} and {args.out / 'scaling.png'}")
    return 1 if any(r.requests == 0 for r in rows) else 0


if __name__ == "__main__":
    from loadtest.registry import run_named

    raise SystemExit(run_named("scaling"))
