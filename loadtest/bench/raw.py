"""The raw ceiling: the model's runtime in process, no server, at its best batch size.

It gives the platform its efficiency ratio (best platform throughput / raw). ONNX Runtime on CPU,
the TorchScript FP16 entry on CUDA, each run the way the serving backend runs it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from loadtest.bench.repository import model_file
from loadtest.bench.settings import BenchSettings, Result
from serving.quantiles import summarize

__all__ = ["in_process_result", "raw_ceiling", "tiled"]


def raw_ceiling(
    settings: BenchSettings, repository: Path, entry: str, images: np.ndarray
) -> list[Result]:
    """One :class:`Result` per batch size of ``settings.raw_batches``; throughput in images/s."""
    print("[bench] raw runtime ...", file=sys.stderr, flush=True)
    seconds = max(settings.duration_s / 3, 0.5)
    path = model_file(repository, entry)
    if settings.device == "cuda":
        return _raw_torchscript_cuda(path, images, settings.raw_batches, seconds)
    return _raw_onnxruntime(path, images, settings.raw_batches, seconds)


def _raw_onnxruntime(
    model_path: Path, images: np.ndarray, batches: Sequence[int], seconds: float
) -> list[Result]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 0  # as the Triton entry: intra_op_thread_count 0, inter 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(
        str(model_path), sess_options=options, providers=["CPUExecutionProvider"]
    )
    input_name = session.get_inputs()[0].name

    def run(batch: np.ndarray) -> None:
        session.run(None, {input_name: batch})

    return _raw_sweep("raw", run, images, batches, seconds, note="onnxruntime CPU, in process")


def _raw_torchscript_cuda(
    model_path: Path, images: np.ndarray, batches: Sequence[int], seconds: float
) -> list[Result]:
    import torch

    module = torch.jit.load(str(model_path), map_location="cuda").eval().half()
    torch.backends.cudnn.benchmark = (
        False  # as the backend's default, so the ceiling is like for like
    )

    def run(batch: np.ndarray) -> None:
        # The same work the backend does per execution: host tensor in, host logits out.
        with torch.inference_mode(), torch.jit.optimized_execution(False):  # as the backend runs it
            out = module(torch.from_numpy(batch).to("cuda").half())
            out.float().cpu()

    return _raw_sweep(
        "raw", run, images, batches, seconds, note="TorchScript FP16 on CUDA, in process"
    )


def _raw_sweep(
    name: str,
    run: Callable[[np.ndarray], None],
    images: np.ndarray,
    batches: Sequence[int],
    seconds: float,
    note: str,
) -> list[Result]:
    results = []
    for batch_size in batches:
        batch = tiled(images, batch_size)
        for _ in range(3):
            run(batch)  # warm-up (allocations, cudnn autotuning)
        latencies: list[float] = []
        started = time.perf_counter()
        while time.perf_counter() - started < seconds or len(latencies) < 3:
            t0 = time.perf_counter()
            run(batch)
            latencies.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - started
        results.append(in_process_result(name, latencies, batch_size, elapsed, note))
    return results


def tiled(images: np.ndarray, size: int) -> np.ndarray:
    """A contiguous batch of ``size`` rows: ``images`` repeated as often as it takes."""
    reps = -(-size // len(images))
    return np.ascontiguousarray(np.concatenate([images] * reps)[:size])


def in_process_result(
    name: str, latencies_s: Sequence[float], batch: int, elapsed_s: float, note: str
) -> Result:
    """The :class:`Result` of timed in-process runs of ``batch`` rows each (at least three)."""
    summary = summarize(np.asarray(latencies_s) * 1000.0)
    assert summary is not None  # the callers time at least three runs
    return Result(
        config=name,
        concurrency=0,
        requests=len(latencies_s) * batch,
        errors=0,
        duration_s=elapsed_s,
        throughput=len(latencies_s) * batch / elapsed_s,
        p50_ms=summary.p50,
        p95_ms=summary.p95,
        p99_ms=summary.p99,
        mean_ms=summary.mean,
        batch=batch,
        note=note,
    )
