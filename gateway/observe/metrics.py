"""The gateway's Prometheus metrics (``/metrics``): one registry per app, never the global one, and
its exposition across worker processes.

Histograms with geometric buckets 25% apart from 0.25 ms to 60 s, so a P99 read through
``histogram_quantile`` is within one bucket (~12%) of the truth, and histograms from several replicas
add up (summaries would not). Client label values are capped (``max_client_labels``); beyond the cap
a client is counted as ``_other``. :class:`gateway.observe.stats.LatencyTracker` builds on these.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from gateway.observe.latency import OTHER_CLIENT
from gateway.observe.timing import LOOP_LAG_INTERVAL_S

__all__ = ["LATENCY_BUCKETS_S", "MULTIPROCESS_ENV", "GatewayMetrics", "metrics_directory"]


def _geometric_buckets(low: float, high: float, factor: float) -> tuple[float, ...]:
    out: list[float] = []
    value = low
    while value < high:
        out.append(round(value, 6))
        value *= factor
    out.append(high)
    return tuple(out)


LATENCY_BUCKETS_S = _geometric_buckets(0.00025, 60.0, 1.25)

#: prometheus_client's switch to multiprocess mode; it is read when the library is imported, so it
#: must be in the environment before the workers start.
MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"


@contextlib.contextmanager
def metrics_directory(workers: int) -> Iterator[str | None]:
    """A fresh folder for the workers' Prometheus values while the server runs (several workers only).

    Sets ``PROMETHEUS_MULTIPROC_DIR`` for the workers about to start, and removes the folder (and
    the variable) afterwards. With one worker it does nothing: the process's own registry is whole.

    Args:
        workers: how many worker processes the server starts.

    Yields:
        The folder, or ``None`` for one worker.
    """
    if workers <= 1:
        yield None
        return
    directory = tempfile.mkdtemp(prefix="gateway-metrics-")
    previous = os.environ.get(MULTIPROCESS_ENV)
    os.environ[MULTIPROCESS_ENV] = directory
    try:
        yield directory
    finally:
        if previous is None:
            os.environ.pop(MULTIPROCESS_ENV, None)
        else:
            os.environ[MULTIPROCESS_ENV] = previous
        shutil.rmtree(directory, ignore_errors=True)


class GatewayMetrics:
    """The Prometheus metrics of one app instance (one process).

    Args:
        max_client_labels: distinct client label values; the rest share ``_other``.
    """

    def __init__(self, max_client_labels: int = 100) -> None:
        self.max_client_labels = max_client_labels
        self.registry = CollectorRegistry(auto_describe=True)
        self._client_labels: set[str] = set()
        self.request_seconds = Histogram(
            "gateway_request_duration_seconds",
            "Gateway latency of admitted inference requests, first byte in to last byte out.",
            ["model", "status"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.client_seconds = Histogram(
            "gateway_client_request_duration_seconds",
            "Gateway latency per client (API key id or JWT subject; capped, the rest is _other).",
            ["client"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.stage_seconds = Histogram(
            "gateway_stage_duration_seconds",
            "Time admitted requests spent in each gateway stage (auth, admit, parse, upstream: see "
            "gateway.observe.timing); the request's total is gateway_request_duration_seconds.",
            ["model", "stage"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.loop_lag = Histogram(
            "gateway_event_loop_lag_seconds",
            "How late a timer fires on each worker's event loop (sampled every "
            f"{LOOP_LAG_INTERVAL_S * 1000:g} ms): what every await of a request waits before it runs again.",
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.gc_pause = Histogram(
            "gateway_gc_pause_seconds",
            "Garbage-collector pauses of each worker, by generation: the worker's event loop stands "
            "still meanwhile (gateway.observe.gc_pauses).",
            ["generation"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.rejections = Counter(
            "gateway_rejected_requests",
            "Requests refused before reaching Triton, by reason.",
            ["reason"],
            registry=self.registry,
        )
        # multiprocess_mode applies only with several workers (see metrics_text): in-flight requests
        # add up over the live workers; Triton's means are the same poll in each, so the latest wins.
        self.in_flight = Gauge(
            "gateway_in_flight_requests",
            "Requests being served now, per model.",
            ["model"],
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.triton_queue = Gauge(
            "gateway_triton_queue_mean_seconds",
            "Triton's mean queue time per request over the stats window (statistics extension).",
            ["model"],
            registry=self.registry,
            multiprocess_mode="livemostrecent",
        )
        self.triton_compute = Gauge(
            "gateway_triton_compute_mean_seconds",
            "Triton's mean compute (infer) time per request over the stats window (statistics extension).",
            ["model"],
            registry=self.registry,
            multiprocess_mode="livemostrecent",
        )
        self.multiprocess_dir = os.environ.get(MULTIPROCESS_ENV) or None
        # Labelled children by (metric, label values): ``labels()`` costs a lock, a tuple of
        # str() calls and checks on every call, several times per request; a dict lookup does not.
        # Bounded as the label values are (admitted models, statuses, stages, capped clients).
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def metrics_text(self) -> bytes:
        """The Prometheus exposition of every worker of this gateway (or of this process alone).

        With several workers (``PROMETHEUS_MULTIPROC_DIR`` set by the server before it starts
        them, see :func:`metrics_directory`), each worker's values live in files there and any
        worker answers a scrape with the sum of all: one scrape, one pod, whole figures.
        """
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=self.multiprocess_dir)
        return generate_latest(registry)

    def forget_dead_workers(self) -> None:
        """Drop the live-gauge files of workers that died (their in-flight counts must not linger).

        Called when a worker starts, which is also when the server replaces a dead one.
        """
        if self.multiprocess_dir is None:
            return
        for path in Path(self.multiprocess_dir).glob("gauge_live*_*.db"):
            pid = path.stem.rsplit("_", 1)[-1]
            if pid.isdigit() and not psutil.pid_exists(int(pid)):
                mark_process_dead(int(pid), self.multiprocess_dir)

    def client_label(self, client: str) -> str:
        """``client`` if it already has, or may still get, its own label value; otherwise ``_other``."""
        if client in self._client_labels:
            return client
        if len(self._client_labels) < self.max_client_labels:
            self._client_labels.add(client)
            return client
        return OTHER_CLIENT

    def labelled(self, metric: MetricWrapperBase, *values: str) -> Any:
        """``metric.labels(*values)``, cached (the hot path asks for the same few children)."""
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def observe_gc_pause(self, generation: int, seconds: float) -> None:
        self.labelled(self.gc_pause, str(generation)).observe(seconds)

    def reject(self, reason: str) -> None:
        self.labelled(self.rejections, reason).inc()
