"""The GPU benchmark's setup: the repository it serves and the serving sweep (what Model Analyzer does).

- :func:`prepare_repository`: the TorchScript classifier (``KIND_GPU``, FP16, CUDA graphs), its twin
  with dynamic batching off, ``image_classifier_gpu`` and, on request, a compiled flavour
  (``builders/compiled.py``: inductor or aoti).
- :func:`sweep`: each candidate configuration (instance count, queue delay, preferred batch sizes) of
  a served entry is loaded through Triton's model-control API and measured with the load generator;
  the best throughput with P99 within budget is kept, loaded, and written into the entry's build report.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadtest.bench.report import machine_description
from loadtest.loadgen import LoadSpec, Target, TritonTarget, run_load
from serving.launcher import TritonServer
from serving.triton_clients import triton_client

if TYPE_CHECKING:
    from loadtest.bench.gpu_settings import GpuBenchSettings

__all__ = [
    "NOBATCH",
    "P99_BUDGET_MS",
    "PIPELINE",
    "PIPELINE_COMPILED",
    "PIPELINE_COMPILED_OVERLAP",
    "PIPELINE_OVERLAP",
    "TENSOR",
    "Clock",
    "compiled_entry",
    "compiled_file",
    "latest",
    "parse_points",
    "prepare_repository",
    "sweep",
    "unavailable",
]

TENSOR = "efficientnet_lite0_torchscript"
NOBATCH = TENSOR + "_nobatch"
PIPELINE = "image_classifier_gpu"
PIPELINE_COMPILED = PIPELINE + "_compiled"
#: the same entries answered the overlapped way (image_classifier_gpu's ``overlap`` parameter)
PIPELINE_OVERLAP = PIPELINE + "_overlap"
PIPELINE_COMPILED_OVERLAP = PIPELINE_COMPILED + "_overlap"
P99_BUDGET_MS = 20.0


class Clock:
    """The run's time budget: what is left, and whether a step of ``cost`` seconds still fits."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s, self.started = budget_s, time.perf_counter()

    def left(self) -> float:
        return (
            self.budget_s - (time.perf_counter() - self.started) if self.budget_s else float("inf")
        )

    def fits(self, cost: float, reserve: float = 0.0) -> bool:
        return self.left() - reserve >= cost


def parse_points(text: str) -> dict[str, tuple[int, ...]]:
    """``"jpeg=64,32;tensor http=32"``: each configuration's concurrencies, in the order given.

    Raises:
        ValueError: a configuration named twice (its second list would silently replace the first).
    """
    points: dict[str, tuple[int, ...]] = {}
    for part in filter(str.strip, text.split(";")):
        name, _, levels = (s.strip() for s in part.partition("="))
        if name in points:
            raise ValueError(
                f"{name!r} is named twice: give its concurrencies once, comma separated"
            )
        points[name] = tuple(int(c) for c in levels.split(","))
    return points


def unavailable(name: str, settings: GpuBenchSettings) -> str:
    if "cuda" in name and settings.device != "cuda":
        return "CUDA shared memory needs a GPU"
    if "compiled" in name:
        return (
            "no compiled entry in this run (--compiled none, or its build failed: see "
            "build.compiled_error)"
        )
    return "no such configuration (see GpuBenchSettings.points)"


