"""Fixed closed-loop load against one Triton model version: latency percentiles and throughput."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass

import numpy as np
import tritonclient.http as http
import tritonclient.http.aio as triton_aio

__all__ = ["LoadResult", "classify", "run_load"]


@dataclass(frozen=True)
class LoadResult:
    requests: int
    errors: int
    throughput_rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def _inputs(pixels: np.ndarray) -> list[triton_aio.InferInput]:
    tensor = triton_aio.InferInput("input", list(pixels.shape), "FP32")
    tensor.set_data_from_numpy(pixels, binary_data=True)
    return [tensor]


async def _load(url: str, model: str, version: str, pixels: np.ndarray, concurrency: int, duration_s: float) -> LoadResult:
    latencies: list[float] = []
    errors = 0
    client = triton_aio.InferenceServerClient(url, conn_limit=concurrency)
    deadline = time.perf_counter() + duration_s

    async def worker() -> None:
        nonlocal errors
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            try:
                await client.infer(model, _inputs(pixels), model_version=version)
                latencies.append(time.perf_counter() - started)
            except Exception:
                errors += 1

    started = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await client.close()
    elapsed = time.perf_counter() - started
    ms = np.asarray(latencies) * 1000 if latencies else np.asarray([float("nan")])
    return LoadResult(
        requests=len(latencies) + errors,
        errors=errors,
        throughput_rps=len(latencies) / elapsed,
        p50_ms=float(np.percentile(ms, 50)),
        p95_ms=float(np.percentile(ms, 95)),
        p99_ms=float(np.percentile(ms, 99)),
    )


def run_load(url: str, model: str, pixels: np.ndarray, *, version: str = "", concurrency: int = 8,
             duration_s: float = 5.0) -> LoadResult:
    """Keep ``concurrency`` single-sample requests in flight for ``duration_s``."""
    return asyncio.run(_load(url, model, version, pixels[None] if pixels.ndim == 3 else pixels, concurrency, duration_s))


def classify(url: str, model: str, pixels: np.ndarray, *, version: str = "") -> np.ndarray:
    """Top-1 class of each row of ``pixels`` [n, 3, H, W] from ``model`` (one batched request)."""
    client = http.InferenceServerClient(url, network_timeout=120)
    tensor = http.InferInput("input", list(pixels.shape), "FP32")
    tensor.set_data_from_numpy(pixels)
    logits = client.infer(model, [tensor], model_version=version).as_numpy("logits")
    return np.asarray(logits).argmax(axis=1)
