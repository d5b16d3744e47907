"""Latency tracking: exact sliding-window quantiles for ``/v1/stats``, Prometheus for ``/metrics``.

Two views of the same measurements, for two readers:

- :class:`SlidingWindow` keeps every sample of the last ``window_s`` seconds (capped at
  ``max_samples``, oldest dropped first) and computes exact P50/P95/P99 on demand. Recording is an
  append; the sort happens only when someone asks.
- Prometheus histograms (in a registry owned by the app, never the global one) with geometric
  buckets 25% apart from 0.25 ms to 60 s, so a P99 read through ``histogram_quantile`` is within one
  bucket (~12%) of the truth, and histograms from several replicas add up (summaries would not).

Client label values are capped (``max_client_labels``); beyond the cap a client is counted as
``_other`` so a flood of keys cannot blow up the metrics' cardinality.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = [
    "LATENCY_BUCKETS_S",
    "LatencySummary",
    "LatencyTracker",
    "SlidingWindow",
    "TritonTimes",
    "quantile",
]

OTHER_CLIENT = "_other"


def _geometric_buckets(low: float, high: float, factor: float) -> tuple[float, ...]:
    out: list[float] = []
    value = low
    while value < high:
        out.append(round(value, 6))
        value *= factor
    out.append(high)
    return tuple(out)


LATENCY_BUCKETS_S = _geometric_buckets(0.00025, 60.0, 1.25)


def quantile(sorted_values: list[float], q: float) -> float:
    """The ``q`` quantile of already-sorted values, nearest-rank (a value that was observed).

    Args:
        sorted_values: ascending, non-empty.
        q: in [0, 1].

    Returns:
        The smallest value with at least ``q`` of the samples at or below it.
    """
    if not sorted_values:
        raise ValueError("quantile of no samples")
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclass(frozen=True)
class LatencySummary:
    """Quantiles of one series over the window, in milliseconds."""

    count: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float

    def as_dict(self) -> dict[str, float | int]:
        return {
            "count": self.count,
            "p50_ms": round(self.p50_ms, 3),
            "p95_ms": round(self.p95_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "mean_ms": round(self.mean_ms, 3),
            "max_ms": round(self.max_ms, 3),
        }


class SlidingWindow:
    """Samples of the last ``window_s`` seconds.

    Args:
        window_s: how far back samples count.
        max_samples: hard cap on memory; past it the oldest samples go first.
    """

    def __init__(self, window_s: float, max_samples: int) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque(maxlen=max_samples)

    def add(self, value_s: float, now: float | None = None) -> None:
        self._samples.append((time.monotonic() if now is None else now, value_s))

    def _trim(self, now: float) -> None:
        cutoff = now - self.window_s
        while self._samples and self._samples[0][0] < cutoff:
            self._samples.popleft()

    def values(self, now: float | None = None) -> list[float]:
        self._trim(time.monotonic() if now is None else now)
        return [v for _, v in self._samples]

    def summary(self, now: float | None = None) -> LatencySummary | None:
        """Quantiles of the current window, or ``None`` when it is empty."""
        values = sorted(self.values(now))
        if not values:
            return None
        ms = [v * 1000.0 for v in values]
        return LatencySummary(
            count=len(ms),
            p50_ms=quantile(ms, 0.50),
            p95_ms=quantile(ms, 0.95),
            p99_ms=quantile(ms, 0.99),
            mean_ms=sum(ms) / len(ms),
            max_ms=ms[-1],
        )


@dataclass
class TritonTimes:
    """Triton's own per-model time split over a window, from its statistics extension.

    Triton reports cumulative counts and nanoseconds; the difference between two polls, divided by
    the requests in between, is the mean queue / compute time of those requests.
    """

    requests: int = 0
    queue_ns: int = 0
    compute_ns: int = 0
    success_ns: int = 0
    _history: deque[tuple[float, int, int, int, int]] = field(default_factory=deque, repr=False)

    def as_dict(self) -> dict[str, float | int]:
        per = max(self.requests, 1)
        return {
            "requests": self.requests,
            "queue_mean_ms": round(self.queue_ns / per / 1e6, 3),
            "compute_mean_ms": round(self.compute_ns / per / 1e6, 3),
            "request_mean_ms": round(self.success_ns / per / 1e6, 3),
        }


class LatencyTracker:
    """Per-model and per-client latency, for one app instance.

    Args:
        window_s: the sliding window of ``/v1/stats``.
        max_samples: cap per series.
        max_client_labels: distinct client ids with their own series; the rest share ``_other``.
    """

    def __init__(
        self, window_s: float = 60.0, max_samples: int = 20_000, max_client_labels: int = 100
    ) -> None:
        self.window_s = window_s
        self.max_samples = max_samples
        self.max_client_labels = max_client_labels
        self.registry = CollectorRegistry(auto_describe=True)
        self._models: dict[str, SlidingWindow] = {}
        self._clients: dict[str, SlidingWindow] = {}
        self._triton: dict[str, TritonTimes] = {}
        self._started = time.time()
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
        self.rejections = Counter(
            "gateway_rejected_requests",
            "Requests refused before reaching Triton, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "gateway_in_flight_requests",
            "Requests being served now, per model.",
            ["model"],
            registry=self.registry,
        )
        self.triton_queue = Gauge(
            "gateway_triton_queue_mean_seconds",
            "Triton's mean queue time per request over the stats window (statistics extension).",
            ["model"],
            registry=self.registry,
        )
        self.triton_compute = Gauge(
            "gateway_triton_compute_mean_seconds",
            "Triton's mean compute (infer) time per request over the stats window (statistics extension).",
            ["model"],
            registry=self.registry,
        )

    def client_label(self, client: str) -> str:
        """``client`` if it already has, or may still get, its own series; otherwise ``_other``."""
        if client in self._clients or len(self._clients) < self.max_client_labels:
            return client
        return OTHER_CLIENT

    def _window(self, table: dict[str, SlidingWindow], name: str) -> SlidingWindow:
        window = table.get(name)
        if window is None:
            window = table[name] = SlidingWindow(self.window_s, self.max_samples)
        return window

    def record(self, model: str, client: str, status: int, seconds: float) -> None:
        """One admitted request's latency.

        Args:
            model: the Triton model.
            client: the caller's public id (never a secret).
            status: the HTTP status answered.
            seconds: wall time in the gateway.
        """
        label = self.client_label(client)
        self.request_seconds.labels(model, str(status)).observe(seconds)
        self.client_seconds.labels(label).observe(seconds)
        if status < 400:
            # Quantiles describe served requests; errors are counted by status in Prometheus.
            now = time.monotonic()
            self._window(self._models, model).add(seconds, now)
            self._window(self._clients, label).add(seconds, now)

    def reject(self, reason: str) -> None:
        self.rejections.labels(reason).inc()

    def update_triton(
        self, model: str, requests: int, queue_ns: int, compute_ns: int, success_ns: int
    ) -> None:
        """Feed one poll of Triton's cumulative statistics for ``model``.

        Args:
            model: the model.
            requests: cumulative successful request count.
            queue_ns / compute_ns / success_ns: cumulative nanoseconds.
        """
        times = self._triton.setdefault(model, TritonTimes())
        now = time.monotonic()
        history = times._history
        history.append((now, requests, queue_ns, compute_ns, success_ns))
        while len(history) > 2 and history[1][0] <= now - self.window_s:
            history.popleft()
        first = history[0]
        times.requests = requests - first[1]
        times.queue_ns = queue_ns - first[2]
        times.compute_ns = compute_ns - first[3]
        times.success_ns = success_ns - first[4]
        if times.requests < 0:  # Triton restarted: counters went back to zero
            history.clear()
            history.append((now, requests, queue_ns, compute_ns, success_ns))
            times.requests = times.queue_ns = times.compute_ns = times.success_ns = 0
        per = max(times.requests, 1)
        self.triton_queue.labels(model).set(times.queue_ns / per / 1e9)
        self.triton_compute.labels(model).set(times.compute_ns / per / 1e9)

    def snapshot(self, models: Iterable[str] | None = None) -> dict[str, object]:
        """The ``/v1/stats`` document."""
        now = time.monotonic()
        names = sorted(set(self._models) | set(self._triton)) if models is None else sorted(models)
        per_model: dict[str, object] = {}
        for name in names:
            window = self._models.get(name)
            summary = window.summary(now) if window else None
            triton = self._triton.get(name)
            per_model[name] = {
                "gateway": summary.as_dict() if summary else None,
                "triton": triton.as_dict() if triton else None,
            }
        per_client: dict[str, object] = {}
        for client, window in sorted(self._clients.items()):
            summary = window.summary(now)
            if summary:
                per_client[client] = summary.as_dict()
        return {"window_s": self.window_s, "models": per_model, "clients": per_client}
