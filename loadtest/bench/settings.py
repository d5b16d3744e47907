"""What a run of the side-by-side benchmark does (:class:`BenchSettings`) and what it reports per point."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from loadtest.loadgen import LoadSpec, Target

__all__ = [
    "ALL_CONFIGS",
    "DEFAULT_CONFIGS",
    "JPEG_CONFIGS",
    "PIPELINE",
    "BenchSettings",
    "PointWindow",
    "Result",
    "point_spec",
    "result_row",
]

DEFAULT_CONFIGS: tuple[str, ...] = (
    "triton-batching",
    "triton-no-batching",
    "gateway",
    "naive",
    "raw",
)
#: the JPEG path: photos as JPEG bytes through the gateway to the ``image_classifier`` ensemble (KServe v2
#: binary, BYTES), and the naive server's ``/classify`` (decode, preprocess, forward, top 5 in one handler)
JPEG_CONFIGS: tuple[str, ...] = ("gateway-jpeg", "naive-jpeg")
ALL_CONFIGS: tuple[str, ...] = DEFAULT_CONFIGS + JPEG_CONFIGS
#: the CPU pipeline the JPEG configurations call through the gateway
PIPELINE = "image_classifier"
DEFAULT_MODEL = "efficientnet_lite0"
DEFAULT_OUT = Path("reports/bench")
DEFAULT_BUILD_REPOSITORY = Path(".build/bench-repository")
NOBATCH_SUFFIX = "_nobatch"


@dataclass(frozen=True, kw_only=True)
class BenchSettings:
    """What one benchmark run does.

    Args:
        device: ``cpu`` (ONNX entry through the onnxruntime backend) or ``cuda`` (TorchScript entry
            through the pytorch backend, FP16, ``KIND_GPU``).
        concurrency: closed-loop in-flight requests, one sweep point each.
        duration_s / warmup_s: measured window and the unmeasured lead-in of each point.
        raw_batches: batch sizes tried for the raw runtime; the best is the ceiling.
        configs: which of :data:`ALL_CONFIGS` to run (default :data:`DEFAULT_CONFIGS`).
        repository: a model repository holding the model entry; built into
            ``.build/bench-repository`` when ``None``. The JPEG configurations need
            ``image_classifier`` and its steps there too (``inferctl up`` builds them).
        clients: load-generator processes (each point's concurrency is split over them); 1 is in process.
        protocol: how the Triton configurations are called: ``http`` (binary tensors) or ``grpc``.
        shared_memory: ``system`` puts the Triton configurations' tensors in shared memory.
        naive_threads: the naive server's torch intra-op threads; 0 keeps PyTorch's default (one per
            physical core), which on a busy shared host makes every forward wait for all of them.
    """

    device: str = "cpu"
    model: str = DEFAULT_MODEL
    concurrency: tuple[int, ...] = (1, 8, 32)
    duration_s: float = 10.0
    warmup_s: float = 2.0
    raw_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    configs: tuple[str, ...] = DEFAULT_CONFIGS
    repository: Path | None = None
    out_dir: Path = DEFAULT_OUT
    clients: int = 1
    protocol: str = "http"
    shared_memory: str | None = None
    naive_threads: int = 0
    quick: bool = False

    @classmethod
    def quick_settings(cls, **overrides: Any) -> BenchSettings:
        """A few seconds per configuration: proves the machinery, measures nothing."""
        base: dict[str, Any] = dict(
            concurrency=(1, 4), duration_s=1.5, warmup_s=0.5, raw_batches=(1, 8), quick=True
        )
        base.update(overrides)
        return cls(**base)


@dataclass
class Result:
    """One sweep point of one configuration (raw: one batch size)."""

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
    capacity: float | None = None  # the load generator's own requests/s with the same settings
    capacity_used: float | None = None  # throughput / capacity: near 1, the client was the limit
    error_rate: float = 0.0
    error_messages: str = ""
    #: the share of the slowest 1% that finished in the densest 100 ms (``loadgen.samples.tail_burst``)
    tail_burst: float | None = None


def result_row(name: str, result: Any, capacity: float | None, per_request: int = 1) -> Result:
    """A load result (``loadtest.loadgen``) as a table row: throughput and the client's capacity in
    images per second, for requests of ``per_request`` images."""
    capacity = capacity * per_request if capacity else capacity
    return Result(
        config=name,
        concurrency=result.concurrency,
        requests=result.requests,
        errors=result.errors,
        duration_s=result.duration_s,
        throughput=result.throughput * per_request,
        p50_ms=result.p50_ms,
        p95_ms=result.p95_ms,
        p99_ms=result.p99_ms,
        mean_ms=result.mean_ms,
        capacity=capacity,
        capacity_used=result.throughput * per_request / capacity if capacity else None,
        error_rate=result.error_rate,
        error_messages=result.error_summary(),
        tail_burst=result.tail_burst,
    )


class PointWindow(Protocol):
    """A benchmark's settings as far as one load point reads them (the benchmarks' settings are)."""

    @property
    def duration_s(self) -> float: ...

    @property
    def warmup_s(self) -> float: ...


def point_spec(
    target: Target,
    concurrency: int,
    settings: PointWindow,
    name: str,
    *,
    honour_retry_after: bool = False,
) -> LoadSpec:
    """One load point of a benchmark: ``target`` at ``concurrency`` for the run's measured window
    after its warm-up, its rows named ``name`` (a polite client where ``honour_retry_after``)."""
    return LoadSpec(
        target=target,
        concurrency=concurrency,
        duration_s=settings.duration_s,
        warmup_s=settings.warmup_s,
        honour_retry_after=honour_retry_after,
        name=name,
    )
