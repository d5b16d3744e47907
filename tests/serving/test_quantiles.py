"""The platform's one percentile definition: accuracy, merging, serialisation (unit tests)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from serving.quantiles import (
    QUANTILES,
    RELATIVE_ACCURACY,
    LatencySketch,
    quantile,
    rank,
    summarize,
)

_QS = [i / 200 for i in range(201)] + [0.999, 0.9999]


def _latencies(n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    # Heavy-tailed, several decades wide, with exact zeros: the shapes latency takes.
    return [rng.lognormvariate(-4.0, 1.5) for _ in range(n)] + [0.0] * (n // 500)


def test_rank_is_the_lower_rank() -> None:
    assert rank(1, 0.99) == 0
    assert rank(100, 0.5) == 49
    assert rank(100, 0.99) == 98
    assert rank(101, 1.0) == 100
    with pytest.raises(ValueError):
        rank(0, 0.5)
    with pytest.raises(ValueError):
        rank(10, 1.5)


@pytest.mark.parametrize("n", [1, 7, 100, 20_000])
def test_quantiles_within_the_stated_relative_error(n: int) -> None:
    values = _latencies(n, seed=n)
    ordered = sorted(values)
    sketch = LatencySketch.of(values)
    for q in _QS:
        truth = ordered[rank(len(ordered), q)]
        assert abs(sketch.quantile(q) - truth) <= RELATIVE_ACCURACY * truth + 1e-15, q
    # Same definition as numpy's "lower" method, within the error.
    truth = float(np.percentile(values, 99, method="lower"))
    assert math.isclose(quantile(values, 0.99), truth, rel_tol=RELATIVE_ACCURACY)


def test_count_sum_min_max_mean_are_exact() -> None:
    values = _latencies(5000, seed=1)
    sketch = LatencySketch.of(values)
    assert sketch.count == len(values)
    assert math.isclose(sketch.sum, math.fsum(values), rel_tol=1e-12)
    assert sketch.min == min(values) and sketch.max == max(values)
    assert sketch.quantile(0.0) == min(values) and sketch.quantile(1.0) == max(values)
    assert math.isclose(sketch.mean, math.fsum(values) / len(values), rel_tol=1e-12)


def test_merge_equals_the_sketch_of_the_union() -> None:
    values = _latencies(30_000, seed=2)
    parts = [values[:1], values[1:9000], values[9000:9001], values[9001:]]
    union = LatencySketch.of(values)
    for order in (parts, parts[::-1]):
        merged = LatencySketch()
        for part in order:
            # Through bytes, as across processes.
            merged.merge(LatencySketch.from_bytes(LatencySketch.of(part).to_bytes()))
        assert merged.count == union.count
        assert merged.min == union.min and merged.max == union.max
        assert math.isclose(merged.sum, union.sum, rel_tol=1e-12)
        assert [merged.quantile(q) for q in _QS] == [union.quantile(q) for q in _QS]


def test_merge_of_an_empty_sketch_changes_nothing() -> None:
    sketch = LatencySketch.of([0.01, 0.02])
    sketch.merge(LatencySketch())
    sketch.merge(LatencySketch.from_bytes(LatencySketch().to_bytes()))
    assert sketch.count == 2 and sketch.max == 0.02
    empty = LatencySketch()
    empty.merge(LatencySketch())
    assert empty.count == 0 and math.isnan(empty.max)


def test_serialisation_round_trip_is_exact() -> None:
    sketch = LatencySketch.of(_latencies(3000, seed=3))
    again = LatencySketch.from_bytes(sketch.to_bytes())
    assert (again.count, again.sum, again.min, again.max) == (
        sketch.count,
        sketch.sum,
        sketch.min,
        sketch.max,
    )
    assert [again.quantile(q) for q in _QS] == [sketch.quantile(q) for q in _QS]
    assert len(sketch.to_bytes()) < 16_000  # a few KB, whatever the count


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x01",
        b"\x01" + bytes(60),
        bytes(57) + b"\xff\xff\xff",
        LatencySketch.of([0.5]).to_bytes()[:-3],
    ],
)
def test_garbage_bytes_are_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        LatencySketch.from_bytes(data)


@pytest.mark.parametrize("value", [-0.001, math.inf, math.nan])
def test_impossible_latencies_are_refused(value: float) -> None:
    with pytest.raises(ValueError):
        LatencySketch().add(value)


def test_empty_inputs() -> None:
    assert summarize([]) is None
    with pytest.raises(ValueError):
        LatencySketch().quantile(0.5)
    with pytest.raises(ValueError):
        quantile([], 0.5)


def test_summarize_numpy_and_scaling() -> None:
    values = np.asarray(_latencies(1000, seed=4))
    summary = summarize(values)
    assert summary is not None and summary.count == values.size
    sketch = LatencySketch.of(values.tolist())
    assert (summary.p50, summary.p95, summary.p99) == tuple(sketch.quantile(q) for q in QUANTILES)
    ms = summary.scaled(1000.0)
    assert math.isclose(ms.p99, summary.p99 * 1000.0) and ms.count == summary.count


def test_a_sketch_whose_buckets_disagree_with_its_count_is_refused() -> None:
    data = bytearray(LatencySketch.of([0.01, 0.02, 0.03]).to_bytes())
    data[9:17] = (7).to_bytes(8, "little")  # the header's count says 7 values, the buckets hold 3
    with pytest.raises(ValueError, match="add up"):
        LatencySketch.from_bytes(bytes(data))


def test_merged_blobs_equal_merged_sketches() -> None:
    values = _latencies(12_000, seed=6)
    parts = [values[i::5] for i in range(5)] + [[], [0.0, 0.0]]
    blobs = [LatencySketch.of(part).to_bytes() for part in parts]
    union = LatencySketch.of(values + [0.0, 0.0])
    merged = LatencySketch.merged(blobs)
    assert (merged.count, merged.min, merged.max) == (union.count, union.min, union.max)
    assert [merged.quantile(q) for q in _QS] == [union.quantile(q) for q in _QS]
    assert LatencySketch.merged([]).count == 0
