"""What a closed loop records (one sample per completed request) and the figures made from it.

Samples are kept as columns (numpy arrays), so a run of a few hundred thousand requests crosses
process boundaries cheaply and merges by concatenation; times are ``time.monotonic()`` seconds,
which is one clock for every process on the machine. Percentiles come from the platform's one
definition, :mod:`serving.quantiles`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from serving.quantiles import summarize as summarize_values

__all__ = ["LoadResult", "Sample", "Samples", "summarize", "summarize_windows", "tail_burst"]

TRANSPORT_FAILURE = 0
"""The status of a request that got no answer at all (refused, reset, timed out)."""
_NOT_CHECKED = -1
#: :func:`tail_burst`'s bin: about the length of one stall that would make a P99 on its own
TAIL_BIN_S = 0.1


@dataclass(frozen=True)
class Sample:
    """One completed request."""

    t0: float  # time.monotonic() when sent
    latency_s: float
    status: int  # HTTP status (gRPC codes mapped to their HTTP equivalents); 0: no answer
    retry_after: float | None
    correct: bool | None  # None: the answer was not checked

    @property
    def t1(self) -> float:
        return self.t0 + self.latency_s


@dataclass(frozen=True)
class Samples:
    """Every request a closed loop completed, as columns, plus the first error message per status."""

    t0: np.ndarray = field(default_factory=lambda: np.empty(0))
    latency_s: np.ndarray = field(default_factory=lambda: np.empty(0))
    status: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int32))
    retry_after: np.ndarray = field(default_factory=lambda: np.empty(0))  # nan: no Retry-After
    correct: np.ndarray = field(
        default_factory=lambda: np.empty(0, dtype=np.int8)
    )  # 1, 0, -1: unchecked
    messages: dict[int, str] = field(default_factory=dict)

    @classmethod
    def from_rows(
        cls,
        rows: Sequence[tuple[float, float, int, float | None, bool | None]],
        messages: dict[int, str],
    ) -> Samples:
        """Columns from ``(t0, latency_s, status, retry_after, correct)`` rows."""
        if not rows:
            return cls(messages=dict(messages))
        t0, latency, status, retry_after, correct = zip(*rows, strict=True)
        return cls(
            t0=np.asarray(t0, dtype=np.float64),
            latency_s=np.asarray(latency, dtype=np.float64),
            status=np.asarray(status, dtype=np.int32),
            retry_after=np.asarray(
                [math.nan if r is None else r for r in retry_after], dtype=np.float64
            ),
            correct=np.asarray(
                [_NOT_CHECKED if c is None else int(c) for c in correct], dtype=np.int8
            ),
            messages=dict(messages),
        )

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> Samples:
        """Columns from :class:`Sample` objects (a selection made in a test, say)."""
        return cls.from_rows(
            [(x.t0, x.latency_s, x.status, x.retry_after, x.correct) for x in samples], {}
        )

    @classmethod
    def concat(cls, parts: Sequence[Samples]) -> Samples:
        """All samples of ``parts`` (the processes of one run), in send order."""
        parts = [p for p in parts if len(p)] or list(parts[:1]) or [cls()]
        messages: dict[int, str] = {}
        for part in parts:
            for status, message in part.messages.items():
                messages.setdefault(status, message)
        columns = {
            name: np.concatenate([getattr(p, name) for p in parts])
            for name in ("t0", "latency_s", "status", "retry_after", "correct")
        }
        merged = cls(**columns, messages=messages)
        return merged.where(np.argsort(merged.t0, kind="stable"))

    def where(self, index: np.ndarray) -> Samples:
        """The samples selected by a boolean mask or an index array."""
        return replace(
            self,
            t0=self.t0[index],
            latency_s=self.latency_s[index],
            status=self.status[index],
            retry_after=self.retry_after[index],
            correct=self.correct[index],
        )

    @property
    def t1(self) -> np.ndarray:
        return self.t0 + self.latency_s

    @property
    def ok(self) -> np.ndarray:
        """Mask of the successes: status 200 and not a wrong answer."""
        return (self.status == 200) & (self.correct != 0)

    def statuses(self) -> dict[int, int]:
        return {int(k): int(v) for k, v in sorted(Counter(self.status.tolist()).items())}

    def describe(self, duration_s: float | None = None) -> str:
        """One line for a log: count, statuses, rate and latency of the 200s (ms), first errors."""
        span = duration_s or (float(self.t1.max() - self.t0.min()) if len(self) else 0.0)
        ok = self.latency_s[self.status == 200] * 1000.0
        summary = summarize_values(ok)
        figures = (
            f"p50={summary.p50:.1f} p99={summary.p99:.1f} max={summary.max:.1f} ms"
            if summary
            else "no 200s"
        )
        rate = f"{ok.size / span:.1f}/s" if span else "-"
        errors = "".join(
            f"; {status}: {message[:120]}" for status, message in sorted(self.messages.items())
        )
        return f"sent={len(self)} statuses={self.statuses()} ok={rate} {figures}{errors}"

    def __len__(self) -> int:
        return int(self.t0.size)

    def __iter__(self) -> Iterator[Sample]:
        for t0, latency, status, retry_after, correct in zip(
            self.t0.tolist(),
            self.latency_s.tolist(),
            self.status.tolist(),
            self.retry_after.tolist(),
            self.correct.tolist(),
            strict=True,
        ):
            yield Sample(
                t0,
                latency,
                status,
                None if math.isnan(retry_after) else retry_after,
                None if correct == _NOT_CHECKED else bool(correct),
            )


@dataclass(frozen=True)
class LoadResult:
    """The figures of one closed-loop run over its measured window.

    Throughput counts successful requests that *completed* inside the window, per second of it;
    latencies are theirs. ``capacity`` is the load generator's own throughput with the same
    settings against a model that answers at once (``None`` where it was not measured).
    """

    name: str
    concurrency: int
    processes: int
    duration_s: float
    requests: int
    errors: int
    throughput: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    statuses: dict[int, int]
    messages: dict[int, str]
    wrong_answers: int = 0
    capacity: float | None = None
    #: :func:`tail_burst` of the successes (``None``: too few to have a slowest 1%)
    tail_burst: float | None = None

    @property
    def error_rate(self) -> float:
        total = self.requests + self.errors
        return self.errors / total if total else 0.0

    @property
    def capacity_used(self) -> float | None:
        """Throughput as a share of the load generator's capacity: near 1, the client was the limit."""
        return self.throughput / self.capacity if self.capacity else None

    def with_capacity(self, capacity: float) -> LoadResult:
        return replace(self, capacity=capacity)

    def error_summary(self) -> str:
        """``"status N xCOUNT: first message"`` for every failing status, or ``""``."""
        failing = {s: n for s, n in self.statuses.items() if s != 200}
        parts = [
            f"status {s} x{n}: {self.messages.get(s, '')}".rstrip(": ") for s, n in failing.items()
        ]
        if self.wrong_answers:
            parts.append(f"{self.wrong_answers} wrong answers")
        return "; ".join(parts)


