"""The side-by-side benchmark: one invocation, one machine, the same model and the same offered load.

    python -m loadtest.bench                      # CPU: the full sweep (a few minutes)
    python -m loadtest.bench --quick              # a few seconds per configuration (the smoke test)
    python -m loadtest.bench --device cuda        # GPU: TorchScript FP16 through the pytorch backend

Configurations (all receive identical requests: one real photograph as an FP32 [1, 3, 224, 224]
tensor per request, from a closed-loop async HTTP load generator at a fixed concurrency):

- ``triton-batching``: Triton, dynamic batching on (the entry as the builders publish it);
- ``triton-no-batching``: the same model file, the entry's config copied with ``dynamic_batching``
  cleared (through the ``ModelConfig`` schema), so Triton runs one request per execution;
- ``gateway``: the FastAPI gateway in front of ``triton-batching`` (API key, KServe v2 passthrough);
- ``naive``: :mod:`loadtest.naive_server`, FastAPI + PyTorch eager, one forward per request;
- ``raw``: the runtime with no server at its best batch (ONNX Runtime on CPU, TorchScript on CUDA):
  the ceiling that gives the platform's efficiency ratio. Its throughput counts images per second.

Thread settings are the same everywhere: ONNX Runtime and PyTorch use their default intra-op
thread count (the physical cores) and one inter-op thread; one Triton model instance; one naive
server worker. Results: a table on stdout, ``bench.json``, ``bench.png`` (latency against
throughput, with the machine and the settings) in ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.payloads import V2Request, image_tensors, v2_binary_request, v2_output

__all__ = [
    "ALL_CONFIGS",
    "BenchSettings",
    "Result",
    "closed_loop",
    "machine_description",
    "main",
    "run_bench",
]

ALL_CONFIGS: tuple[str, ...] = ("triton-batching", "triton-no-batching", "gateway", "naive", "raw")
DEFAULT_MODEL = "efficientnet_lite0"
DEFAULT_OUT = Path("reports/bench")
DEFAULT_BUILD_REPOSITORY = Path(".build/bench-repository")
NOBATCH_SUFFIX = "_nobatch"
_BENCH_TIER = "loadtest-bench"


@dataclass(frozen=True, kw_only=True)
class BenchSettings:
    """What one benchmark run does.

    Args:
        device: ``cpu`` (ONNX entry through the onnxruntime backend) or ``cuda`` (TorchScript entry
            through the pytorch backend, FP16, ``KIND_GPU``).
        concurrency: closed-loop in-flight requests, one sweep point each.
        duration_s / warmup_s: measured window and the unmeasured lead-in of each point.
        raw_batches: batch sizes tried for the raw runtime; the best is the ceiling.
        configs: which of :data:`ALL_CONFIGS` to run.
        repository: a model repository holding the model entry; built into
            ``.build/bench-repository`` when ``None``.
        clients: load-generator processes (their concurrency adds up); 1 is in process.
    """

    device: str = "cpu"
    model: str = DEFAULT_MODEL
    concurrency: tuple[int, ...] = (1, 8, 32)
    duration_s: float = 10.0
    warmup_s: float = 2.0
    raw_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    configs: tuple[str, ...] = ALL_CONFIGS
    repository: Path | None = None
    out_dir: Path = DEFAULT_OUT
    clients: int = 1
    quick: bool = False

    @classmethod
    def quick_settings(cls, **overrides: Any) -> BenchSettings:
        """A few seconds per configuration: proves the machinery, measures nothing."""
        base = dict(concurrency=(1, 4), duration_s=1.5, warmup_s=0.5, raw_batches=(1, 8), quick=True)
        base.update(overrides)
        return cls(**base)


@dataclass
class Result:
    """One sweep point of one configuration."""

    config: str
    concurrency: int
    requests: int
    errors: int
    duration_s: float
    throughput: float  # requests/s (raw: images/s)
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    batch: int = 1
    note: str = ""

    @property
    def error_rate(self) -> float:
        total = self.requests + self.errors
        return self.errors / total if total else 0.0


@dataclass
class _Target:
    name: str
    url: str
    request: list[V2Request]  # round-robin over the sample images
    headers: dict[str, str] = field(default_factory=dict)
    kind: str = "v2"  # "v2" (KServe binary) or "raw" (naive server: FP32 bytes)


# --------------------------------------------------------------------------- load generation


def _summarise(name: str, concurrency: int, latencies: np.ndarray, errors: int, window: float, note: str = "") -> Result:
    lat = latencies * 1000.0
    pct = np.percentile(lat, [50, 95, 99]) if lat.size else np.array([np.nan] * 3)
    return Result(
        config=name, concurrency=concurrency, requests=int(lat.size), errors=errors, duration_s=window,
        throughput=lat.size / window if window > 0 else 0.0, p50_ms=float(pct[0]), p95_ms=float(pct[1]),
        p99_ms=float(pct[2]), mean_ms=float(lat.mean()) if lat.size else float("nan"), note=note,
    )


async def _closed_loop_async(
    url: str, bodies: list[tuple[bytes, dict[str, str]]], concurrency: int, warmup_s: float, duration_s: float
) -> tuple[np.ndarray, int]:
    import aiohttp

    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=120)
    start = time.perf_counter()
    measure_from, stop_at = start + warmup_s, start + warmup_s + duration_s

    async def worker(offset: int) -> None:
        nonlocal errors
        i = offset
        while True:
            t0 = time.perf_counter()
            if t0 >= stop_at:
                return
            body, headers = bodies[i % len(bodies)]
            i += 1
            ok = False
            try:
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    ok = response.status == 200
            except (TimeoutError, aiohttp.ClientError, OSError):
                ok = False
            t1 = time.perf_counter()
            if measure_from <= t1 <= stop_at:
                if ok:
                    latencies.append(t1 - t0)
                else:
                    errors += 1
            if not ok:
                await asyncio.sleep(0.01)  # a refused connection must not become a busy loop

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(worker(k) for k in range(concurrency)))
    return np.asarray(latencies, dtype=np.float64), errors


def _closed_loop_process(args: tuple[str, list[tuple[bytes, dict[str, str]]], int, float, float, float]) -> tuple[np.ndarray, int]:
    url, bodies, concurrency, warmup_s, duration_s, start_wall = args
    time.sleep(max(0.0, start_wall - time.time()))  # every client process starts its clock together
    return asyncio.run(_closed_loop_async(url, bodies, concurrency, warmup_s, duration_s))


def closed_loop(target: _Target, concurrency: int, warmup_s: float, duration_s: float, clients: int = 1) -> Result:
    """Drive ``target`` with ``concurrency`` requests always in flight; latency of each completed one.

    Only requests that complete inside the measured window count, so the throughput is completions
    per second of that window and the tail is not cut short by the end of the run.
    """
    bodies = [(r.body, {**r.headers, **target.headers}) for r in target.request]
    clients = max(1, min(clients, concurrency))
    if clients == 1:
        latencies, errors = asyncio.run(_closed_loop_async(target.url, bodies, concurrency, warmup_s, duration_s))
    else:
        import multiprocessing

        shares = [concurrency // clients + (1 if k < concurrency % clients else 0) for k in range(clients)]
        start_wall = time.time() + 2.0
        with multiprocessing.get_context("spawn").Pool(clients) as pool:
            parts = pool.map(_closed_loop_process, [(target.url, bodies, s, warmup_s, duration_s, start_wall) for s in shares])
        latencies = np.concatenate([p[0] for p in parts])
        errors = sum(p[1] for p in parts)
    return _summarise(target.name, concurrency, latencies, errors, duration_s)


# --------------------------------------------------------------------------- servers


def _wait_http(url: str, timeout_s: float, process: subprocess.Popen[bytes] | None = None, expect: bytes = b"") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with code {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200 and expect in response.read():
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} was not ready after {timeout_s:.0f} s")


def _wait_logged(url: str, timeout_s: float, process: subprocess.Popen[bytes], log: Path, expect: bytes = b"") -> None:
    try:
        _wait_http(url, timeout_s, process, expect)
    except RuntimeError as exc:
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        raise RuntimeError(f"{exc}\n--- {log.name} ---\n{tail}") from None


@contextlib.contextmanager
def _subprocess(cmd: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


@contextlib.contextmanager
def naive_server(device: str, precision: str, workdir: Path, model: str = DEFAULT_MODEL) -> Iterator[str]:
    """Start :mod:`loadtest.naive_server` on a free port; yields its base URL."""
    from serving.launcher import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "loadtest.naive_server", "--host", "127.0.0.1", "--port", str(port),
           "--model", model, "--device", device, "--precision", precision]
    log = workdir / "naive_server.log"
    with _subprocess(cmd, _child_env(), log) as process:
        _wait_logged(f"http://127.0.0.1:{port}/healthz", 300, process, log, expect=b'"ok"')
        yield f"http://127.0.0.1:{port}"


def gateway_available() -> bool:
    """Whether the gateway package (and its dependencies) can run here."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401

        from gateway.app import create_app  # noqa: F401
        from gateway.keys import KeyStore  # noqa: F401
    except Exception:  # an import error anywhere in the gateway: not available
        return False
    return True


