"""The GPU benchmark: every serving path of one GPU host side by side, in one run.

    python -m loadtest.bench.gpu --out OUT_DIR [--quick]      # on the GPU host
    loadtest/gpu_bench.sh run OUT_DIR                         # the same from a fresh checkout

One Triton serves, all ``KIND_GPU``: the TorchScript classifier (FP16, channels_last, CUDA graphs,
``max_batch_size`` 256), its twin with dynamic batching off, ``image_classifier_gpu`` (JPEG -> top-5
on the GPU) and, where it builds, a compiled flavour (``--compiled``) with the pipeline on it. Then:

1. the in-process ceilings (:mod:`loadtest.bench.gpu_raw`): the classifier at every batch size up
   to 256 (eager / channels_last / CUDA graph, and the compiled flavour beside), and the JPEG
   pipeline's steps;
2. a sweep of the entries of ``--sweep-configs`` (instance count x queue delay x preferred batch
   sizes, what Triton's Model Analyzer does, and once without queue policies: measured, never
   chosen), each candidate loaded through Triton's model-control API; the best throughput with
   P99 <= 20 ms is kept, loaded, and written into the entry's build report;
3. the load points, each beside the load generator's capacity with the same client settings
   (against an instant twin of the entry): the tensor path over HTTP (binary tensors), system and
   CUDA shared memory (also with 8 images per request, as perf_analyzer's ``-b 8``); batching off;
   the JPEG path direct and through the gateway (KServe v2 passthrough, several gateway workers);
   the naive FastAPI + PyTorch server. Throughput is counted in images. Each Triton point also
   records where its requests' time went (:mod:`loadtest.bench.triton_split`) and who used the
   host's CPUs meanwhile (:mod:`loadtest.bench.cpu_split`); a gateway point also splits its time
   outside Triton by the gateway's own stage metrics (:mod:`loadtest.bench.gateway_split`).

The points run in the order given, except that a gateway point (``jpeg gateway``) runs beside the
same point of its direct twin (``jpeg``), the direct one first at every other pair, so that both
sides of a comparison see the host as it was then.

A configuration that cannot run fails the run with its error. With ``--budget-s`` the run fits a
time budget: the load points run in the order given (most important first) and before the sweep,
which takes what is left; points and sweep candidates that would not fit are not started and are
reported as not run, with that reason, in the table and the JSON. Writes ``bench.json``,
``bench.png``, ``bench.txt`` (the printed tables) and ``machine.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from loadtest.bench.gpu_goals import evaluate_targets
from loadtest.bench.gpu_report import print_gpu_report
from loadtest.bench.gpu_run import run_gpu_bench
from loadtest.bench.gpu_settings import GpuBenchSettings
from loadtest.bench.gpu_setup import parse_points
from loadtest.bench.plot import save_gpu_plot
from loadtest.bench.settings import Result
from loadtest.options import given_options

__all__ = ["GpuBenchSettings", "build_parser", "run", "run_gpu_bench"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="folder for bench.json, bench.png, bench.txt, machine.json",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="seconds per point, a smaller sweep (proves the machinery)",
    )
    parser.add_argument(
        "--concurrency",
        help="comma separated, the same for every configuration (default: per "
        "configuration, see GpuBenchSettings.points)",
    )
    parser.add_argument(
        "--points",
        type=parse_points,
        help='per configuration, e.g. "jpeg=32,64;tensor http=32" (others then do not run); run in '
        "this order, each gateway point beside its direct twin's",
    )
    parser.add_argument(
        "--raw-batches", help="batch sizes of the in-process ceiling (default 1,2,4,...,256)"
    )
    parser.add_argument("--duration", type=float, help="measured seconds per point (default 3)")
    parser.add_argument(
        "--warmup", type=float, help="unmeasured seconds before each point (default 1)"
    )
    parser.add_argument(
        "--capacity-duration",
        type=float,
        help="measured seconds of each capacity point (default 2)",
    )
    parser.add_argument(
        "--report-from",
        type=Path,
        help="no run: print the tables and draw the plot of a saved bench.json "
        "(a run cut short saves one after every point) into --out",
    )
    parser.add_argument("--clients", type=int, help="load-generator processes (default 6)")
    parser.add_argument(
        "--gateway-workers",
        type=int,
        help="gateway worker processes (default: a quarter of the cores)",
    )
    parser.add_argument(
        "--no-sweep", action="store_true", help="serve the built configs without the sweep"
    )
    parser.add_argument(
        "--sweep-configs",
        help="the configurations whose entries the sweep tunes, ';' separated "
        '(default "jpeg;tensor cuda-shm")',
    )
    parser.add_argument(
        "--compiled",
        choices=["inductor", "aoti", "none"],
        default="inductor",
        help="the compiled flavour built and served beside TorchScript (builders/compiled.py; default "
        "inductor: torch.export, compiled by torch.compile at load); none: no compiled rows",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        help="seconds the whole run may take: points in the order of --points, "
        "what would not fit is reported as not run (default: no limit)",
    )
    parser.add_argument(
        "--cuda-pool-mb",
        type=int,
        default=0,
        help="Triton's CUDA memory pool on the GPU, MiB (default 0: Triton's own, 64); the Python "
        "backend passes GPU inputs to its stub through it",
    )
    parser.add_argument(
        "--twin-instances",
        type=int,
        default=GpuBenchSettings.twin_instances,
        help="stub processes of the instant twins that measure the load generator's capacity "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--tensor-instances",
        type=int,
        default=GpuBenchSettings.tensor_instances,
        help="instances of the tensor entry on the GPU (default %(default)s: the better of 3 and 6 "
        "at 256 in flight in H100 run 15)",
    )
    parser.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default="cuda",
        help="cpu: prove the machinery where there is no GPU (the figures mean nothing)",
    )
    return parser


def report_from(saved: Path, out_dir: Path) -> dict[str, Any]:
    """Tables, targets and plot of a saved ``bench.json``, written to ``out_dir``."""
    document = json.loads(saved.read_text(encoding="utf-8"))
    fields = {f for f in Result.__dataclass_fields__}
    results = [
        Result(**{k: v for k, v in row.items() if k in fields}) for row in document["results"]
    ]
    for r in results:  # runs saved before capacity_used was a field
        if r.capacity and r.capacity_used is None:
            r.capacity_used = r.throughput / r.capacity
    document["targets"] = evaluate_targets(results)
    out_dir.mkdir(parents=True, exist_ok=True)
    print_gpu_report(results, document, out_dir / "bench.txt")
    document["files"] = {
        "json": "bench.json",
        "png": save_gpu_plot(results, document, out_dir / "bench.png").name,
        "table": "bench.txt",
        "machine": "machine.json",
    }
    (out_dir / "bench.json").write_text(
        json.dumps(document, indent=2, default=float) + "\n", encoding="utf-8"
    )
    return document


def run(args: argparse.Namespace) -> int:
    """``inferctl bench gpu``: the parsed options in, the exit status out."""
    if args.report_from:
        report_from(args.report_from, args.out)
        return 0
    overrides: dict[str, Any] = {
        "out_dir": args.out,
        "sweep": not args.no_sweep,
        "compiled": "" if args.compiled == "none" else args.compiled,
        "device": args.device,
        "cuda_pool_mb": args.cuda_pool_mb,
        "twin_instances": args.twin_instances,
        "tensor_instances": args.tensor_instances,
    }
    if args.quick:
        overrides.update(
            duration_s=1.5,
            warmup_s=0.5,
            capacity_s=1.0,
            raw_batches=(1, 64, 256),
            raw_seconds=0.2,
            quick=True,
        )
    if args.quick or args.concurrency:
        levels = tuple(int(c) for c in (args.concurrency or "64").split(","))
        overrides["points"] = {name: levels for name in GpuBenchSettings(out_dir=args.out).points}
    if args.points:
        overrides["points"] = args.points
    if args.sweep_configs:
        overrides["sweep_configs"] = tuple(
            c.strip() for c in args.sweep_configs.split(";") if c.strip()
        )
    if args.raw_batches:
        overrides["raw_batches"] = tuple(int(b) for b in args.raw_batches.split(","))
    overrides.update(
        given_options(
            duration_s=args.duration,
            clients=args.clients,
            gateway_workers=args.gateway_workers,
            warmup_s=args.warmup,
            capacity_s=args.capacity_duration,
            budget_s=args.budget_s,
        )
    )
    document = run_gpu_bench(GpuBenchSettings(**overrides))
    failed = [r for r in document["results"] if r["errors"]]
    return 1 if failed else 0


if __name__ == "__main__":
    from loadtest.registry import run_named

    raise SystemExit(run_named("gpu"))
