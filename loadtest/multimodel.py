"""Many models, one Triton instance, a memory budget: what load on demand costs, measured.

``python -m loadtest.multimodel`` (or ``inferctl bench multimodel``):

1. writes ``--models`` classifier variants (the same small ONNX MLP, different random weights),
   configured as the builders configure every model, and starts the real Triton binary with none
   of them loaded;
2. calibrates: loads one variant directly, reads the tritonserver process tree's memory before and
   after (the meter the gateway uses, :mod:`gateway.backends.residency_memory`), unloads it; the budget is
   ``--budget-models`` such footprints (plus 10% for the meter's noise);
3. **on demand**: a gateway with that budget (:mod:`gateway.backends.residency`), Zipf-distributed traffic
   (``s`` = ``--zipf-s``, the most popular variant first) at ``--concurrency`` for ``--duration``
   seconds through the platform's load generator, while the meter is sampled every 0.25 s;
4. **all loaded**: every variant loaded, a gateway with residency off, the same traffic.

A request is a *hit* when the gateway did not have to wait for a load (its ``Server-Timing`` has
no ``load`` stage, :mod:`loadtest.loadgen.mix`). The figures: hit rate; the cold requests' latency
(P50/P99: what a request that found its model unloaded waited, load included); the P99 of hits
beside the P99 of the same traffic with every model loaded; and the most the sampled memory went
above baseline + budget. ``multimodel.json`` holds exactly the figures the issue asks for,
``multimodel-detail.json`` the rest, ``multimodel.png`` the plot. Measured, never asserted: the
machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.loadgen import closed_loop
from loadtest.loadgen.mix import ModelMixTarget
from loadtest.loadgen.samples import Samples
from loadtest.local_gateway import local_gateway
from loadtest.multimodel_report import (
    MemoryRecord,
    load_figures,
    report_table,
    scrape_metrics,
    write_report,
)
from loadtest.options import (
    FieldOption,
    add_field_options,
    add_run_time_arguments,
    settings_from_options,
)
from serving.console import print_table
from serving.launcher import TritonPorts, TritonServer

__all__ = [
    "DEFAULT_SETTINGS",
    "MultiModelSettings",
    "build_parser",
    "run",
    "run_multimodel",
    "zipf_sequence",
]

FEATURES = 64
CLASSES = 10
_SAMPLE_S = 0.25
_MARGIN = 1.10  # the budget over budget_models footprints: the meter's noise, not a whole model


@dataclass(frozen=True, kw_only=True)
class MultiModelSettings:
    """What the benchmark runs (the issue's full scale: 20 models, a budget of 5, 60 s)."""

    models: int = 20
    budget_models: int = 5
    concurrency: int = 8
    duration_s: float = 60.0
    warmup_s: float = 10.0
    zipf_s: float = 1.1
    hidden: int = 256
    seed: int = 0
    device: str = "cpu"
    concurrent_loads: int = 1
    out_dir: Path = Path("multimodel-results")


DEFAULT_SETTINGS = MultiModelSettings()


def variant(index: int) -> str:
    return f"classifier_v{index:02d}"


def zipf_sequence(models: Sequence[str], s: float, length: int, seed: int) -> tuple[str, ...]:
    """``length`` draws from ``models`` with P(rank k) proportional to 1 / k^s (the first is rank 1)."""
    weights = 1.0 / np.arange(1, len(models) + 1, dtype=np.float64) ** s
    draws = np.random.default_rng(seed).choice(len(models), size=length, p=weights / weights.sum())
    return tuple(models[int(k)] for k in draws)


def build_variants(root: Path, settings: MultiModelSettings) -> list[str]:
    """Write the classifier variants (same graph, weights from ``seed + index``) into ``root``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from builders.spec import BatchingPolicy, TensorSpec
    from builders.triton_config import ConfigOptions, model_config, write_config

    names = []
    for index in range(settings.models):
        rng = np.random.default_rng(settings.seed + index)
        w1 = rng.normal(0, 0.1, (FEATURES, settings.hidden)).astype(np.float32)
        w2 = rng.normal(0, 0.1, (settings.hidden, CLASSES)).astype(np.float32)
        graph = helper.make_graph(
            [
                helper.make_node("MatMul", ["input", "W1"], ["h"]),
                helper.make_node("Relu", ["h"], ["r"]),
                helper.make_node("MatMul", ["r", "W2"], ["logits"]),
            ],
            "classifier",
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", FEATURES])],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CLASSES])],
            initializer=[numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        name = variant(index)
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(root / name / "1" / "model.onnx"))
        config = model_config(
            name,
            inputs=[TensorSpec("input", "float32", (FEATURES,))],
            outputs=[TensorSpec("logits", "float32", (CLASSES,))],
            batching=BatchingPolicy(max_batch_size=8, max_queue_delay_us=100, instance_count=1),
            options=ConfigOptions(
                platform="onnxruntime_onnx",
                parameters={"intra_op_thread_count": "1", "inter_op_thread_count": "1"},
                warmup=False,
            ),
        )
        write_config(config, root / name / "config.pbtxt")
        names.append(name)
    return names


@contextlib.contextmanager
def gateway(
    triton_http_url: str, workdir: Path, env: dict[str, str]
) -> Iterator[tuple[str, str, str]]:
    """A real gateway (``env`` adds its settings) with one unlimited key; yields ``(base URL, api key,
    admin token)``."""
    with local_gateway(
        triton_http_url,
        workdir,
        tiers={"unlimited": {"per_minute": 1e9, "burst": 1_000_000}},
        key_names={"unlimited": "multimodel"},
        env=env,
    ) as started:
        yield started.url, started.keys["unlimited"], started.admin_token


async def _drive(
    base_url: str, key: str, sequence: tuple[str, ...], settings: MultiModelSettings, meter: Any
) -> tuple[Samples, list[tuple[float, int]]]:
    """The Zipf traffic through the gateway, with the meter sampled meanwhile."""
    body = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": [1, FEATURES],
                    "datatype": "FP32",
                    "data": [0.5] * FEATURES,
                }
            ]
        }
    ).encode()
    target = ModelMixTarget(
        base_url=base_url, sequence=sequence, body=body, headers={"Authorization": f"Bearer {key}"}
    )
    samples: list[tuple[float, int]] = []
    done = asyncio.Event()
    started = time.monotonic()

    async def sample() -> None:
        while not done.is_set():
            samples.append((time.monotonic() - started, await meter.used_bytes()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), _SAMPLE_S)

    sampler = asyncio.create_task(sample())
    try:
        result = await closed_loop(
            target,
            concurrency=settings.concurrency,
            duration_s=settings.duration_s,
            warmup_s=settings.warmup_s,
        )
    finally:
        done.set()
        await sampler
    return result, samples


def run_multimodel(settings: MultiModelSettings) -> dict[str, Any]:
    """Run both phases; write the JSON documents and the plot to ``settings.out_dir``."""
    from gateway.backends.residency_memory import GpuMetricsMeter, MemoryMeter, ProcessTreeMeter
    from gateway.backends.residency_triton import TritonRepository
    from loadtest.multimodel_gpu import (
        build_torchscript_variants,
        profile_stub_start,
        require_cuda,
    )

    device = require_cuda() if settings.device == "gpu" else "cpu"
    settings.out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="multimodel-") as tmp:
        root = Path(tmp)
        if settings.device == "gpu":
            names = build_torchscript_variants(
                root / "repository",
                [variant(index) for index in range(settings.models)],
                seed=settings.seed,
                features=FEATURES,
                classes=CLASSES,
            )
        else:
            names = build_variants(root / "repository", settings)
        sequence = zipf_sequence(names, settings.zipf_s, 50_000, settings.seed)
        with TritonServer(
            root / "repository",
            models=[],
            ports=TritonPorts.free(),
            gpu_metrics=settings.device == "gpu",
        ) as triton:
            assert triton.pid is not None
            meter: MemoryMeter = (
                GpuMetricsMeter(triton.metrics_url)
                if settings.device == "gpu"
                else ProcessTreeMeter(triton.pid)
            )

            async def calibrate() -> tuple[int, int]:
                repository = TritonRepository(triton.http_url, 300)
                try:
                    before = await meter.used_bytes()
                    await repository.load(names[0])
                    footprint = await meter.used_bytes() - before
                    if footprint <= 0:
                        raise SystemExit(
                            f"the {settings.device} meter saw no memory taken by {names[0]!r} "
                            f"(before {before} bytes): without a footprint there is no budget"
                        )
                    await repository.unload(names[0])
                    return await meter.used_bytes(), footprint
                finally:
                    await repository.close()

            baseline, footprint = asyncio.run(calibrate())

            async def loads_alone() -> list[float]:
                """Triton's load time with nothing else running: the next variants, one by one."""
                repository = TritonRepository(triton.http_url, 300)
                seconds = []
                try:
                    for name in names[1:4]:
                        started = time.perf_counter()
                        await repository.load(name)
                        seconds.append(round(time.perf_counter() - started, 3))
                        await repository.unload(name)
                finally:
                    await repository.close()
                return seconds

            alone = asyncio.run(loads_alone())
            budget = int(settings.budget_models * footprint * _MARGIN)
            env = {
                "GATEWAY_RESIDENCY_BUDGET_BYTES": str(budget),
                "GATEWAY_RESIDENCY_TRITON_PID": str(triton.pid),
                "GATEWAY_RESIDENCY_DEFAULT_ESTIMATE_BYTES": str(footprint),
                "GATEWAY_RESIDENCY_FOOTPRINTS_PATH": str(root / "footprints.json"),
                "GATEWAY_RESIDENCY_MAX_CONCURRENT_LOADS": str(settings.concurrent_loads),
            }
            if settings.device == "gpu":
                env |= {
                    "GATEWAY_RESIDENCY_MEMORY": "gpu",
                    "GATEWAY_RESIDENCY_METRICS_URL": triton.metrics_url,
                }
            with gateway(triton.http_url, root / "on-demand", env) as (url, key, admin):
                on_demand, memory = asyncio.run(_drive(url, key, sequence, settings, meter))
                loads = load_figures(scrape_metrics(url, admin))
            loads["load_alone_s"] = alone
            if settings.device == "gpu":
                loads["stub_start_s"] = profile_stub_start(
                    root / "repository" / names[-1], FEATURES
                )

            async def load_all() -> None:
                repository = TritonRepository(triton.http_url, 300)
                try:
                    for name in names:
                        await repository.load(name)
                finally:
                    await repository.close()

            asyncio.run(load_all())
            with gateway(triton.http_url, root / "all-loaded", {}) as (url, key, _):
                all_loaded, _ = asyncio.run(_drive(url, key, sequence, settings, meter))
    return write_report(
        asdict(settings),
        on_demand,
        all_loaded,
        loads,
        MemoryRecord(baseline, budget, footprint, memory),
        device=device,
    )


_SIZE_OPTIONS: tuple[FieldOption, ...] = (
    ("--models", int, "classifier variants"),
    ("--budget-models", int, "how many fit the budget"),
    ("--concurrency", int, "requests in flight"),
)
_TRAFFIC_OPTIONS: tuple[FieldOption, ...] = (
    ("--zipf-s", float, "Zipf exponent of the traffic"),
    ("--seed", int, "weights and traffic seed"),
)
_LOAD_OPTIONS: tuple[FieldOption, ...] = (
    (
        "--concurrent-loads",
        int,
        "the gateway's GATEWAY_RESIDENCY_MAX_CONCURRENT_LOADS (Triton loads at once)",
    ),
)


def build_parser() -> argparse.ArgumentParser:
    d = DEFAULT_SETTINGS
    parser = argparse.ArgumentParser(
        description="Many models under a memory budget: hit rate, cold-load P50/P99 and the P99 of loaded "
        "models beside the same Zipf traffic with every model loaded, memory sampled against the budget "
        "(real Triton, real gateway, the platform's load generator). Prints a table, writes multimodel.json, "
        "multimodel-detail.json and multimodel.png.",
    )
    add_field_options(parser, d, _SIZE_OPTIONS)
    add_run_time_arguments(parser, duration_s=d.duration_s, warmup_s=d.warmup_s, per="phase")
    add_field_options(parser, d, _TRAFFIC_OPTIONS)
    parser.add_argument(
        "--device",
        choices=("cpu", "gpu"),
        default=d.device,
        help="cpu: ONNX variants, process-tree meter; gpu: TorchScript KIND_GPU variants, Triton's GPU meter",
    )
    add_field_options(parser, d, _LOAD_OPTIONS)
    parser.add_argument("--out", type=Path, default=d.out_dir, help="folder for the results")
    return parser


def run(args: argparse.Namespace) -> int:
    """``inferctl bench multimodel``: the parsed options in, the exit status out."""
    if not 1 <= args.budget_models < args.models:
        raise SystemExit("--budget-models must be at least 1 and fewer than --models")
    settings = settings_from_options(
        DEFAULT_SETTINGS,
        args,
        _SIZE_OPTIONS + _TRAFFIC_OPTIONS + _LOAD_OPTIONS,
        device=args.device,
        out_dir=args.out,
    )
    detail = run_multimodel(settings)
    print_table(report_table(detail))
    print(f"wrote {settings.out_dir / 'multimodel.json'} and {settings.out_dir / 'multimodel.png'}")
    return 0


if __name__ == "__main__":
    from loadtest.registry import run_named

    raise SystemExit(run_named("multimodel"))