@contextlib.contextmanager
def gateway_server(triton_http_url: str, workdir: Path) -> Iterator[tuple[str, str]]:
    """Start the real gateway as a subprocess with a fresh API key; yields ``(base URL, key)``.

    The key's tier has limits far above the offered load, so the benchmark measures the gateway's
    cost, not its rate limiter; the in-flight bound is raised above the largest concurrency.
    """
    from gateway.keys import KeyStore
    from serving.launcher import free_port

    keys_db = workdir / "gateway_keys.sqlite3"
    _, key = KeyStore(keys_db).create("loadtest-bench", ["*"], _BENCH_TIER)
    port = free_port()
    env = _child_env()
    env.update({
        "GATEWAY_TIER_LIMITS": json.dumps({_BENCH_TIER: {"per_minute": 1e9, "burst": 1_000_000},
                                           "free": {"per_minute": 10, "burst": 5}}),
        "GATEWAY_MAX_IN_FLIGHT_PER_MODEL": "4096",
        "GATEWAY_LOG_LEVEL": "warning",
    })
    cmd = [sys.executable, "-m", "gateway", "--host", "127.0.0.1", "--port", str(port),
           "--triton-url", triton_http_url, "--keys-db", str(keys_db), "--log-level", "warning"]
    with _subprocess(cmd, env, workdir / "gateway.log") as process:
        _wait_logged(f"http://127.0.0.1:{port}/healthz", 120, process, workdir / "gateway.log")
        yield f"http://127.0.0.1:{port}", key


