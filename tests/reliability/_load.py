"""A small closed-loop load generator on aiohttp, and the figures the fault tests print.

Closed loop: ``concurrency`` workers each send one request, wait for the answer, and send the next,
until the deadline. Every answer becomes a :class:`Sample` (send time, latency, status, Retry-After,
whether the body was the right answer); transport failures are status 0.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

__all__ = ["Sample", "closed_loop", "percentile", "run_closed_loop", "summarize"]


@dataclass(frozen=True)
class Sample:
    t0: float  # time.monotonic() when sent
    latency_s: float
    status: int  # 0: the connection failed (no HTTP answer at all)
    retry_after: str | None
    correct: bool | None  # None: no check for this status

    @property
    def t1(self) -> float:
        return self.t0 + self.latency_s


Checker = Callable[[int, bytes], bool | None]


async def closed_loop(
    url: str,
    body: bytes,
    headers: dict[str, str],
    *,
    concurrency: int,
    duration_s: float,
    check: Checker | None = None,
    timeout_s: float = 15.0,
    stop: asyncio.Event | None = None,
    honour_retry_after: bool = False,
) -> list[Sample]:
    """Drive ``url`` with POSTs of ``body`` from ``concurrency`` workers for ``duration_s``.

    Args:
        honour_retry_after: a refused worker waits ``Retry-After`` seconds before its next call
            (a polite client); otherwise it retries at once (the worst case).

    Returns:
        One sample per request, in completion order.
    """
    samples: list[Sample] = []
    deadline = time.monotonic() + duration_s
    hdrs = {"Content-Type": "application/json", **headers}
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
                t0 = time.monotonic()
                try:
                    async with session.post(url, data=body, headers=hdrs) as resp:
                        payload = await resp.read()
                        status = resp.status
                        retry_after = resp.headers.get("Retry-After")
                except (aiohttp.ClientError, TimeoutError):
                    status, payload, retry_after = 0, b"", None
                latency = time.monotonic() - t0
                correct = check(status, payload) if check is not None else None
                samples.append(Sample(t0, latency, status, retry_after, correct))
                if status == 0:
                    await asyncio.sleep(0.01)  # the gateway itself is gone: do not spin
                elif honour_retry_after and retry_after is not None and status in (429, 503):
                    await asyncio.sleep(min(float(retry_after), max(0.0, deadline - time.monotonic())))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples


def run_closed_loop(url: str, body: bytes, headers: dict[str, str], **kwargs: object) -> list[Sample]:
    """:func:`closed_loop` from synchronous code."""
    return asyncio.run(closed_loop(url, body, headers, **kwargs))  # type: ignore[arg-type]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); ``nan`` for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[rank]


def summarize(samples: Sequence[Sample], duration_s: float | None = None) -> dict[str, object]:
    """Counts per status and latency figures (ms) for all answers and for the 200s."""
    ok = [s.latency_s * 1000 for s in samples if s.status == 200]
    span = duration_s or (
        (max(s.t1 for s in samples) - min(s.t0 for s in samples)) if samples else float("nan")
    )
    return {
        "sent": len(samples),
        "statuses": dict(sorted(Counter(s.status for s in samples).items())),
        "ok_per_s": round(len(ok) / span, 1) if span else float("nan"),
        "ok_p50_ms": round(percentile(ok, 50), 1),
        "ok_p99_ms": round(percentile(ok, 99), 1),
        "ok_max_ms": round(max(ok), 1) if ok else float("nan"),
    }
