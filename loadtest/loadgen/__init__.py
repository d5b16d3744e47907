"""The platform's one load generator: closed loops over HTTP and gRPC, in several processes.

Every place that generates load uses it: the benchmarks (``inferctl bench ...``), the promotion
gate's latency measurement and the fault tests.

- :class:`TritonTarget` (tritonclient aio clients: KServe v2 binary tensors or JSON over HTTP,
  gRPC, system shared memory) and :class:`HttpTarget` (ready-made requests to any route) say what
  is sent; :class:`LoadSpec` how much (concurrency, warm-up, measured seconds).
- :func:`run` / :func:`run_load` drive specs side by side from several processes and merge their
  samples; :func:`closed_loop` drives one target from the caller's event loop.
- :class:`Samples` (every completed request) and :class:`LoadResult` (throughput, P50/P95/P99 by
  :mod:`serving.quantiles`, statuses and the first error message of each).
- :func:`instant_twin` and :func:`measure_capacity`: the load generator's own capacity with the
  same settings, printed beside every result.
"""

from __future__ import annotations

from loadtest.loadgen.capacity import instant_twin, measure_capacity, twin_target
from loadtest.loadgen.runner import (
    LoadError,
    LoadRun,
    LoadSpec,
    closed_loop,
    merge_runs,
    run,
    run_load,
)
from loadtest.loadgen.samples import LoadResult, Sample, Samples
from loadtest.loadgen.targets import HttpTarget, Target, TritonTarget

__all__ = [
    "HttpTarget",
    "LoadError",
    "LoadResult",
    "LoadRun",
    "LoadSpec",
    "Sample",
    "Samples",
    "Target",
    "TritonTarget",
    "closed_loop",
    "instant_twin",
    "measure_capacity",
    "merge_runs",
    "run",
    "run_load",
    "twin_target",
]