# --------------------------------------------------------------------------- model repository


def _entry_name(settings: BenchSettings) -> str:
    if settings.device == "cuda":
        from loadtest.torchscript import torchscript_name

        return torchscript_name(settings.model)
    return settings.model


def prepare_repository(settings: BenchSettings, target: Path) -> tuple[str, str]:
    """Lay out the bench repository in ``target``: the entry and its copy without dynamic batching.

    Returns:
        ``(batching entry, no-batching entry)`` names.
    """
    from builders.triton_config import read_config, write_config

    source_repo = settings.repository or DEFAULT_BUILD_REPOSITORY
    name = _entry_name(settings)
    if not (source_repo / name / "config.pbtxt").exists():
        if settings.device == "cuda":
            from loadtest.torchscript import publish_torchscript

            # A CPU instance computing on CUDA: see publish_torchscript's ``device`` for why.
            publish_torchscript(source_repo, settings.model, gpu=False, precision="fp16", device="cuda")
        else:
            from builders.pipeline import BuildOptions, build

            build([settings.model], BuildOptions(repository=source_repo, variants=False))
    target.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source_repo / name, target / name, symlinks=True, dirs_exist_ok=True)
    config = read_config(target / name / "config.pbtxt")
    nobatch_name = name + NOBATCH_SUFFIX
    config.name = nobatch_name
    config.ClearField("dynamic_batching")
    (target / nobatch_name).mkdir(exist_ok=True)
    for version in (p for p in (target / name).iterdir() if p.is_dir() and p.name.isdigit()):
        shutil.copytree(version, target / nobatch_name / version.name, dirs_exist_ok=True)
    write_config(config, target / nobatch_name / "config.pbtxt")
    return name, nobatch_name


