"""Latency tracking: mergeable quantiles for ``/v1/stats``, Prometheus histograms for ``/metrics``.

Two views of the same measurements, for two readers:

- Time-bucketed sketches (:mod:`gateway.observe.latency`, :mod:`serving.quantiles`: DDSketch, 1% relative
  error) per (model, client) over the stats window, with no sample cap, so the window is the full
  window at any rate. Shared through Redis or a SQLite file (:mod:`gateway.observe.stats_store`) so that
  ``/v1/stats`` covers every worker and replica.
- Prometheus histograms (:mod:`gateway.observe.metrics`, in a registry owned by the app, never the
  global one) with geometric buckets 25% apart from 0.25 ms to 60 s, so a P99 read through
  ``histogram_quantile`` is within one bucket (~12%) of the truth, and histograms from several
  replicas add up (summaries would not).

Label values are bounded: model labels come only from admitted requests (admission refuses names
the model repository does not have) and Triton's own statistics; client label values are capped
(``max_client_labels``), beyond the cap a client is counted as ``_other``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.observe.latency import LatencyWindows, Series, merge_entries
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.stats_store import EncodedEntry, SketchStore, StatsStoreError
from serving.quantiles import LatencySketch

__all__ = ["LatencyTracker", "TritonTimes", "WindowView"]

log = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class WindowView:
    """The window's sketches, merged over time buckets and processes.

    Attributes:
        series: one sketch per (model, client) pair.
        complete: False when the shared store could not be read (only this process is counted).
    """

    series: dict[Series, LatencySketch]
    complete: bool


_MAX_CACHED_VIEWS = 1024


def _merge_encoded(entries: list[EncodedEntry]) -> dict[Series, LatencySketch]:
    blobs: dict[Series, list[bytes]] = {}
    for entry in entries:
        blobs.setdefault((entry.model, entry.client), []).append(entry.blob)
    merged = {}
    for key, encoded in blobs.items():
        try:
            merged[key] = LatencySketch.merged(encoded)
        except (
            ValueError
        ) as exc:  # a process of another version, or a damaged entry: skip the series' remote part
            log.warning("latency stats: unreadable sketches for %s skipped: %s", key, exc)
    return merged


class LatencyTracker(GatewayMetrics):
    """Per-model and per-client latency, for one app instance (one process).

    Args:
        window_s: the window of ``/v1/stats``.
        bucket_s: its time resolution (the width of one time bucket).
        max_series: (model, client) pairs per time bucket before new clients fold into ``_other``.
        max_client_labels: distinct client label values in Prometheus; the rest share ``_other``.
    """

    def __init__(
        self,
        window_s: float = 60.0,
        bucket_s: float = 5.0,
        max_series: int = 1000,
        max_client_labels: int = 100,
    ) -> None:
        super().__init__(max_client_labels)
        self.window_s = window_s
        # Names this process in the shared store: unique per process, never reused after a restart.
        self.process_id = uuid.uuid4().hex[:16]
        self.windows = LatencyWindows(window_s, bucket_s, max_series)
        self.store: SketchStore | None = None
        self._publishing = True  # False while the shared store refuses publications
        # Other processes' merged sketches per reader scope, reused for remote_ttl_s: they are
        # published that often anyway, and a client polling /v1/stats then costs no store reads.
        self.remote_ttl_s = 1.0
        self._remote: dict[str | None, tuple[float, dict[Series, LatencySketch]]] = {}
        self._triton: dict[str, TritonTimes] = {}

    @property
    def bucket_s(self) -> float:
        return self.windows.bucket_s

    def record(
        self,
        model: str,
        client: str,
        status: int,
        seconds: float,
        stages: Mapping[str, float] | None = None,
    ) -> None:
        """One admitted request's latency.

        Args:
            model: the Triton model (admitted, so known).
            client: the caller's public id (never a secret).
            status: the HTTP status answered.
            seconds: wall time in the gateway.
            stages: the seconds of each stage it went through (:mod:`gateway.observe.timing`).
        """
        self.labelled(self.request_seconds, model, str(status)).observe(seconds)
        for stage, stage_seconds in (stages or {}).items():
            self.labelled(self.stage_seconds, model, stage).observe(stage_seconds)
        self.labelled(self.client_seconds, self.client_label(client)).observe(seconds)
        if status < 400:
            # Quantiles describe served requests; errors are counted by status in Prometheus.
            self.windows.record(model, client, seconds)

    # -- sharing across processes -------------------------------------------------------------

    async def publish(self) -> None:
        """Send the sketches that changed since the last call to the shared store (if any).

        A failed publication is retried with the next call; the error is logged, not raised.
        """
        if self.store is None:
            return
        entries = self.windows.take_dirty()
        if not entries:
            return
        keep = self.window_s + 2 * self.bucket_s
        expires = {e.bucket: (e.bucket + 1) * self.bucket_s + keep for e in entries}
        try:
            await self.store.publish(self.process_id, entries, expires)
        except StatsStoreError as exc:
            self.windows.mark_dirty(entries)
            if self._publishing:  # once per outage, not once per interval
                log.warning(
                    "latency stats: publishing to the shared store failed (%s); retrying", exc
                )
            self._publishing = False
            return
        if not self._publishing:
            log.warning("latency stats: publishing to the shared store works again")
        self._publishing = True

    async def publish_forever(self, interval_s: float) -> None:
        """Publish every ``interval_s`` until cancelled (a lifespan task)."""
        while True:
            await asyncio.sleep(interval_s)
            await self.publish()

    async def view(self, client: str | None = None) -> WindowView:
        """The window's sketches: this process's live ones plus every other process's published ones.

        Args:
            client: only this client's series (what a client credential may see); ``None`` for all.
        """
        now = time.time()
        local = merge_entries(
            self.windows.entries(now, client)
        )  # copies: records may go on meanwhile
        if self.store is None:
            return WindowView(local, True)
        cached = self._remote.get(client)
        if cached is not None and time.monotonic() - cached[0] < self.remote_ttl_s:
            remote = cached[1]
        else:
            try:
                encoded = await self.store.read(self.windows.buckets(now), client, self.process_id)
            except StatsStoreError as exc:
                log.warning(
                    "latency stats: reading the shared store failed (%s); local figures only", exc
                )
                return WindowView(local, False)
            # Merging every worker's and replica's sketches is CPU work: off the event loop.
            remote = await asyncio.to_thread(_merge_encoded, encoded)
            if len(self._remote) >= _MAX_CACHED_VIEWS:
                self._remote.clear()
            self._remote[client] = (time.monotonic(), remote)
        series = dict(remote)  # the cached sketches themselves are never changed
        for key, sketch in local.items():
            if key in series:
                sketch.merge(series[key])  # ``sketch`` is already a copy
            series[key] = sketch
        return WindowView(series, True)

    # -- Triton's split -----------------------------------------------------------------------

    def update_triton(
        self, model: str, requests: int, queue_ns: int, compute_ns: int, success_ns: int
    ) -> None:
        """Feed one poll of Triton's cumulative statistics for ``model``.

        Args:
            model: the model (from Triton's own repository, so known).
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

    def triton_times(self) -> dict[str, TritonTimes]:
        """Triton's split per model, as last polled by this process."""
        return dict(self._triton)
