"""One process's latency sketches: per (model, client) pair, per time bucket, over the stats window.

The window is cut into buckets of ``bucket_s`` seconds of wall-clock time (bucket ``b`` holds the
requests that finished in ``[b * bucket_s, (b + 1) * bucket_s)``; wall-clock so that every process
and replica cuts the same buckets). Each bucket keeps one :class:`serving.quantiles.LatencySketch`
per (model, client) pair, so nothing is sampled or capped by count: the window stays the full
window at any request rate. Per-model and per-client figures are merges of the pairs (sketches
merge exactly), and so are figures merged across processes.

The pairs per bucket are capped (``max_series``): past the cap a new client's requests are counted
under ``(model, "_other")``, so a flood of credentials cannot grow memory without bound; model names
reach here only after admission has checked them.

Which buckets a read covers: every bucket overlapping ``[now - window_s, now]``, so a read spans
between ``window_s`` and ``window_s + bucket_s`` seconds of traffic.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from serving.quantiles import LatencySketch

__all__ = ["OTHER_CLIENT", "BucketEntry", "LatencyWindows", "Series", "merge_entries"]

OTHER_CLIENT = "_other"

Series = tuple[str, str]
"""(model, client): the unit of latency bookkeeping."""


@dataclass(frozen=True)
class BucketEntry:
    """One series' sketch for one time bucket, as published to (or read from) a shared store."""

    bucket: int
    model: str
    client: str
    sketch: LatencySketch


class LatencyWindows:
    """Time-bucketed sketches of one process.

    Args:
        window_s: how far back a read reaches.
        bucket_s: the width of a time bucket (the window's resolution).
        max_series: distinct (model, client) pairs per bucket before clients fold into ``_other``.
    """

    def __init__(self, window_s: float, bucket_s: float, max_series: int) -> None:
        if bucket_s <= 0 or window_s <= 0:
            raise ValueError("window_s and bucket_s must be positive")
        self.window_s = window_s
        self.bucket_s = bucket_s
        self.max_series = max_series
        self._buckets: dict[int, dict[Series, LatencySketch]] = {}
        self._dirty: set[tuple[int, Series]] = set()

    def bucket_of(self, wall_time: float) -> int:
        return math.floor(wall_time / self.bucket_s)

    def buckets(self, now: float | None = None) -> range:
        """The bucket numbers a read at ``now`` covers (oldest first)."""
        now = time.time() if now is None else now
        return range(self.bucket_of(now - self.window_s), self.bucket_of(now) + 1)

    def record(self, model: str, client: str, seconds: float, now: float | None = None) -> None:
        """One served request's latency.

        Args:
            model: the (admitted) model.
            client: the caller's public id.
            seconds: the latency.
            now: wall-clock time (default: now).
        """
        bucket = self.bucket_of(time.time() if now is None else now)
        table = self._buckets.get(bucket)
        if table is None:
            table = self._buckets[bucket] = {}
            self._forget_before(bucket - math.ceil(self.window_s / self.bucket_s))
        series = (model, client)
        sketch = table.get(series)
        if sketch is None:
            if len(table) >= self.max_series:
                series = (model, OTHER_CLIENT)
                sketch = table.get(series)
            if sketch is None:
                sketch = table[series] = LatencySketch()
        sketch.add(seconds)
        self._dirty.add((bucket, series))

    def _forget_before(self, oldest: int) -> None:
        for bucket in [b for b in self._buckets if b < oldest]:
            del self._buckets[bucket]
        self._dirty = {d for d in self._dirty if d[0] >= oldest}

    def entries(self, now: float | None = None, client: str | None = None) -> Iterator[BucketEntry]:
        """This process's sketches in the window (live objects: merge them, do not change them).

        Args:
            now: the read time (default: now).
            client: only this client's series (``None``: all).
        """
        window = self.buckets(now)
        for bucket in window:
            for (model, owner), sketch in self._buckets.get(bucket, {}).items():
                if client is None or owner == client:
                    yield BucketEntry(bucket, model, owner, sketch)

    def take_dirty(self) -> list[BucketEntry]:
        """Copies of every sketch changed since the last call, to publish (each is the bucket's total
        so far, so publishing it again overwrites rather than adds)."""
        out = []
        for bucket, series in sorted(self._dirty):
            sketch = self._buckets.get(bucket, {}).get(series)
            if sketch is not None:
                out.append(BucketEntry(bucket, series[0], series[1], sketch.copy()))
        self._dirty.clear()
        return out

    def mark_dirty(self, entries: Iterable[BucketEntry]) -> None:
        """Publish these again next time (their publication failed)."""
        for entry in entries:
            if entry.bucket in self._buckets:
                self._dirty.add((entry.bucket, (entry.model, entry.client)))


def merge_entries(entries: Iterable[BucketEntry]) -> dict[Series, LatencySketch]:
    """One sketch per (model, client) pair: the merge of its buckets (and processes)."""
    merged: dict[Series, LatencySketch] = {}
    for entry in entries:
        target = merged.get((entry.model, entry.client))
        if target is None:
            target = merged[(entry.model, entry.client)] = LatencySketch()
        target.merge(entry.sketch)
    return merged
