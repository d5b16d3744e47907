"""Issue 16's targets for the GPU benchmark, evaluated on the rows of one run (issue 28's JPEG goals,
``loadtest.bench.jpeg_goals``, are added to them).

Targets, each computed from rows of the same run:
- JPEG -> top-5 through Triton: >= 5,000 images/s with P99 <= 20 ms (the best row within the budget
  of any JPEG entry reached directly: ``jpeg``, and ``jpeg compiled`` on the compiled classifier);
- the same through the gateway: >= 0.8 of direct Triton's throughput and <= +3 ms P99, against the
  entry the gateway reaches (``jpeg``) at that entry's best concurrency;
- tensor path with shared memory: >= 50% of the in-process ceiling (best of eager / channels_last /
  CUDA graph at any batch size), judged on requests of one image; requests of 8 images (``tensor
  cuda-shm x8``, as perf_analyzer's ``-b 8``) are reported beside it;
- dynamic batching on vs off at concurrency 32: >= 5x (tensor path over CUDA shared memory; over HTTP
  reported beside it).
"""

from __future__ import annotations

from typing import Any

from loadtest.bench.gpu_raw import CEILING_MODES
from loadtest.bench.jpeg_goals import jpeg_goals
from loadtest.bench.report import result_at, share_figure
from loadtest.bench.settings import Result

__all__ = ["CEILING_CONFIGS", "evaluate_targets"]

#: the tensor path with one image per request and no payload on the wire: judged on the best of them
TENSOR_SHM_CONFIGS = ("tensor system-shm", "tensor cuda-shm", "tensor cuda-shm inputs")
#: the in-process ceiling's rows (the best of them is the tensor path's bar)
CEILING_CONFIGS = tuple(f"raw {mode}" for mode in CEILING_MODES)


def _best(rows: list[Result], config: str, p99_ms: float | None = None) -> Result | None:
    found = [
        r
        for r in rows
        if r.config == config
        and r.requests > 0
        and r.errors == 0
        and (p99_ms is None or r.p99_ms <= p99_ms)
    ]
    return max(found, key=lambda r: r.throughput) if found else None


def _reported(goal: str, figure: dict[str, Any]) -> dict[str, Any]:
    """A figure shown beside the targets, judged against none."""
    return {"goal": goal, "figure": figure, "met": None}


def evaluate_targets(rows: list[Result]) -> dict[str, Any]:
    """Each target with its figure, its bar and whether it was met (``None``: not measured)."""
    targets: dict[str, Any] = {}
    ceiling = max(
        (r for r in rows if r.config in CEILING_CONFIGS), key=lambda r: r.throughput, default=None
    )
    # The JPEG path on any of its entries (TorchScript or compiled classifier): the best within the P99 bar.
    configs = sorted(
        {r.config for r in rows if r.config.startswith("jpeg") and "gateway" not in r.config}
    )
    direct = [r for r in (_best(rows, c, 20.0) for c in configs) if r] or [
        r for r in (_best(rows, c) for c in configs) if r
    ]
    best = max(direct, key=lambda r: r.throughput, default=None)
    targets["jpeg_direct"] = {
        "goal": ">= 5,000 images/s with P99 <= 20 ms",
        "figure": None
        if best is None
        else {
            "images_per_s": best.throughput,
            "p99_ms": best.p99_ms,
            "concurrency": best.concurrency,
            "config": best.config,
        },
        "met": None if best is None else best.throughput >= 5000 and best.p99_ms <= 20.0,
    }
    # The gateway in front of the entry it reaches (``jpeg``), at that entry's best concurrency.
    jpeg = _best(rows, "jpeg", 20.0) or _best(rows, "jpeg")
    gateway = None if jpeg is None else result_at(rows, "jpeg gateway", jpeg.concurrency)
    targets["jpeg_gateway"] = {
        "goal": ">= 0.8 of direct throughput, <= +3 ms P99 (same concurrency)",
        "figure": None
        if gateway is None or jpeg is None
        else {
            "ratio": gateway.throughput / jpeg.throughput if jpeg.throughput else 0.0,
            "p99_overhead_ms": gateway.p99_ms - jpeg.p99_ms,
            "images_per_s": gateway.throughput,
            "concurrency": gateway.concurrency,
        },
        "met": None
        if gateway is None or jpeg is None or not jpeg.throughput
        else gateway.throughput / jpeg.throughput >= 0.8 and gateway.p99_ms - jpeg.p99_ms <= 3.0,
    }
    shm = max(
        (r for c in TENSOR_SHM_CONFIGS if (r := _best(rows, c))),
        key=lambda r: r.throughput,
        default=None,
    )
    targets["tensor_shm_vs_ceiling"] = {
        "goal": ">= 50% of the in-process ceiling",
        "figure": None
        if shm is None or ceiling is None
        else {
            **share_figure(shm, ceiling),
            "config": shm.config,
            "ceiling_images_per_s": ceiling.throughput,
            "ceiling": f"{ceiling.config} at batch {ceiling.batch}",
        },
        "met": None
        if shm is None or ceiling is None
        else shm.throughput >= 0.5 * ceiling.throughput,
    }
    batched = _best(rows, "tensor cuda-shm x8")
    if batched is not None and ceiling is not None:
        targets["tensor_shm_x8_vs_ceiling"] = _reported(
            "(reported: 8 images per request, as perf_analyzer -b 8)",
            {
                **share_figure(batched, ceiling),
                "p99_ms": batched.p99_ms,
                "concurrency": batched.concurrency,
            },
        )
    # Judged where the transport is not the limit (CUDA shared memory); over HTTP it is reported beside.
    for name, on_config, off_config, goal in (
        (
            "batching_on_off_32",
            "tensor cuda-shm",
            "tensor no-batching cuda-shm",
            ">= 5x at concurrency 32 (CUDA shared memory)",
        ),
        (
            "batching_on_off_32_http",
            "tensor http",
            "tensor no-batching",
            "(reported: HTTP binary, same pair)",
        ),
    ):
        on, off = result_at(rows, on_config, 32), result_at(rows, off_config, 32)
        if on is None or off is None or not off.throughput:
            targets[name] = {"goal": goal, "figure": None, "met": None}
            continue
        ratio = on.throughput / off.throughput
        targets[name] = {
            "goal": goal,
            "figure": {"ratio": ratio, "p99_on_ms": on.p99_ms, "p99_off_ms": off.p99_ms},
            "met": None if goal.startswith("(") else ratio >= 5,
        }
    on = result_at(rows, "tensor http", 32)
    naive = result_at(rows, "naive", 32)
    if on is not None and naive is not None and naive.throughput:
        targets["platform_vs_naive_32"] = _reported(
            "(reported)",
            {
                "ratio": on.throughput / naive.throughput,
                "p99_platform_ms": on.p99_ms,
                "p99_naive_ms": naive.p99_ms,
            },
        )
    targets.update(jpeg_goals(rows))
    return targets
