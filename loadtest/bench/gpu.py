"""The GPU benchmark: every serving path of one GPU host side by side, in one run.

    python -m loadtest.bench.gpu --out OUT_DIR [--quick]      # on the GPU host
    loadtest/gpu_bench.sh run OUT_DIR                         # the same from a fresh checkout

One Triton serves, all ``KIND_GPU``: the TorchScript classifier (FP16, channels_last, CUDA graphs,
``max_batch_size`` 256), its twin with dynamic batching off, ``image_classifier_gpu`` (JPEG -> top-5
on the GPU) and, where it builds, a compiled flavour (``--compiled``) with the pipeline on it. Then:

1. the in-process ceilings (:mod:`loadtest.bench.gpu_raw`): the classifier at every batch size up
   to 256 (eager / channels_last / CUDA graph, and the compiled flavour beside), and the JPEG pipeline's steps;
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

A configuration that cannot run fails the run with its error. With ``--budget-s`` the run fits a
time budget: the load points run in the order given (most important first) and before the sweep,
which takes what is left; points and sweep candidates that would not fit are not started and are
reported as not run, with that reason, in the table and the JSON. Writes ``bench.json``,
``bench.png``, ``bench.txt`` (the printed tables) and ``machine.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from loadtest.bench.cpu_split import cpu_snapshot, cpu_split
from loadtest.bench.gpu_report import evaluate_targets, print_gpu_report, result_row
from loadtest.bench.gpu_sanity import sanity
from loadtest.bench.gpu_settings import GpuBenchSettings
from loadtest.bench.gpu_setup import (
    PIPELINE,
    PIPELINE_COMPILED,
    TENSOR,
    Clock,
    compiled_entry,
    compiled_file,
    latest,
    parse_points,
    prepare_repository,
    sweep,
    unavailable,
)
from loadtest.bench.gpu_targets import IMAGES_PER_REQUEST, gpu_targets
from loadtest.bench.plot import save_gpu_plot
from loadtest.bench.point_split import PointProbe
from loadtest.bench.report import machine_description
from loadtest.bench.servers import BenchGateway, gateway_server, naive_server
from loadtest.bench.settings import Result
from loadtest.loadgen import (
    LoadSpec,
    Target,
    TritonTarget,
    instant_twin,
    measure_capacity,
    run_load,
    twin_target,
)
from loadtest.payloads import image_tensors, jpeg_images
from serving.launcher import TritonPorts, TritonServer

__all__ = ["GpuBenchSettings", "build_parser", "run", "run_gpu_bench"]


def _log(message: str) -> None:
    print(f"[gpu-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------- the run


def _points(settings: GpuBenchSettings, targets: dict[str, Target]) -> list[tuple[str, int]]:
    """In the order of ``settings.points`` (a budgeted run measures the most important first); a
    configuration named there that has no target here is kept, to be reported as not run."""
    return [(name, c) for name, levels in settings.points.items() for c in levels]


def _not_run(name: str, concurrency: int, reason: str) -> Result:
    return Result(
        config=name,
        concurrency=concurrency,
        requests=0,
        errors=1,
        duration_s=0.0,
        throughput=0.0,
        p50_ms=0.0,
        p95_ms=0.0,
        p99_ms=0.0,
        mean_ms=0.0,
        error_rate=1.0,
        error_messages=f"not run: {reason}",
    )


def _point_cost(settings: GpuBenchSettings, capacity: bool) -> float:
    """Seconds one load point takes (with its capacity run where that is not measured yet), each
    run with the load generator's process start (about a second)."""
    return (
        settings.warmup_s
        + settings.duration_s
        + 1.0
        + (settings.warmup_s + settings.capacity_s + 1.0 if capacity else 0.0)
    )


def _save(settings: GpuBenchSettings, document: dict[str, Any], results: list[Result]) -> None:
    """bench.json as it stands: a run cut short still leaves every figure measured so far."""
    document["results"] = [
        {**asdict(r), "error_rate": r.error_rate, "capacity_used": r.capacity_used} for r in results
    ]
    (settings.out_dir / "bench.json").write_text(
        json.dumps(document, indent=2, default=float) + "\n", encoding="utf-8"
    )


@dataclass
class _Run:
    """What the run's steps share: its settings and time budget, the document and the rows so far."""

    settings: GpuBenchSettings
    clock: Clock
    document: dict[str, Any]
    results: list[Result] = field(default_factory=list)

    def save(self) -> None:
        _save(self.settings, self.document, self.results)


@dataclass(frozen=True)
class _Servers:
    """What the points are measured on: Triton, the gateway, the clients, and the instant twins."""

    triton: TritonServer
    gateway: BenchGateway | None
    targets: dict[str, Target]
    twins: dict[str, str]


