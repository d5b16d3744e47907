"""The one percentile definition of the platform: a mergeable DDSketch with 1% relative error.

The gateway's ``/v1/stats``, the benchmarks (``loadtest``, ``gateway.bench``) and the promotion gate
all compute P50/P95/P99 here, so their figures mean the same thing and can be compared.

Definition: the ``q`` quantile of ``n`` values is the value at 0-based rank ``floor(q * (n - 1))`` of
the sorted values (numpy's ``method="lower"``), reported within a relative error of
:data:`RELATIVE_ACCURACY` (1%): the figure returned, ``x``, satisfies ``|x - v| <= 0.01 * v`` for that
value ``v``. This is DDSketch's guarantee (Masson, Rim, Lee, VLDB 2019; the ``ddsketch`` package
Datadog maintains), and it holds for any number of values and any merge order.

Why a sketch and not the samples: a sketch is a fixed-size histogram with logarithmic buckets
(about 115 per decade between the smallest and the largest value: some 1,100 buckets, 9 KB, for
latencies from a microsecond to an hour), so it stays small at any request rate, and sketches of
disjoint sets of values merge by adding bucket counts: merging the sketches of several processes or
time buckets gives exactly the sketch of all their values. :meth:`LatencySketch.to_bytes` /
:meth:`LatencySketch.from_bytes` / :meth:`LatencySketch.merged` carry sketches across processes (the
bucket counts plus the exact count, sum, min and max).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from ddsketch import DDSketch
from ddsketch.ddsketch import BaseDDSketch
from ddsketch.mapping import LogarithmicMapping
from ddsketch.store import DenseStore

__all__ = [
    "QUANTILES",
    "RELATIVE_ACCURACY",
    "LatencySketch",
    "QuantileSummary",
    "quantile",
    "rank",
    "summarize",
]

RELATIVE_ACCURACY = 0.01
"""Every quantile this module reports is within 1% of the value at the defining rank."""

QUANTILES = (0.50, 0.95, 0.99)

_MAPPING = LogarithmicMapping(RELATIVE_ACCURACY)
_FORMAT_VERSION = 2
_HEADER = struct.Struct("<BdQdddqdI")  # see LatencySketch.to_bytes


def rank(n: int, q: float) -> int:
    """The 0-based rank whose value is the ``q`` quantile of ``n`` sorted values.

    Args:
        n: how many values (at least one).
        q: in [0, 1].

    Returns:
        ``floor(q * (n - 1))``.
    """
    if n < 1:
        raise ValueError("quantile of no values")
    _check_q(q)
    return math.floor(q * (n - 1))


def _check_q(q: float) -> None:
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {q}")


class LatencySketch:
    """A mergeable distribution of non-negative values (latencies, in any one unit).

    Count, sum, min and max are exact; quantiles are within :data:`RELATIVE_ACCURACY`.
    """

    __slots__ = ("_sketch", "_count", "_sum", "_min", "_max")

    def __init__(self) -> None:
        self._sketch: BaseDDSketch = DDSketch(RELATIVE_ACCURACY)
        # Kept beside the sketch, exact: a sketch rebuilt from bucket counts knows no sum, min or
        # max, and DDSketch's float count would drift for very large counts.
        self._count = 0
        self._sum = 0.0
        self._min = math.inf
        self._max = -math.inf

    @classmethod
    def of(cls, values: Iterable[float]) -> LatencySketch:
        """A sketch holding ``values``."""
        sketch = cls()
        tolist = getattr(values, "tolist", None)  # numpy: Python floats add several times faster
        for value in tolist() if callable(tolist) else values:
            sketch.add(value)
        return sketch

    def add(self, value: float) -> None:
        """Record one value.

        Raises:
            ValueError: ``value`` is negative, infinite or NaN.
        """
        if not 0.0 <= value < math.inf:  # also false for NaN
            raise ValueError(f"a latency must be finite and non-negative, got {value}")
        self._sketch.add(value)
        self._count += 1
        self._sum += value
        if value < self._min:
            self._min = value
        if value > self._max:
            self._max = value

    def merge(self, other: LatencySketch) -> None:
        """Add ``other``'s values to this sketch (``other`` is unchanged)."""
        if other._count == 0:
            return
        self._sketch.merge(other._sketch)
        self._count += other._count
        self._sum += other._sum
        self._min = min(self._min, other._min)
        self._max = max(self._max, other._max)

    def copy(self) -> LatencySketch:
        twin = LatencySketch()
        twin.merge(self)
        return twin

    @property
    def count(self) -> int:
        return self._count

    @property
    def sum(self) -> float:
        return self._sum

    @property
    def min(self) -> float:
        """The smallest value (exact); ``nan`` when empty."""
        return self._min if self._count else math.nan

    @property
    def max(self) -> float:
        """The largest value (exact); ``nan`` when empty."""
        return self._max if self._count else math.nan

    @property
    def mean(self) -> float:
        return self._sum / self._count if self._count else math.nan

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (see the module docstring); exact at the lowest and highest rank.

        Raises:
            ValueError: the sketch is empty or ``q`` is outside [0, 1].
        """
        _check_q(q)
        if self._count == 0:
            raise ValueError("quantile of no values")
        position = rank(self._count, q)
        if position == 0:
            return self._min  # the extremes are known exactly
        if position == self._count - 1:
            return self._max
        value = self._sketch.get_quantile_value(q)
        assert value is not None  # None only for an empty sketch, handled above
        # Clamping keeps the guarantee: the true value lies within [min, max].
        return min(max(float(value), self._min), self._max)

    def to_bytes(self) -> bytes:
        """A compact encoding for another process; :meth:`from_bytes` / :meth:`merged` read it back.

        Layout (little-endian): a header (format, the mapping's gamma, count, sum, min, max, the
        first bucket's key, the count of zeros, the number of buckets), then the bucket counts as
        float64 from the lowest used bucket to the highest. Raw counts rather than DDSketch's
        protobuf: decoding many of them (``/v1/stats`` over every worker and replica) is then one
        ``numpy.frombuffer`` each instead of a Python loop over the buckets.
        """
        store = self._sketch._store  # DenseStore's documented attributes: bins, offset, min/max_key
        used = (
            store.bins[store.min_key - store.offset : store.max_key - store.offset + 1]
            if store.count
            else []
        )
        header = _HEADER.pack(
            _FORMAT_VERSION,
            _MAPPING.gamma,
            self._count,
            self._sum,
            self._min,
            self._max,
            store.min_key if used else 0,
            float(self._count - store.count),
            len(used),
        )
        return header + np.asarray(used, dtype="<f8").tobytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> LatencySketch:
        """Decode :meth:`to_bytes` output.

        Raises:
            ValueError: the bytes are not a sketch of this format and accuracy.
        """
        return cls.merged([data])

    @classmethod
    def merged(cls, blobs: Iterable[bytes]) -> LatencySketch:
        """One sketch of every value in several encoded sketches (``to_bytes`` output), merged.

        Equal to decoding each and merging them, in a fraction of the time: the bucket counts are
        added as arrays and the DDSketch is built once.

        Raises:
            ValueError: one of the blobs is not a sketch of this format and accuracy.
        """
        parts: list[tuple[int, np.ndarray]] = []
        count, total, low, high, zeros = 0, 0.0, math.inf, -math.inf, 0.0
        for data in blobs:
            offset, counts, header = _decode(data)
            if header[2] == 0:
                continue
            parts.append((offset, counts))
            count += header[2]
            total += header[3]
            low, high = min(low, header[4]), max(high, header[5])
            zeros += header[7]
        sketch = cls()
        if count == 0:
            return sketch
        buckets = [p for p in parts if p[1].size]
        if buckets:
            first = min(offset for offset, _ in buckets)
            summed = np.zeros(max(offset + c.size for offset, c in buckets) - first)
            for offset, counts in buckets:
                summed[offset - first : offset - first + counts.size] += counts
            store = _dense_store(summed, first)
        else:
            store = DenseStore()
        # Merged into a fresh sketch, not adopted: the bucket values then come from this
        # process's mapping, bit for bit the same as for values recorded here.
        sketch._sketch.merge(BaseDDSketch(_MAPPING, store, DenseStore(), zeros))
        sketch._count, sketch._sum, sketch._min, sketch._max = count, total, low, high
        return sketch

    def __repr__(self) -> str:
        return f"LatencySketch(count={self._count}, min={self.min}, max={self.max})"


def _decode(data: bytes) -> tuple[int, np.ndarray, tuple[Any, ...]]:
    """``(first bucket key, bucket counts, header)`` of one :meth:`LatencySketch.to_bytes` output."""
    if len(data) < _HEADER.size:
        raise ValueError("not a latency sketch: too short")
    header = _HEADER.unpack_from(data)
    version, gamma, count, _, _, _, offset, zeros, buckets = header
    if version != _FORMAT_VERSION:
        raise ValueError(f"latency sketch format {version} is not {_FORMAT_VERSION}")
    if gamma != _MAPPING.gamma:
        raise ValueError("latency sketch of another accuracy: cannot merge it")
    if len(data) != _HEADER.size + 8 * buckets:
        raise ValueError("not a latency sketch: its length does not match its bucket count")
    counts = np.frombuffer(data, dtype="<f8", offset=_HEADER.size, count=buckets)
    if not (np.isfinite(counts).all() and (counts >= 0).all()) or not 0 <= zeros <= count:
        raise ValueError("not a latency sketch: a bucket count is negative or not finite")
    if float(counts.sum()) + zeros != count:
        raise ValueError("not a latency sketch: its buckets do not add up to its count")
    return offset, counts, header


def _dense_store(values: np.ndarray, offset: int) -> DenseStore:
    """A DDSketch store holding contiguous bucket counts from key ``offset``.

    Built directly (DenseStore's documented attributes): ``ddsketch``'s own decoder adds the buckets
    one by one, which an admin's view of many series over many processes would feel.
    """
    store = DenseStore()
    nonzero = np.flatnonzero(values)
    if nonzero.size:
        store.bins = values.tolist()
        store.offset = offset
        store.min_key = offset + int(nonzero[0])
        store.max_key = offset + int(nonzero[-1])
        store.count = float(values.sum())
    return store


@dataclass(frozen=True)
class QuantileSummary:
    """Count, P50/P95/P99, mean and max of a set of values, in the unit of the values."""

    count: int
    p50: float
    p95: float
    p99: float
    mean: float
    max: float

    def scaled(self, factor: float) -> QuantileSummary:
        """The same summary in another unit (e.g. ``1000.0`` for seconds -> milliseconds)."""
        return QuantileSummary(
            self.count,
            self.p50 * factor,
            self.p95 * factor,
            self.p99 * factor,
            self.mean * factor,
            self.max * factor,
        )


def summarize(values: LatencySketch | Iterable[float]) -> QuantileSummary | None:
    """P50/P95/P99, mean and max of ``values``, or ``None`` when there are none.

    Args:
        values: a sketch, or the raw values (a list, a numpy array).

    Returns:
        The summary; quantiles within :data:`RELATIVE_ACCURACY`, count, mean and max exact.
    """
    sketch = values if isinstance(values, LatencySketch) else LatencySketch.of(values)
    if sketch.count == 0:
        return None
    p50, p95, p99 = (sketch.quantile(q) for q in QUANTILES)
    return QuantileSummary(sketch.count, p50, p95, p99, sketch.mean, sketch.max)


def quantile(values: LatencySketch | Iterable[float], q: float) -> float:
    """The ``q`` quantile of ``values`` by the platform's one definition.

    Raises:
        ValueError: no values, or ``q`` outside [0, 1].
    """
    sketch = values if isinstance(values, LatencySketch) else LatencySketch.of(values)
    return sketch.quantile(q)