def summarize(
    samples: Samples, name: str, concurrency: int, processes: int, window: tuple[float, float]
) -> LoadResult:
    """The :class:`LoadResult` of the samples that completed inside ``window`` (monotonic seconds)."""
    return summarize_windows([(samples, window)], name, concurrency, processes)


def summarize_windows(
    parts: Sequence[tuple[Samples, tuple[float, float]]],
    name: str,
    concurrency: int,
    processes: int,
) -> LoadResult:
    """One :class:`LoadResult` over several measured windows of the same load (rounds taken in turn
    with other loads): each part's samples that completed inside its window, throughput per second of
    all windows together."""
    inside = Samples.concat([s.where((s.t1 >= start) & (s.t1 <= end)) for s, (start, end) in parts])
    ok = inside.ok
    summary = summarize_values(inside.latency_s[ok] * 1000.0)
    nan = math.nan
    duration = sum(end - start for _, (start, end) in parts)
    statuses = inside.statuses()
    messages = {code: m for s, _ in parts for code, m in s.messages.items() if code in statuses}
    return LoadResult(
        name=name,
        concurrency=concurrency,
        processes=processes,
        duration_s=duration,
        requests=int(ok.sum()),
        errors=int((~ok).sum()),
        throughput=float(ok.sum()) / duration if duration > 0 else 0.0,
        p50_ms=summary.p50 if summary else nan,
        p95_ms=summary.p95 if summary else nan,
        p99_ms=summary.p99 if summary else nan,
        mean_ms=summary.mean if summary else nan,
        max_ms=summary.max if summary else nan,
        statuses=statuses,
        messages=messages,
        wrong_answers=int((inside.correct == 0).sum()),
        tail_burst=tail_burst(inside.t1[ok], inside.latency_s[ok]),
    )


def tail_burst(t1: np.ndarray, latency_s: np.ndarray, bin_s: float = TAIL_BIN_S) -> float | None:
    """The share of the slowest 1% of requests that completed within one ``bin_s`` bin, the densest.

    Whether a P99 is one event or the steady state: when something stalls for tens of milliseconds
    (a collector pass, a lock, a connection being opened), every request in flight then finishes
    late at about the same time, so the slowest 1% crowd into a bin or two and the share is near 1.
    A tail spread over the window gives about ``bin_s`` over the window's length. ``None`` for fewer
    than 100 requests (no slowest 1% to speak of).
    """
    n = int(latency_s.size)
    if n < 100:
        return None
    slowest = np.argsort(latency_s, kind="stable")[-max(1, n // 100) :]
    bins = np.floor((t1[slowest] - t1.min()) / bin_s).astype(np.int64)
    return float(np.bincount(bins).max() / slowest.size)