def run_gpu_bench(settings: GpuBenchSettings) -> dict[str, Any]:
    """The whole run; writes the files and returns the JSON document."""
    settings.out_dir.mkdir(parents=True, exist_ok=True)
    machine = machine_description()
    (settings.out_dir / "machine.json").write_text(
        json.dumps(machine, indent=2) + "\n", encoding="utf-8"
    )
    started = time.perf_counter()
    document: dict[str, Any] = {
        "settings": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(settings).items()
        },
        "machine": machine,
    }
    run = _Run(settings, Clock(settings.budget_s), document)
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-bench-")))
        root = workdir / "repository"
        _log(
            f"building the repository (TorchScript, pipeline, compiled: {settings.compiled or 'none'}) ..."
        )
        document["build"] = prepare_repository(root, settings)
        compiled = compiled_entry(settings.compiled) if settings.compiled else ""
        if compiled not in document["build"]["entries"]:
            compiled = ""
        gpu = settings.device == "cuda"
        model_file = latest(root, TENSOR) / "model.pt"
        if gpu:
            _ceilings(run, root, model_file, compiled)
        _log("starting Triton ...")
        triton = stack.enter_context(
            TritonServer(
                root,
                models=document["build"]["entries"],
                ports=TritonPorts.free(),
                startup_timeout_s=900,
            )
        )
        document["sanity"] = sanity(triton, compiled, PIPELINE_COMPILED if compiled else "")
        _log(f"sanity: {document['sanity']}")
        run.save()
        workers = settings.workers()
        gateway = stack.enter_context(gateway_server(triton.http_url, workdir, workers=workers))
        naive = stack.enter_context(
            naive_server(settings.device, "fp16" if gpu else "fp32", workdir)
        )
        targets = gpu_targets(triton, gateway, naive, compiled, gpu)
        points = _points(settings, targets)

        # Unbudgeted, the sweep comes first and the points measure its choice; with a budget the points
        # are the run's figures and come first (measuring the entries as built), the sweep takes what is left.
        if settings.sweep and not settings.budget_s:
            _sweeps(run, triton, root, targets, reserve=0.0)
        twins = {
            name: stack.enter_context(instant_twin(triton.http_url, name))
            for name in (TENSOR, PIPELINE)
        }
        servers = _Servers(triton, gateway, targets, twins)
        capacities: dict[tuple[str, int], float] = {}
        for name, concurrency in points:
            _point(run, servers, capacities, name, concurrency)
        if settings.sweep and settings.budget_s:
            _sweeps(run, triton, root, targets, reserve=5.0)  # the report is drawn after it
        document["clients"] = {name: t.describe() for name, t in targets.items()}
        document["gateway_workers"] = workers
        for name in (PIPELINE, TENSOR):
            document.setdefault("build_reports", {})[name] = json.loads(
                (latest(root, name) / "build_report.json").read_text(encoding="utf-8")
            )
    document["wall_s"] = time.perf_counter() - started
    _finish(run)
    return document


def _ceilings(run: _Run, root: Path, model_file: Path, compiled: str) -> None:
    """The in-process ceilings and the JPEG pipeline's step profile (GPU only), before any server."""
    from loadtest.bench.gpu_raw import jpeg_profile, tensor_ceiling
    from loadtest.bench.jpeg_reference import jpeg_overlapped

    settings, document = run.settings, run.document
    compiled_path = compiled_file(root, settings.compiled) if compiled else None
    run.results += tensor_ceiling(
        model_file,
        image_tensors(),
        settings.raw_batches,
        settings.raw_seconds,
        compiled_path,
    )
    document["jpeg_profile"] = [jpeg_profile(model_file, jpeg_images(), b) for b in (64, 128)]
    if compiled_path is not None:
        document["jpeg_profile"] += [
            {**jpeg_profile(compiled_path, jpeg_images(), b), "classifier": compiled}
            for b in (64, 128)
        ]
    # The served JPEG path's reference (issue 28): the overlapped pipeline on the classifier the
    # fastest served entry runs.
    run.results += jpeg_overlapped(compiled_path or model_file, jpeg_images(), (64, 128))
    run.save()


def _sweeps(
    run: _Run, triton: TritonServer, root: Path, targets: dict[str, Target], reserve: float
) -> None:
    """The batching sweep of each of ``settings.sweep_configs``, within the budget less ``reserve``."""
    settings, document = run.settings, run.document
    gpu = settings.device == "cuda"
    at = 64 if gpu else 8
    document["sweep"] = []
    for config in settings.sweep_configs:
        config = config if gpu or config != "tensor cuda-shm" else "tensor system-shm"
        if config not in targets:
            document["sweep"].append({"entry": config, "error": unavailable(config, settings)})
            continue
        target = targets[config]
        assert isinstance(target, TritonTarget)
        document["sweep"].append(
            sweep(
                triton,
                root,
                target.model,
                target,
                settings,
                at,
                fits=lambda cost: run.clock.fits(cost, reserve),
            )
        )
        run.save()