def _log(message: str) -> None:
    print(f"[gpu-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------- repository


def prepare_repository(root: Path, settings: GpuBenchSettings) -> dict[str, Any]:
    """Build every entry the run serves into ``root``; returns what was built (and what was not, why)."""
    from builders.pipeline import BuildOptions, build
    from builders.spec import BatchingPolicy
    from builders.torchscript import TorchScriptOptions, build_torchscript
    from builders.triton_config import read_config, write_config

    built: dict[str, Any] = {}
    gpu = settings.device == "cuda"
    policy = BatchingPolicy(
        max_batch_size=256 if gpu else 16,
        preferred_batch_sizes=(64, 128, 256) if gpu else (),
        max_queue_delay_us=1000,
        instance_count=settings.tensor_instances if gpu else None,
    )
    build_torchscript(
        root, "efficientnet_lite0", TorchScriptOptions(gpu=gpu, precision="fp16", batching=policy)
    )
    config = read_config(root / TENSOR / "config.pbtxt")
    config.name = NOBATCH
    config.ClearField("dynamic_batching")
    config.parameters["batch_sizes"].string_value = "1,2,4,8"  # one request per execution: batch 1
    shutil.copytree(root / TENSOR, root / NOBATCH)
    write_config(config, root / NOBATCH / "config.pbtxt")
    build([PIPELINE], BuildOptions(repository=root, variants=False))
    if not gpu:  # the same model files on the CPU
        config = read_config(root / PIPELINE / "config.pbtxt")
        config.instance_group[0].kind = config.instance_group[0].KIND_CPU
        config.max_batch_size = 16
        del config.dynamic_batching.preferred_batch_size[:]
        write_config(config, root / PIPELINE / "config.pbtxt")
    built["entries"] = [TENSOR, NOBATCH, PIPELINE]
    _overlapped_twin(root, PIPELINE, PIPELINE_OVERLAP)
    built["entries"].append(PIPELINE_OVERLAP)
    if settings.compiled:
        from builders.compiled import CompiledFlavour, publish_compiled

        started = time.perf_counter()
        try:
            compiled = CompiledFlavour(
                "efficientnet_lite0",
                settings.compiled,
                settings.device,
                max_batch=policy.max_batch_size,
                batching=policy,
            )
            publish_compiled(root, compiled)
            built["entries"].append(compiled_entry(settings.compiled))
            built["compiled_build_s"] = time.perf_counter() - started
            # The pipeline on the compiled classifier.
            config = read_config(root / PIPELINE / "config.pbtxt")
            config.name = PIPELINE_COMPILED
            config.parameters["classifier"].string_value = compiled_entry(settings.compiled)
            shutil.copytree(root / PIPELINE, root / PIPELINE_COMPILED)
            write_config(config, root / PIPELINE_COMPILED / "config.pbtxt")
            built["entries"].append(PIPELINE_COMPILED)
            _overlapped_twin(root, PIPELINE_COMPILED, PIPELINE_COMPILED_OVERLAP)
            built["entries"].append(PIPELINE_COMPILED_OVERLAP)
        except Exception as exc:  # reported in the table and the JSON, never silently
            built["compiled_error"] = f"{type(exc).__name__}: {exc}"[:2000]
            _log(f"the {settings.compiled} build failed: {built['compiled_error'][:300]}")
    return built


def _overlapped_twin(root: Path, name: str, twin: str) -> None:
    """``twin``: a copy of the pipeline entry ``name`` that answers the overlapped way, so both ways
    are measured in one run."""
    from builders.triton_config import read_config, write_config

    config = read_config(root / name / "config.pbtxt")
    config.name = twin
    config.parameters["overlap"].string_value = "true"
    shutil.copytree(root / name, root / twin)
    write_config(config, root / twin / "config.pbtxt")


def compiled_entry(flavour: str) -> str:
    """The name of the classifier's compiled entry of ``flavour`` (``builders/compiled.py``)."""
    return f"efficientnet_lite0_{flavour}"


def compiled_file(root: Path, flavour: str) -> Path:
    """The file the newest version of the compiled entry of ``flavour`` serves."""
    from builders.compiled import FLAVOURS

    return latest(root, compiled_entry(flavour)) / FLAVOURS[flavour]


def latest(root: Path, name: str) -> Path:
    return max(
        (p for p in (root / name).iterdir() if p.is_dir() and p.name.isdigit()),
        key=lambda p: int(p.name),
    )


# ----------------------------------------------------------------------------------- sweep


def _candidates(name: str, base: dict[str, Any], quick: bool) -> list[dict[str, Any]]:
    """The entry as built first (it is loaded already: measured without a reload), then alternatives,
    most promising first: a budgeted run measures as many as fit."""
    batching = base.get("dynamic_batching", {})
    delay = int(batching.get("max_queue_delay_microseconds", 0))
    preferred = [int(s) for s in batching.get("preferred_batch_size", [])]
    count = int(base["instance_group"][0].get("count", 1))
    built = {
        "instances": count,
        "max_queue_delay_us": delay,
        "preferred_batch_sizes": preferred,
        "queue_policies": True,
    }
    # Choosable candidates first, so that a budgeted run decides among them: more processes than
    # built (two by default; one instance runs Triton's input step, the model and the output step of
    # a batch one after another: 35 ms a batch for the tensor entry at 256 in flight, H200 run 11,
    # with the GPU at a third of its ceiling), then whole queues as one batch. Then what the
    # platform's queue policies cost (they turn off the batcher's payload prefetching, see
    # builders.triton_config.model_config): measured, never chosen (they bound the queues and carry
    # the tiers). Last, one process.
    grid: list[tuple[int, int, list[int], bool]] = [
        (count + 1, delay, preferred, True),
        (count + 2, delay, preferred, True),
        (count, 2000 if name.startswith(PIPELINE) else 500, [], True),
        (count, delay, preferred, False),
        (1, delay, preferred, True),
    ]
    alternatives = [
        {"instances": i, "max_queue_delay_us": d, "preferred_batch_sizes": p, "queue_policies": q}
        for i, d, p, q in grid
    ]
    return [built] + [a for a in alternatives if a != built][: 1 if quick else None]


def _load_variant(client: Any, name: str, base: dict[str, Any], candidate: dict[str, Any]) -> None:
    config = json.loads(json.dumps(base))
    config["instance_group"][0]["count"] = candidate["instances"]
    batching = config.setdefault("dynamic_batching", {})
    batching["max_queue_delay_microseconds"] = candidate["max_queue_delay_us"]
    batching["preferred_batch_size"] = [
        s for s in candidate["preferred_batch_sizes"] if s <= int(config["max_batch_size"])
    ]
    if not candidate.get("queue_policies", True):
        for key in (
            "priority_levels",
            "default_priority_level",
            "default_queue_policy",
            "priority_queue_policy",
        ):
            batching.pop(key, None)
    client.load_model(name, config=json.dumps(config))


def _until_answering(target: Target, limit_s: float = 90.0) -> None:
    """Send one request at a time until one is answered (at most ``limit_s``)."""
    deadline = time.perf_counter() + limit_s
    while time.perf_counter() < deadline:
        probe = run_load(
            LoadSpec(
                target=target, concurrency=1, duration_s=1.0, warmup_s=0.0, name="first answer"
            ),
            1,
        )
        if probe.throughput or probe.errors:
            return


def sweep(
    triton: TritonServer,
    root: Path,
    target: TritonTarget,
    settings: GpuBenchSettings,
    concurrency: int,
    fits: Callable[[float], bool] = lambda cost: True,
) -> dict[str, Any]:
    """Measure each candidate configuration of ``target``'s entry (its model) at ``concurrency``;
    load the best and record it.

    ``fits(seconds)`` says whether a step of that many seconds fits the run's budget: a candidate
    that would not fit is listed as not measured; the rest of the sweep still decides among the others.
    """

    name = target.model
    client = triton_client(triton.http_url, network_timeout=600, connection_timeout=600)
    base = client.get_model_config(name)
    measure_s = (
        2 * settings.warmup_s + settings.capacity_s + 2.0
    )  # with the load generator's process start
    rows: list[dict[str, Any]] = []
    loaded: dict[str, Any] | None = None  # the candidate Triton serves now (None: the built config)
    load_s = 0.0
    for index, candidate in enumerate(_candidates(name, base, settings.quick)):
        # The first candidate is the loaded config; another costs a load, estimated by the last one.
        cost = measure_s + (0.0 if index == 0 else max(load_s, 15.0))
        if not fits(cost):
            rows.append(
                {**candidate, "measured": False, "reason": "the run's time budget would be spent"}
            )
            _log(f"sweep {name}: {candidate} not measured (budget)")
            continue
        _log(f"sweep {name}: {candidate}")
        if index:
            started = time.perf_counter()
            _load_variant(client, name, base, candidate)
            load_s = time.perf_counter() - started
            loaded = candidate
            # A reloaded entry's first requests wait for its lazy start (nvJPEG, allocator): measured
            # at once, one run answered nothing in the window and showed 0/s without an error.
            _until_answering(target)
        result = run_load(
            LoadSpec(
                target=target,
                concurrency=concurrency,
                duration_s=settings.capacity_s,
                warmup_s=settings.warmup_s,
                name=f"sweep {name}",
            ),
            settings.clients,
        )
        rows.append(
            {
                **candidate,
                "measured": True,
                "throughput": result.throughput,
                "p99_ms": result.p99_ms,
                "errors": result.errors,
                "load_s": load_s if index else 0.0,
            }
        )
        if not result.throughput and not result.errors:
            rows[-1]["reason"] = "no answer within the measured window (and no error)"
        _log(
            f"  {result.throughput:,.0f}/s, P99 {result.p99_ms:.1f} ms"
            + (f" (loaded in {load_s:.0f} s)" if index else "")
        )
    measured = [r for r in rows if r["measured"]]
    choosable = [r for r in measured if r["queue_policies"]]
    ok = [r for r in choosable if r["errors"] == 0 and r["p99_ms"] <= P99_BUDGET_MS]
    # Nothing measured (no time left): the entry stays as built, and the report says so.
    best = max(
        ok or [r for r in choosable if r["errors"] == 0] or choosable or rows[:1],
        key=lambda r: r.get("throughput", 0.0),
    )
    chosen = {
        k: best[k]
        for k in ("instances", "max_queue_delay_us", "preferred_batch_sizes", "queue_policies")
    }
    if loaded is not None and chosen != {k: loaded[k] for k in chosen}:
        _load_variant(client, name, base, chosen)  # what the load points then measure
    client.close()
    choice = {
        "entry": name,
        "concurrency": concurrency,
        "rule": f"highest throughput with P99 <= {P99_BUDGET_MS:g} ms "
        "(else highest throughput), queue policies kept",
        "chosen": chosen,
        "candidates": rows,
    }
    report_path = latest(root, name) / "build_report.json"
    report = json.loads(report_path.read_text(encoding="utf-8"))
    report.setdefault("notes", []).append(
        f"serving sweep on {machine_description().get('gpu', 'this GPU')}: "
        f"{json.dumps(choice['chosen'])} ({choice['rule']}, concurrency {concurrency}, "
        f"{len(measured)} of {len(rows)} candidates measured)"
    )
    report["sweep"] = choice
    report_path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return choice
