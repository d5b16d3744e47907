"""One run of the side-by-side benchmark: start the servers, check each answers, sweep, report.

Every configuration receives identical requests (one real photograph as an FP32 [1, 3, 224, 224]
tensor per request, 12 photos round robin) from the platform's load generator
(:mod:`loadtest.loadgen`) at each concurrency, and every point is printed beside the load
generator's own capacity at the same settings, measured against an instant twin of the model in
the same Triton. A configuration that cannot start fails the run with its error. Each gateway point
also splits its time outside Triton by the gateway's own stage metrics
(:mod:`loadtest.bench.gateway_split`), printed after the ratios and kept in ``bench.json``.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from builders.triton_config import read_config
from loadtest.bench.first_answer import first_top1
from loadtest.bench.gateway_split import gateway_table
from loadtest.bench.plot import save_plot
from loadtest.bench.point_split import PointProbe
from loadtest.bench.raw import raw_ceiling
from loadtest.bench.report import compute_ratios, machine_description, print_report
from loadtest.bench.repository import copy_pipeline, prepare_repository, tensor_names
from loadtest.bench.servers import BenchGateway, gateway_server, naive_server, naive_target
from loadtest.bench.settings import (
    ALL_CONFIGS,
    JPEG_CONFIGS,
    PIPELINE,
    BenchSettings,
    Result,
    point_spec,
    result_row,
)
from loadtest.loadgen import (
    HttpTarget,
    Target,
    TritonTarget,
    instant_twin,
    run_load,
)
from loadtest.loadgen.capacity import measure_capacity, twin_target
from loadtest.options import settings_record
from loadtest.payloads import image_tensors, jpeg_images, v2_binary_request
from serving.launcher import TritonPorts, TritonServer

__all__ = ["run_bench"]

_TRITON_CONFIGS = ("triton-batching", "triton-no-batching", "gateway")
_JPEG_OUTPUTS = ("SCORES", "CLASS_IDS")


def _settings_line(
    settings: BenchSettings, entry: str, clients: dict[str, str], instances: int
) -> str:
    precision = (
        "FP16 TorchScript on CUDA via the pytorch backend"
        if settings.device == "cuda"
        else "FP32 ONNX via onnxruntime backend"
    )
    described = "; ".join(f"{name}: {text}" for name, text in clients.items())
    jpeg = (
        "; JPEG configurations: the photos and their mirror images as JPEG "
        "(at most 512 px, quality 90)"
        if set(JPEG_CONFIGS) & set(settings.configs)
        else ""
    )
    return (
        f"model {entry} ({precision}); payload FP32 [1,3,224,224], 12 real photos round-robin"
        f"{jpeg}; "
        f"closed loop, concurrency {list(settings.concurrency)}, {settings.warmup_s:g}s warm-up + "
        f"{settings.duration_s:g}s measured per point, {settings.clients} client process(es); "
        f"{described}; client capacity: the same client against an instant twin of the model in "
        f"the same Triton; {instances} Triton instance(s), intra-op threads = runtime default "
        "(physical cores), inter-op 1; naive server torch threads "
        f"{settings.naive_threads or 'default (physical cores)'}; raw batches "
        f"{list(settings.raw_batches)}"
    )


def _jpeg_inputs() -> tuple[dict[str, np.ndarray], ...]:
    return tuple({"IMAGE": np.array([[data]], dtype=np.object_)} for data in jpeg_images())


@dataclass(frozen=True)
class _Tested:
    """The entry under test, its copy with batching off, and the tensors it is sent."""

    entry: str
    nobatch: str
    images: np.ndarray
    input_name: str
    output_name: str


def _targets(
    settings: BenchSettings,
    configs: list[str],
    stack: contextlib.ExitStack,
    workdir: Path,
    triton: TritonServer,
    tested: _Tested,
) -> tuple[dict[str, Target], BenchGateway | None]:
    entry, nobatch, images = tested.entry, tested.nobatch, tested.images
    input_name, output_name = tested.input_name, tested.output_name
    inputs = tuple({input_name: images[i : i + 1]} for i in range(len(images)))
    url = triton.grpc_url if settings.protocol == "grpc" else triton.http_url
    direct = TritonTarget(
        url=url,
        model=entry,
        inputs=inputs,
        outputs=(output_name,),
        protocol=settings.protocol,
        shared_memory=settings.shared_memory,
        name="triton-batching",
    )
    # One gateway and one naive server, started where a configuration uses them.
    address, auth, naive_base, gateway = "", {}, "", None
    if {"gateway", "gateway-jpeg"} & set(configs):
        gateway = stack.enter_context(gateway_server(triton.http_url, workdir))
        address, auth = (
            gateway.url.removeprefix("http://"),
            {"Authorization": f"Bearer {gateway.key}"},
        )
    if {"naive", "naive-jpeg"} & set(configs):
        precision = "fp16" if settings.device == "cuda" else "fp32"
        naive_base = stack.enter_context(
            naive_server(
                settings.device, precision, workdir, settings.model, settings.naive_threads
            )
        )
    targets: dict[str, Target] = {}
    if "triton-batching" in configs:
        targets["triton-batching"] = direct
    if "triton-no-batching" in configs:
        targets["triton-no-batching"] = replace(direct, model=nobatch, name="triton-no-batching")
    if "gateway" in configs:  # the gateway speaks HTTP; its tensors travel in the body
        targets["gateway"] = TritonTarget(
            url=address,
            model=entry,
            inputs=inputs,
            outputs=(output_name,),
            headers=auth,
            name="gateway",
        )
    if "naive" in configs:
        targets["naive"] = naive_target(naive_base, images)
    if "gateway-jpeg" in configs:
        targets["gateway-jpeg"] = TritonTarget(
            url=address,
            model=PIPELINE,
            inputs=_jpeg_inputs(),
            outputs=_JPEG_OUTPUTS,
            headers=auth,
            name="gateway-jpeg",
        )
    if "naive-jpeg" in configs:
        targets["naive-jpeg"] = HttpTarget(
            url=f"{naive_base}/classify",
            name="naive-jpeg",
            requests=tuple((data, {"Content-Type": "image/jpeg"}) for data in jpeg_images()),
        )
    return targets, gateway


def _capacity_target(
    target: Target, twins: dict[str, str], triton: TritonServer, tested: _Tested
) -> Target:
    entry, images = tested.entry, tested.images
    input_name, output_name = tested.input_name, tested.output_name
    if isinstance(
        target, TritonTarget
    ):  # the entry's twin stands for its no-batching copy too: same interface
        twin = twins[PIPELINE] if target.model == PIPELINE else twins[entry]
        return twin_target(
            target, twin, triton.grpc_url if target.protocol == "grpc" else triton.http_url
        )
    # The naive server's client: the same aiohttp POSTs of the same payloads, as KServe v2 requests.
    if target.name == "naive-jpeg":
        model, encoded = (
            PIPELINE,
            [v2_binary_request(i, list(_JPEG_OUTPUTS)) for i in _jpeg_inputs()],
        )
    else:
        model = entry
        encoded = [
            v2_binary_request({input_name: images[i : i + 1]}, [output_name])
            for i in range(len(images))
        ]
    requests = tuple((request.body, request.headers) for request in encoded)
    return HttpTarget(
        url=f"http://{triton.http_url}/v2/models/{twins[model]}/infer",
        requests=tuple(requests),
        name=f"{target.name} (capacity)",
    )


@dataclass(frozen=True)
class _Load:
    """The servers and clients of the configurations that are sent load (all but ``raw``)."""

    triton: TritonServer
    targets: dict[str, Target]
    capacity_targets: dict[str, Target]
    clients: dict[str, str]
    gateway: BenchGateway | None


@dataclass(frozen=True)
class _Measured:
    """What one run measured, kept past the servers it ran against."""

    entry: str
    instances: int
    clients: dict[str, str]
    sanity: dict[str, int]
    results: list[Result]
    splits: list[dict[str, Any]]


def _start_load(
    settings: BenchSettings,
    load_configs: list[str],
    stack: contextlib.ExitStack,
    workdir: Path,
    tested: _Tested,
) -> _Load:
    """Triton with the models the load configurations use, their gateway or naive server, and
    the instant twins their clients' capacity is measured against."""
    repo = workdir / "repository"
    entry, nobatch = tested.entry, tested.nobatch
    models = [entry, nobatch] if set(_TRITON_CONFIGS) & set(load_configs) else [entry]
    if set(JPEG_CONFIGS) & set(load_configs):
        models += [m for m in copy_pipeline(settings, repo, PIPELINE) if m not in models]
    triton = stack.enter_context(TritonServer(repo, models=models, ports=TritonPorts.free()))
    targets, gateway = _targets(settings, load_configs, stack, workdir, triton, tested)
    twinned = [entry] + ([PIPELINE] if set(JPEG_CONFIGS) & set(load_configs) else [])
    twins = {model: stack.enter_context(instant_twin(triton.http_url, model)) for model in twinned}
    capacity_targets = {
        name: _capacity_target(t, twins, triton, tested) for name, t in targets.items()
    }
    clients = {name: t.describe() for name, t in targets.items()}
    return _Load(triton, targets, capacity_targets, clients, gateway)