def _point(
    run: _Run,
    servers: _Servers,
    capacities: dict[tuple[str, int], float],
    name: str,
    concurrency: int,
) -> None:
    """One load point (its client's capacity first, where not measured yet), or a row saying why not."""
    settings, results, targets = run.settings, run.results, servers.targets
    if name not in targets:
        results.append(_not_run(name, concurrency, unavailable(name, settings)))
        return
    target = targets[name]
    client = target.describe()
    if not run.clock.fits(_point_cost(settings, (client, concurrency) not in capacities)):
        results.append(
            _not_run(
                name,
                concurrency,
                f"the run's time budget of {settings.budget_s:g} s was spent",
            )
        )
        _log(f"{name} at concurrency {concurrency}: not run, the time budget is spent")
        return
    triton, gateway = servers.triton, servers.gateway
    spec = LoadSpec(
        target=target,
        concurrency=concurrency,
        duration_s=settings.duration_s,
        warmup_s=settings.warmup_s,
        name=name,
    )
    if (client, concurrency) not in capacities:
        twin = servers.twins[PIPELINE] if "jpeg" in name else servers.twins[TENSOR]
        if isinstance(target, TritonTarget):
            capacity_target: Target = twin_target(target, twin, triton.http_url)
        else:  # the naive server's client: the same POSTs, to the twin as KServe v2 requests
            capacity_target = twin_target(targets["tensor http"], twin, triton.http_url)  # type: ignore[arg-type]
        _log(f"capacity of {client} at {concurrency}")
        capacities[(client, concurrency)] = measure_capacity(
            replace(spec, duration_s=settings.capacity_s), capacity_target, settings.clients
        ).throughput
    _log(f"{name} at concurrency {concurrency}")
    # Triton's own split of the point's time (queue, stub, outside Triton), for its targets
    # (the gateway's requests reach the same model), and the gateway's where it is in the
    # path (stages, the hop to Triton, before its code); the naive server has none.
    probe = None
    if isinstance(target, TritonTarget):
        via = (
            (gateway.url, gateway.metrics_token)
            if gateway is not None and "gateway" in name
            else None
        )
        probe = PointProbe.start(triton.http_url, target.model, triton.metrics_url, gateway=via)
    cpu_before, point_started = cpu_snapshot(), time.perf_counter()
    results.append(
        result_row(
            name,
            run_load(spec, settings.clients),
            capacities[(client, concurrency)],
            IMAGES_PER_REQUEST.get(name, 1),
        )
    )
    span, cpu_after = time.perf_counter() - point_started, cpu_snapshot()
    if probe is not None:
        row = probe.row(name, concurrency, results[-1].mean_ms)
        row["cpu"] = cpu_split(cpu_before, cpu_after, span, row["requests"])
        run.document.setdefault("triton_split", []).append(row)
    _log(
        f"  {results[-1].throughput:,.0f}/s, P99 {results[-1].p99_ms:.1f} ms, errors {results[-1].errors}"
    )
    run.save()


def _finish(run: _Run) -> None:
    """The final bench.json, bench.txt and bench.png."""
    settings, document, results = run.settings, run.document, run.results
    document["results"] = [
        {**asdict(r), "error_rate": r.error_rate, "capacity_used": r.capacity_used} for r in results
    ]
    document["targets"] = evaluate_targets(results)
    print_gpu_report(results, document, settings.out_dir / "bench.txt")
    document["files"] = {
        "json": "bench.json",
        "png": save_gpu_plot(results, document, settings.out_dir / "bench.png").name,
        "table": "bench.txt",
        "machine": "machine.json",
    }
    (settings.out_dir / "bench.json").write_text(
        json.dumps(document, indent=2, default=float) + "\n", encoding="utf-8"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench.gpu", description=__doc__.split("\n\n")[0]
    )
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
        help='per configuration, e.g. "jpeg=32,64;tensor http=32" (others then do not run)',
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
    for key, value in (
        ("duration_s", args.duration),
        ("clients", args.clients),
        ("gateway_workers", args.gateway_workers),
        ("warmup_s", args.warmup),
        ("capacity_s", args.capacity_duration),
        ("budget_s", args.budget_s),
    ):
        if value is not None:
            overrides[key] = value
    document = run_gpu_bench(GpuBenchSettings(**overrides))
    failed = [r for r in document["results"] if r["errors"]]
    return 1 if failed else 0


if __name__ == "__main__":
    from loadtest.registry import run_named

    raise SystemExit(run_named("gpu"))