def _model_file(repository: Path, name: str) -> Path:
    from builders.triton_config import read_config

    config = read_config(repository / name / "config.pbtxt")
    versions = sorted(int(p.name) for p in (repository / name).iterdir() if p.is_dir() and p.name.isdigit())
    return repository / name / str(versions[-1]) / (config.default_model_filename or "model.onnx")


def _tensor_names(repository: Path, name: str) -> tuple[str, str]:
    from builders.triton_config import read_config

    config = read_config(repository / name / "config.pbtxt")
    return config.input[0].name, config.output[0].name


# --------------------------------------------------------------------------- raw runtime


def _raw_onnxruntime(model_path: Path, images: np.ndarray, batches: Sequence[int], seconds: float) -> list[Result]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 0  # as the Triton entry: intra_op_thread_count 0, inter 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(model_path), sess_options=options, providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name

    def run(batch: np.ndarray) -> None:
        session.run(None, {input_name: batch})

    return _raw_sweep("raw", run, images, batches, seconds, note="onnxruntime CPU, in process")


def _raw_torchscript_cuda(model_path: Path, images: np.ndarray, batches: Sequence[int], seconds: float) -> list[Result]:
    import torch

    module = torch.jit.load(str(model_path), map_location="cuda").eval().half()
    torch.backends.cudnn.benchmark = False  # as the backend's default, so the ceiling is like for like

    def run(batch: np.ndarray) -> None:
        # The same work the backend does per execution: host tensor in, host logits out.
        with torch.inference_mode(), torch.jit.optimized_execution(False):  # as the backend runs it
            out = module(torch.from_numpy(batch).to("cuda").half())
            out.float().cpu()

    return _raw_sweep("raw", run, images, batches, seconds, note="TorchScript FP16 on CUDA, in process")


