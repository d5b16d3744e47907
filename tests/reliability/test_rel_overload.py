"""Fault 1 - overload: 2x the saturating load through the gateway.

First a short ramp finds the throughput plateau (the saturating concurrency ``C``); then a gateway
whose in-flight bound is ``C`` per model takes ``2C`` closed-loop clients that retry at once, for
``RELIABILITY_OVERLOAD_S`` seconds (default 20: the issue's 60 s does not fit "each test under a
minute on 2 cores"; set it to 60 for the full run). Admitted requests must keep their P99 within the
SLO, everything else must be a 429/503 with Retry-After, no other 5xx, and the gateway's RSS must
stay flat.

SLO (tiny_linear, a ~1 ms model, through the gateway on the shared 2-core box):
P99 of admitted requests <= ``RELIABILITY_SLO_P99_MS`` (default 500 ms).
"""

from __future__ import annotations

import json
import os
import time

import psutil
import pytest
from _load import percentile, run_closed_loop, summarize
from conftest import create_key

pytestmark = pytest.mark.integration

OVERLOAD_S = float(os.environ.get("RELIABILITY_OVERLOAD_S", "20"))
SLO_P99_MS = float(os.environ.get("RELIABILITY_SLO_P99_MS", "500"))
RAMP = (1, 2, 4, 8, 16)
RAMP_STEP_S = 1.5
#: RSS may grow this much during the overload (allocator noise, the latency window filling up)
RSS_SLACK_BYTES = 48 * 1024 * 1024

BODY = json.dumps(
    {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}]}
).encode()


def _rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


def _saturating_concurrency(url: str, headers: dict[str, str]) -> tuple[int, list[tuple[int, float, float]]]:
    """The smallest concurrency whose throughput is within 10% of the best one in the ramp."""
    ramp = []
    for concurrency in RAMP:
        samples = run_closed_loop(url, BODY, headers, concurrency=concurrency, duration_s=RAMP_STEP_S)
        ok = [s for s in samples if s.status == 200]
        assert len(ok) == len(samples), summarize(samples)
        ramp.append((concurrency, len(ok) / RAMP_STEP_S, percentile([s.latency_s * 1000 for s in ok], 99)))
    best = max(rate for _, rate, _ in ramp)
    saturating = next(c for c, rate, _ in ramp if rate >= 0.9 * best)
    return saturating, ramp


def test_overload_sheds_with_retry_after_and_keeps_admitted_p99(rel_triton, gateways) -> None:  # type: ignore[no-untyped-def]
    probe = gateways(rel_triton.http_url, log_level="warning")
    headers, _ = create_key(probe)
    url = probe.url + "/v2/models/tiny_linear/infer"
    run_closed_loop(url, BODY, headers, concurrency=2, duration_s=0.5)  # warm connections and caches
    saturating, ramp = _saturating_concurrency(url, headers)
    print("\n[overload] ramp (concurrency, ok/s, p99 ms):", [(c, round(r), round(p, 1)) for c, r, p in ramp])
    print(
        f"[overload] saturating concurrency C={saturating}; offering 2C={2 * saturating} for {OVERLOAD_S:.0f} s"
    )
    probe.stop()

    # The gateway under test: in-flight bound = the saturating concurrency (shed the rest).
    gateway = gateways(rel_triton.http_url, max_in_flight_per_model=saturating, log_level="warning")
    headers, _ = create_key(gateway)
    url = gateway.url + "/v2/models/tiny_linear/infer"
    run_closed_loop(url, BODY, headers, concurrency=saturating, duration_s=1.0)  # warm-up
    rss_before = _rss(gateway.process.pid)
    started = time.monotonic()
    samples = run_closed_loop(url, BODY, headers, concurrency=2 * saturating, duration_s=OVERLOAD_S)
    elapsed = time.monotonic() - started
    rss_after = _rss(gateway.process.pid)

    figures = summarize(samples, elapsed)
    refused = [s for s in samples if s.status in (429, 503)]
    failed = [s for s in samples if s.status not in (200, 429, 503)]
    admitted_p99 = percentile([s.latency_s * 1000 for s in samples if s.status == 200], 99)
    refused_p99 = percentile([s.latency_s * 1000 for s in refused], 99)
    print(f"[overload] {figures}")
    print(
        f"[overload] sent={len(samples)} admitted={figures['statuses'].get(200, 0)} refused={len(refused)} "  # type: ignore[union-attr]
        f"failed={len(failed)} admitted_p99={admitted_p99:.1f} ms (SLO {SLO_P99_MS:.0f} ms) "
        f"refused_p99={refused_p99:.1f} ms"
    )
    print(
        f"[overload] gateway RSS before={rss_before / 2**20:.1f} MiB after={rss_after / 2**20:.1f} MiB "
        f"(delta {(rss_after - rss_before) / 2**20:+.1f} MiB)"
    )

    assert gateway.process.poll() is None, "the gateway died under overload"
    assert not failed, f"answers other than 200/429/503: {figures['statuses']}"
    assert refused, "2x the saturating load was never shed: the in-flight bound did not engage"
    assert all(s.retry_after and int(s.retry_after) >= 1 for s in refused), "a refusal without Retry-After"
    assert admitted_p99 <= SLO_P99_MS, f"admitted P99 {admitted_p99:.1f} ms is over the SLO {SLO_P99_MS} ms"
    assert rss_after - rss_before <= RSS_SLACK_BYTES, "gateway memory grew under overload"
