"""Fault 1 - overload: 2x the saturating load through the gateway.

First a short ramp finds the throughput plateau (the saturating concurrency ``C``); then a gateway
whose in-flight bound is ``C`` per model takes ``2C`` closed-loop clients that retry at once, for
``RELIABILITY_OVERLOAD_S`` seconds (default 20: the issue's 60 s does not fit "each test under a
minute on 2 cores"; set it to 60 for the full run). Everything not admitted must be a 429/503 with
Retry-After, no other 5xx, and the gateway's RSS must stay flat. The P99 of admitted requests is
printed beside ``RELIABILITY_SLO_P99_MS`` (default 500 ms) for the reader, never asserted: a timing
depends on the machine, and the suite must not fail because the machine is busy.
"""

from __future__ import annotations

import json
import os
import time

import psutil
import pytest

from loadtest.loadgen import HttpTarget, LoadSpec, Samples, run
from serving.quantiles import quantile
from tests.support.gateway_procs import create_key

pytestmark = pytest.mark.integration

OVERLOAD_S = float(os.environ.get("RELIABILITY_OVERLOAD_S", "20"))
SLO_P99_MS = float(os.environ.get("RELIABILITY_SLO_P99_MS", "500"))
RAMP = (1, 2, 4, 8, 16)
RAMP_STEP_S = 1.5
#: RSS may grow this much during the overload (allocator noise, the latency window filling up)
RSS_SLACK_BYTES = 48 * 1024 * 1024

BODY = json.dumps(
    {
        "inputs": [
            {"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}
        ]
    }
).encode()


def _load(
    url: str, headers: dict[str, str], concurrency: int, duration_s: float, warmup_s: float = 0.0
) -> Samples:
    target = HttpTarget(
        url=url,
        requests=((BODY, {"Content-Type": "application/json"}),),
        headers=headers,
        timeout_s=15,
    )
    (load,) = run(
        [LoadSpec(target=target, concurrency=concurrency, duration_s=duration_s, warmup_s=warmup_s)]
    )
    return load.measured()


def _rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


def _saturating_concurrency(
    url: str, headers: dict[str, str]
) -> tuple[int, list[tuple[int, float, float]]]:
    """The smallest concurrency whose throughput is within 10% of the best one in the ramp."""
    ramp = []
    for concurrency in RAMP:
        samples = _load(url, headers, concurrency, RAMP_STEP_S)
        assert set(samples.statuses()) == {200}, samples.describe()
        ramp.append(
            (concurrency, len(samples) / RAMP_STEP_S, quantile(samples.latency_s * 1000, 0.99))
        )
    best = max(rate for _, rate, _ in ramp)
    saturating = next(c for c, rate, _ in ramp if rate >= 0.9 * best)
    return saturating, ramp


def test_overload_sheds_with_retry_after_and_keeps_admitted_p99(  # type: ignore[no-untyped-def]
    rel_triton, gateways
) -> None:
    probe = gateways(rel_triton.http_url, log_level="warning")
    headers, _ = create_key(probe)
    url = probe.url + "/v2/models/tiny_linear/infer"
    _load(url, headers, concurrency=2, duration_s=0.5)  # warm connections and caches
    saturating, ramp = _saturating_concurrency(url, headers)
    print(
        "\n[overload] ramp (concurrency, ok/s, p99 ms):",
        [(c, round(r), round(p, 1)) for c, r, p in ramp],
    )
    print(
        f"[overload] saturating concurrency C={saturating}; offering 2C={2 * saturating} "
        f"for {OVERLOAD_S:.0f} s"
    )
    probe.stop()

    # The gateway under test: in-flight bound = the saturating concurrency (shed the rest).
    gateway = gateways(rel_triton.http_url, max_in_flight_per_model=saturating, log_level="warning")
    headers, _ = create_key(gateway)
    url = gateway.url + "/v2/models/tiny_linear/infer"
    _load(url, headers, concurrency=saturating, duration_s=1.0)  # warm-up
    assert gateway.process.pid is not None
    rss_before = _rss(gateway.process.pid)
    started = time.monotonic()
    samples = list(_load(url, headers, concurrency=2 * saturating, duration_s=OVERLOAD_S))
    elapsed = time.monotonic() - started
    rss_after = _rss(gateway.process.pid)

    refused = [s for s in samples if s.status in (429, 503)]
    failed = [s for s in samples if s.status not in (200, 429, 503)]
    admitted = [s.latency_s * 1000 for s in samples if s.status == 200]
    admitted_p99 = quantile(admitted, 0.99) if admitted else float("nan")
    refused_p99 = quantile([s.latency_s * 1000 for s in refused], 0.99) if refused else float("nan")
    print(f"[overload] {Samples.of(samples).describe(elapsed)}")
    print(
        f"[overload] sent={len(samples)} admitted={len(admitted)} refused={len(refused)} "
        f"failed={len(failed)} admitted_p99={admitted_p99:.1f} ms (SLO {SLO_P99_MS:.0f} ms) "
        f"refused_p99={refused_p99:.1f} ms"
    )
    print(
        f"[overload] gateway RSS before={rss_before / 2**20:.1f} MiB after={rss_after / 2**20:.1f} MiB "
        f"(delta {(rss_after - rss_before) / 2**20:+.1f} MiB)"
    )

    assert gateway.process.running(), "the gateway died under overload"
    assert not failed, f"answers other than 200/429/503: {Samples.of(failed).describe()}"
    assert refused, "2x the saturating load was never shed: the in-flight bound did not engage"
    assert all(s.retry_after and int(s.retry_after) >= 1 for s in refused), (
        "a refusal without Retry-After"
    )
    assert rss_after - rss_before <= RSS_SLACK_BYTES, "gateway memory grew under overload"