def _raw_sweep(name: str, run: Any, images: np.ndarray, batches: Sequence[int], seconds: float, note: str) -> list[Result]:
    results = []
    for batch_size in batches:
        reps = -(-batch_size // len(images))
        batch = np.ascontiguousarray(np.concatenate([images] * reps)[:batch_size])
        for _ in range(3):
            run(batch)  # warm-up (allocations, cudnn autotuning)
        latencies = []
        started = time.perf_counter()
        while time.perf_counter() - started < seconds or len(latencies) < 3:
            t0 = time.perf_counter()
            run(batch)
            latencies.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - started
        result = _summarise(name, 0, np.asarray(latencies), 0, elapsed, note=note)
        result.batch = batch_size
        result.requests = len(latencies) * batch_size
        result.throughput = result.requests / elapsed
        results.append(result)
    return results


# --------------------------------------------------------------------------- machine and report


def machine_description() -> dict[str, Any]:
    """CPU model, cores, memory, GPU (if any), load average and the versions that matter."""
    info: dict[str, Any] = {"platform": platform.platform(), "python": platform.python_version()}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    info["logical_cpus"] = os.cpu_count()
    with contextlib.suppress(AttributeError):
        info["usable_cpus"] = len(os.sched_getaffinity(0))
    with contextlib.suppress(OSError, ValueError):
        kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal"))
        info["memory_gib"] = round(kib / 2**20, 1)
    with contextlib.suppress(OSError):
        info["load_average_at_start"] = [round(v, 2) for v in os.getloadavg()]
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["cuda"] = torch.version.cuda
    except ImportError:
        pass
    for package in ("onnxruntime", "nvidia-pytriton", "tritonclient", "fastapi", "uvicorn", "aiohttp"):
        with contextlib.suppress(Exception):
            from importlib import metadata

            info[package] = metadata.version(package)
    return info


def _machine_line(machine: dict[str, Any]) -> str:
    cpu = machine.get("cpu", "unknown CPU")
    cores = machine.get("usable_cpus", machine.get("logical_cpus"))
    gpu = f", GPU {machine['gpu']}" if machine.get("gpu") else ", no GPU"
    return f"{cpu}, {cores} usable cores{gpu}"


def _best(results: list[Result], config: str) -> Result | None:
    rows = [r for r in results if r.config == config and r.requests > 0]
    return max(rows, key=lambda r: r.throughput) if rows else None


def _at(results: list[Result], config: str, concurrency: int) -> Result | None:
    return next((r for r in results if r.config == config and r.concurrency == concurrency), None)


def compute_ratios(results: list[Result], concurrency: Sequence[int]) -> dict[str, Any]:
    """The goal figures: batching on/off, platform/naive, gateway/direct and platform/raw."""
    ratios: dict[str, Any] = {"per_concurrency": {}}
    for c in concurrency:
        row: dict[str, Any] = {}
        on, off = _at(results, "triton-batching", c), _at(results, "triton-no-batching", c)
        gw, naive = _at(results, "gateway", c), _at(results, "naive", c)
        if on and off and off.throughput > 0:
            row["batching_throughput_x"] = on.throughput / off.throughput
            row["batching_p99_delta_ms"] = on.p99_ms - off.p99_ms
            row["batching_goal_met"] = row["batching_throughput_x"] >= 4 and row["batching_p99_delta_ms"] <= 3
        for label, platform_result in (("platform", on), ("gateway_platform", gw)):
            if platform_result and naive and naive.throughput > 0:
                row[f"{label}_vs_naive_throughput_x"] = platform_result.throughput / naive.throughput
                row[f"{label}_vs_naive_p99_delta_ms"] = platform_result.p99_ms - naive.p99_ms
                row[f"{label}_vs_naive_goal_met"] = (
                    row[f"{label}_vs_naive_throughput_x"] >= 3 and platform_result.p99_ms <= naive.p99_ms
                )
        if gw and on and on.throughput > 0:
            row["gateway_vs_direct_throughput_x"] = gw.throughput / on.throughput
            row["gateway_p99_overhead_ms"] = gw.p99_ms - on.p99_ms
        ratios["per_concurrency"][str(c)] = row
    raw, direct, gw = _best(results, "raw"), _best(results, "triton-batching"), _best(results, "gateway")
    if raw and raw.throughput > 0:
        ratios["raw_best_batch"] = raw.batch
        ratios["raw_best_images_per_s"] = raw.throughput
        if direct:
            ratios["efficiency_direct"] = direct.throughput / raw.throughput
            ratios["efficiency_direct_goal_met"] = ratios["efficiency_direct"] >= 0.9
        if gw:
            ratios["efficiency_gateway"] = gw.throughput / raw.throughput
    return ratios


def print_report(results: list[Result], ratios: dict[str, Any], machine: dict[str, Any], settings_line: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=140)
    table = Table(title=f"Side-by-side benchmark: {_machine_line(machine)}", caption=settings_line)
    for column in ("config", "concurrency", "batch", "throughput/s", "P50 ms", "P95 ms", "P99 ms", "errors", "error rate"):
        table.add_column(column, justify="left" if column == "config" else "right")
    for r in results:
        table.add_row(
            r.config, str(r.concurrency) if r.concurrency else "-", str(r.batch), f"{r.throughput:,.1f}",
            f"{r.p50_ms:.1f}", f"{r.p95_ms:.1f}", f"{r.p99_ms:.1f}", str(r.errors), f"{r.error_rate:.2%}",
        )
    console.print(table)
    ratio_table = Table(title="Ratios (same machine, same run)")
    for column in ("concurrency", "batching on/off", "P99 on-off ms", "platform/naive", "P99 platform-naive ms",
                   "gateway/direct", "gateway P99 overhead ms"):
        ratio_table.add_column(column, justify="right")

    def fmt(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    for c, row in ratios["per_concurrency"].items():
        ratio_table.add_row(
            c, fmt(row.get("batching_throughput_x"), ".2f") + "x", fmt(row.get("batching_p99_delta_ms"), "+.1f"),
            fmt(row.get("platform_vs_naive_throughput_x"), ".2f") + "x", fmt(row.get("platform_vs_naive_p99_delta_ms"), "+.1f"),
            fmt(row.get("gateway_vs_direct_throughput_x"), ".2f") + "x", fmt(row.get("gateway_p99_overhead_ms"), "+.1f"),
        )
    console.print(ratio_table)
    if "raw_best_images_per_s" in ratios:
        line = (f"raw runtime ceiling: {ratios['raw_best_images_per_s']:,.1f} images/s at batch {ratios['raw_best_batch']}; "
                f"efficiency (best platform / raw): direct {fmt(ratios.get('efficiency_direct'), '.1%')}")
        if "efficiency_gateway" in ratios:
            line += f", through the gateway {ratios['efficiency_gateway']:.1%}"
        console.print(line)


def save_plot(results: list[Result], ratios: dict[str, Any], machine: dict[str, Any], settings_line: str, path: Path) -> Path:
    """Latency (P50 dashed, P99 solid) against throughput, one line per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 7))
    colours = {"triton-batching": "tab:green", "triton-no-batching": "tab:orange", "gateway": "tab:blue", "naive": "tab:red"}
    for config, colour in colours.items():
        rows = sorted((r for r in results if r.config == config and r.requests > 0), key=lambda r: r.concurrency)
        if not rows:
            continue
        x = [r.throughput for r in rows]
        ax.plot(x, [r.p99_ms for r in rows], "-o", color=colour, label=f"{config} P99")
        ax.plot(x, [r.p50_ms for r in rows], "--", color=colour, alpha=0.6, label=f"{config} P50")
        for r in rows:
            ax.annotate(f"c={r.concurrency}", (r.throughput, r.p99_ms), textcoords="offset points", xytext=(4, 4), fontsize=7)
    raw = [r for r in results if r.config == "raw"]
    if raw:
        best = max(raw, key=lambda r: r.throughput)
        ax.axvline(best.throughput, color="black", linestyle=":",
                   label=f"raw runtime limit ({best.throughput:,.0f}/s at batch {best.batch})")
    ax.set_xlabel("throughput (requests/s; raw: images/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    eff = ratios.get("efficiency_direct")
    ax.set_title(f"Latency vs throughput: {_machine_line(machine)}" + (f"\nefficiency {eff:.1%} of raw" if eff else ""),
                 fontsize=10)
    fig.text(0.01, 0.01, settings_line, fontsize=7, wrap=True)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- the run


def _settings_line(settings: BenchSettings, entry: str) -> str:
    precision = "FP16 TorchScript on CUDA via the pytorch backend" if settings.device == "cuda" else "FP32 ONNX via onnxruntime backend"
    return (
        f"model {entry} ({precision}); payload FP32 [1,3,224,224] KServe v2 binary (naive: raw bytes), 12 real photos round-robin; "
        f"closed loop, concurrency {list(settings.concurrency)}, {settings.warmup_s:g}s warm-up + {settings.duration_s:g}s measured per point, "
        f"{settings.clients} client process(es), aiohttp over loopback HTTP/1.1; 1 Triton instance, intra-op threads = runtime default "
        f"(physical cores), inter-op 1; raw batches {list(settings.raw_batches)}"
    )


def run_bench(settings: BenchSettings) -> dict[str, Any]:
    """Run every configured configuration side by side and write ``bench.json`` / ``bench.png``.

    Returns:
        The JSON document (settings, machine, results, ratios, files).
    """
    from serving.launcher import TritonPorts, TritonServer

    settings.out_dir.mkdir(parents=True, exist_ok=True)
    machine = machine_description()
    configs = [c for c in settings.configs if c in ALL_CONFIGS]
    skipped: dict[str, str] = {}
    if "gateway" in configs and not gateway_available():
        configs.remove("gateway")
        skipped["gateway"] = "the gateway package or its dependencies are not importable here"
    images = image_tensors()
    results: list[Result] = []
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
        repo = workdir / "repository"
        entry, nobatch = prepare_repository(settings, repo)
        input_name, output_name = _tensor_names(repo, entry)
        requests = [v2_binary_request({input_name: images[i:i + 1]}, [output_name]) for i in range(len(images))]
        targets: list[_Target] = []
        if {"triton-batching", "triton-no-batching", "gateway"} & set(configs):
            triton = stack.enter_context(TritonServer(repo, models=[entry, nobatch], ports=TritonPorts.free()))
            base = f"http://{triton.http_url}/v2/models"
            if "triton-batching" in configs:
                targets.append(_Target("triton-batching", f"{base}/{entry}/infer", requests))
            if "triton-no-batching" in configs:
                targets.append(_Target("triton-no-batching", f"{base}/{nobatch}/infer", requests))
            if "gateway" in configs:
                url, key = stack.enter_context(gateway_server(triton.http_url, workdir))
                targets.append(_Target("gateway", f"{url}/v2/models/{entry}/infer", requests,
                                       headers={"Authorization": f"Bearer {key}"}))
        if "naive" in configs:
            precision = "fp16" if settings.device == "cuda" else "fp32"
            url = stack.enter_context(naive_server(settings.device, precision, workdir, settings.model))
            raw_requests = [V2Request(images[i:i + 1].tobytes(), {"Content-Type": "application/octet-stream"})
                            for i in range(len(images))]
            targets.append(_Target("naive", f"{url}/predict", raw_requests, kind="raw"))

        sanity = {t.name: _sanity(t, output_name) for t in targets}
        raw_runs: list[list[Result]] = []
        if "raw" in configs:  # measured before and after the load sweep; the ceiling is the better run
            raw_runs.append(_raw(settings, repo, entry, images))
        # Concurrency-major order: every configuration sees each load level at about the same time,
        # so drift from other work on the machine spreads over all of them.
        for concurrency in settings.concurrency:
            for target in targets:
                print(f"[bench] {target.name} concurrency={concurrency} ...", file=sys.stderr, flush=True)
                results.append(closed_loop(target, concurrency, settings.warmup_s, settings.duration_s, settings.clients))
        if "raw" in configs:
            raw_runs.append(_raw(settings, repo, entry, images))
            for first, second in zip(*raw_runs, strict=True):
                best = max(first, second, key=lambda r: r.throughput)
                best.note += f" (best of 2 runs: {first.throughput:,.1f} before, {second.throughput:,.1f} after the sweep)"
                results.append(best)

    settings_line = _settings_line(settings, entry)
    ratios = compute_ratios(results, settings.concurrency)
    print_report(results, ratios, machine, settings_line)
    png = save_plot(results, ratios, machine, settings_line, settings.out_dir / "bench.png")
    document = {
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(settings).items()},
        "settings_line": settings_line,
        "command": " ".join([Path(sys.executable).name, "-m", "loadtest.bench", *sys.argv[1:]]) if sys.argv else "",
        "machine": machine,
        "model_entry": entry,
        "sanity_top1": sanity,
        "skipped": skipped,
        "results": [{**asdict(r), "error_rate": r.error_rate} for r in results],
        "ratios": ratios,
        "files": {"json": str(settings.out_dir / "bench.json"), "png": str(png)},
    }
    (settings.out_dir / "bench.json").write_text(json.dumps(document, indent=2, default=float) + "\n", encoding="utf-8")
    return document


def _raw(settings: BenchSettings, repo: Path, entry: str, images: np.ndarray) -> list[Result]:
    print("[bench] raw runtime ...", file=sys.stderr, flush=True)
    seconds = max(settings.duration_s / 3, 0.5)
    model_file = _model_file(repo, entry)
    if settings.device == "cuda":
        return _raw_torchscript_cuda(model_file, images, settings.raw_batches, seconds)
    return _raw_onnxruntime(model_file, images, settings.raw_batches, seconds)


def _sanity(target: _Target, output_name: str) -> int:
    """One request before the load: the answer must decode to 1000 logits; returns its top-1 class."""
    request = target.request[0]
    req = urllib.request.Request(target.url, data=request.body, headers={**request.headers, **target.headers}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as response:
            body = response.read()
            length = response.headers.get("Inference-Header-Content-Length")
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"{target.name}: {target.url} answered {exc.code}: {exc.read()[:500]!r}") from exc
    try:
        if target.kind == "raw":
            logits = np.frombuffer(body, dtype=np.float32)
        else:
            logits = v2_output(body, int(length) if length else None, output_name)
    except (KeyError, ValueError) as exc:
        raise RuntimeError(f"{target.name}: unreadable answer ({exc!r}), header length {length}: {body[:600]!r}") from exc
    if logits.size != 1000:
        raise RuntimeError(f"{target.name}: expected 1000 logits, got {logits.size}")
    return int(np.argmax(logits))


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v.strip())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench",
        description="Side-by-side benchmark: Triton batching on/off, gateway vs direct, platform vs a naive "
        "FastAPI+PyTorch server, and the raw runtime limit; prints a table, writes bench.json and bench.png.",
    )
    parser.add_argument("--quick", action="store_true", help="a few seconds per configuration (smoke test)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--concurrency", type=_ints, help="comma separated, default 1,8,32")
    parser.add_argument("--duration", type=float, help="measured seconds per point (default 10)")
    parser.add_argument("--warmup", type=float, help="unmeasured seconds before each point (default 2)")
    parser.add_argument("--raw-batches", type=_ints, help="batch sizes for the raw runtime (default 1,2,4,8,16,32)")
    parser.add_argument("--configs", help=f"comma separated subset of {','.join(ALL_CONFIGS)}")
    parser.add_argument("--repository", type=Path, help="model repository holding the entry (built if missing)")
    parser.add_argument("--clients", type=int, help="load-generator processes (default 1)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for bench.json and bench.png")
    return parser


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    overrides: dict[str, Any] = {"device": args.device, "model": args.model, "out_dir": args.out}
    for key, value in (("concurrency", args.concurrency), ("duration_s", args.duration), ("warmup_s", args.warmup),
                       ("raw_batches", args.raw_batches), ("repository", args.repository), ("clients", args.clients)):
        if value is not None:
            overrides[key] = value
    if args.configs:
        overrides["configs"] = tuple(c.strip() for c in args.configs.split(",") if c.strip())
    return BenchSettings.quick_settings(**overrides) if args.quick else BenchSettings(**overrides)


def main(argv: Sequence[str] | None = None) -> int:
    settings = settings_from_args(build_parser().parse_args(argv))
    document = run_bench(settings)
    print(f"wrote {document['files']['json']} and {document['files']['png']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
