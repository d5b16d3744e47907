"""The GPU benchmark's run: build, serve, measure every point, and save (``loadtest.bench.gpu`` says what).

:func:`run_gpu_bench` is the whole run; the CLI in :mod:`loadtest.bench.gpu` parses its settings.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from loadtest.bench.cpu_split import cpu_snapshot, cpu_split
from loadtest.bench.gpu_goals import evaluate_targets
from loadtest.bench.gpu_report import print_gpu_report, result_row
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
    prepare_repository,
    sweep,
    unavailable,
)
from loadtest.bench.gpu_targets import GATEWAY_SUFFIX, IMAGES_PER_REQUEST, gpu_targets
from loadtest.bench.plot import save_gpu_plot
from loadtest.bench.point_split import PointProbe
from loadtest.bench.report import machine_description
from loadtest.bench.servers import BenchGateway, gateway_server, naive_server
from loadtest.bench.settings import Result, point_spec
from loadtest.loadgen import (
    LoadError,
    Target,
    TritonTarget,
    instant_twin,
    measure_capacity,
    run_load,
    twin_target,
)
from loadtest.loadgen.capacity import TWIN_INSTANCES
from loadtest.payloads import image_tensors, jpeg_images
from serving.launcher import TritonPorts, TritonServer

__all__ = ["paired", "run_gpu_bench"]


def _log(message: str) -> None:
    print(f"[gpu-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------- the run


def _points(settings: GpuBenchSettings, targets: dict[str, Target]) -> list[tuple[str, int]]:
    """In the order of ``settings.points`` (a budgeted run measures the most important first); a
    configuration named there that has no target here is kept, to be reported as not run.

    A gateway point and the same point of its direct configuration are measured back to back, the
    direct one first at every other pair: a host that drifts over a run (on an H100 the same point
    measured minutes apart differed by 10%, ``benchmarks/h100/run22-both-orders``) then moves both
    sides of the comparison, and neither side is always the one measured later."""
    points = [(name, c) for name, levels in settings.points.items() for c in levels]
    return paired(points)


def paired(points: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """``points`` with each gateway point beside its direct twin, where both are there (see
    :func:`_points`); the first of a pair is where the earlier of the two was."""
    wanted = set(points)
    order: list[tuple[str, int]] = []
    direct_first = True
    for name, concurrency in points:
        if (name, concurrency) in order:
            continue  # placed already, beside its twin
        direct = name.removesuffix(GATEWAY_SUFFIX)
        pair = [(direct, concurrency), (direct + GATEWAY_SUFFIX, concurrency)]
        if not all(point in wanted for point in pair):
            order.append((name, concurrency))
            continue
        order.extend(pair if direct_first else pair[::-1])
        direct_first = not direct_first
    return order


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
    #: twins already driven once: a twin's stubs start lazily (CUDA in each, for GPU inputs), and
    #: eight of them were not all answering within a capacity run's warm-up (H100 run 13: 32/s)
    warmed: set[str] = field(default_factory=set)


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
                cuda_memory_pool_mb=settings.cuda_pool_mb,
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
            name: stack.enter_context(
                instant_twin(
                    triton.http_url,
                    name,
                    instances=settings.twin_instances if gpu else TWIN_INSTANCES,
                )
            )
            for name in (TENSOR, PIPELINE)
        }
        servers = _Servers(triton, gateway, targets, twins)
        capacities: dict[tuple[str, int], float | None] = {}
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
    capacities: dict[tuple[str, int], float | None],
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
    spec = point_spec(target, concurrency, settings, name)
    if (client, concurrency) not in capacities:
        twin = servers.twins[PIPELINE] if "jpeg" in name else servers.twins[TENSOR]
        if isinstance(target, TritonTarget):
            capacity_target: Target = twin_target(target, twin, triton.http_url)
        else:  # the naive server's client: the same POSTs, to the twin as KServe v2 requests
            capacity_target = twin_target(
                targets["tensor http"],  # type: ignore[arg-type]
                twin,
                triton.http_url,
            )
        _log(f"capacity of {client} at {concurrency}")
        try:
            if twin not in servers.warmed:  # discarded: every stub started, at this concurrency
                servers.warmed.add(twin)
                run_load(replace(spec, target=capacity_target, duration_s=2.0), settings.clients)
            capacities[(client, concurrency)] = measure_capacity(
                replace(spec, duration_s=settings.capacity_s), capacity_target, settings.clients
            ).throughput
        except LoadError as exc:  # the point is still measured; its capacity is not, and says why
            _log(f"capacity of {client} at {concurrency} failed: {str(exc)[:300]}")
            failed = run.document.setdefault("capacity_errors", {})
            failed[f"{name} at {concurrency}"] = str(exc)[:2000]
            capacities[(client, concurrency)] = None
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