def _sweep(settings: BenchSettings, load: _Load) -> tuple[list[Result], list[dict[str, Any]]]:
    """Every target at every concurrency, each point beside its client's capacity there.

    Concurrency-major order: every configuration sees each load level at about the same time, so
    drift from other work on the machine spreads over all of them.
    """
    results: list[Result] = []
    splits: list[dict[str, Any]] = []
    for concurrency in settings.concurrency:
        capacities: dict[str, float] = {}  # one capacity per distinct client at this concurrency
        for name, target in load.targets.items():
            spec = point_spec(target, concurrency, settings, name)
            kind = load.clients[name]
            if kind not in capacities:
                print(
                    f"[bench] client capacity ({kind}) concurrency={concurrency} ...",
                    file=sys.stderr,
                    flush=True,
                )
                capacities[kind] = measure_capacity(
                    spec, load.capacity_targets[name], settings.clients
                ).throughput
            print(f"[bench] {name} concurrency={concurrency} ...", file=sys.stderr, flush=True)
            gateway = load.gateway
            if (
                gateway is None
                or not name.startswith("gateway")
                or not isinstance(target, TritonTarget)
            ):
                results.append(result_row(name, run_load(spec, settings.clients), capacities[kind]))
                continue
            # A gateway point also gets the gateway's own split of its time outside Triton.
            probe = PointProbe.start(
                load.triton.http_url, target.model, gateway=(gateway.url, gateway.metrics_token)
            )
            results.append(result_row(name, run_load(spec, settings.clients), capacities[kind]))
            splits.append(probe.row(name, concurrency, results[-1].mean_ms))
    return results, splits


def _best_raw(before: list[Result], after: list[Result]) -> list[Result]:
    """Each raw row, the better of its run before and its run after the sweep."""
    best_rows = []
    for first, second in zip(before, after, strict=True):
        best = max(first, second, key=lambda r: r.throughput)
        best.note += (
            f" (best of 2 runs: {first.throughput:,.1f} before, {second.throughput:,.1f} "
            "after the sweep)"
        )
        best_rows.append(best)
    return best_rows


def _measure(settings: BenchSettings) -> _Measured:
    """Start the servers, check each target answers, and run the sweep between two raw runs."""
    configs = list(settings.configs)
    images = image_tensors()
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
        repo = workdir / "repository"
        entry, nobatch = prepare_repository(settings, repo)
        input_name, output_name = tensor_names(repo, entry)
        instances = sum(
            group.count for group in read_config(repo / entry / "config.pbtxt").instance_group
        )
        tested = _Tested(entry, nobatch, images, input_name, output_name)
        load_configs = [c for c in configs if c != "raw"]
        load = _start_load(settings, load_configs, stack, workdir, tested) if load_configs else None
        targets = load.targets if load is not None else {}
        sanity = {name: first_top1(target, output_name) for name, target in targets.items()}
        # measured before and after the load sweep; the ceiling is the better run
        raw_before = raw_ceiling(settings, repo, entry, images) if "raw" in configs else []
        results, splits = _sweep(settings, load) if load is not None else ([], [])
        if "raw" in configs:
            results += _best_raw(raw_before, raw_ceiling(settings, repo, entry, images))
    clients = load.clients if load is not None else {}
    return _Measured(entry, instances, clients, sanity, results, splits)


def _report(
    settings: BenchSettings, machine: dict[str, Any], measured: _Measured
) -> dict[str, Any]:
    """Print the tables, save the plot and write ``bench.json``; returns the JSON document."""
    results, splits = measured.results, measured.splits
    settings_line = _settings_line(settings, measured.entry, measured.clients, measured.instances)
    ratios = compute_ratios(results, settings.concurrency)
    print_report(results, ratios, machine, settings_line)
    if splits:
        from rich.console import Console

        Console(width=160).print(gateway_table(splits))
    png = save_plot(results, ratios, machine, settings_line, settings.out_dir / "bench.png")
    document = {
        "settings": settings_record(asdict(settings)),
        "settings_line": settings_line,
        "command": " ".join([Path(sys.executable).name, "-m", "loadtest.bench", *sys.argv[1:]])
        if sys.argv
        else "",
        "machine": machine,
        "model_entry": measured.entry,
        "clients": measured.clients,
        "sanity_top1": measured.sanity,
        "results": [asdict(r) for r in results],
        "ratios": ratios,
        "gateway_split": splits,
        "files": {"json": str(settings.out_dir / "bench.json"), "png": str(png)},
    }
    (settings.out_dir / "bench.json").write_text(
        json.dumps(document, indent=2, default=float) + "\n", encoding="utf-8"
    )
    return document


def run_bench(settings: BenchSettings) -> dict[str, Any]:
    """Run every configured configuration side by side and write ``bench.json`` / ``bench.png``.

    Returns:
        The JSON document (settings, machine, results, ratios, files).

    Raises:
        ValueError: an unknown configuration.
        serving.processes.ProcessStartError, RuntimeError, ImportError: a configuration could not run.
    """
    unknown = [c for c in settings.configs if c not in ALL_CONFIGS]
    if unknown:
        raise ValueError(
            f"unknown configuration(s) {', '.join(unknown)}; known: {', '.join(ALL_CONFIGS)}"
        )
    settings.out_dir.mkdir(parents=True, exist_ok=True)
    machine = machine_description()
    return _report(settings, machine, _measure(settings))
