"""Fault 4 - a slow upstream: ``slow_echo`` (a Python model that sleeps) beside ``tiny_linear``.

The gateway has a 1 s upstream timeout and an in-flight bound of 4 per model. Eight polite clients
(they honour Retry-After) call ``slow_echo`` with a 2.5 s sleep, so every admitted call must end as
a 504 after about 1 s, the bound must turn the rest away with 429 at once, and the in-flight gauge
must never pass 4. Meanwhile ``tiny_linear`` must keep answering 200 (Triton runs the two models on
separate instances; the gateway's per-model bound keeps the slow one from taking every connection);
its P99 before and during is printed, not asserted.
"""

from __future__ import annotations

import asyncio
import json
import re
import time

import aiohttp
import pytest

from loadtest.loadgen import HttpTarget, Samples, closed_loop
from serving.quantiles import quantile
from tests.support.gateway_procs import METRICS_HEADERS, create_key

pytestmark = pytest.mark.integration

UPSTREAM_TIMEOUT_S = 1.0
IN_FLIGHT = 4
SLOW_CLIENTS = 8
SLOW_DELAY_MS = 2500
PHASE_S = 5.0
TINY = json.dumps(
    {
        "inputs": [
            {"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}
        ]
    }
).encode()
SLOW = json.dumps(
    {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "INT32", "data": [SLOW_DELAY_MS]}]}
).encode()
_GAUGE = re.compile(r'^gateway_in_flight_requests\{model="slow_echo"\} ([0-9.]+)$', re.M)


async def _sample_gauge(url: str, stop: asyncio.Event, seen: list[float]) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
        while not stop.is_set():
            async with session.get(url, headers=METRICS_HEADERS) as resp:
                match = _GAUGE.search(await resp.text())
            seen.append(float(match.group(1)) if match else 0.0)
            await asyncio.sleep(0.05)


def test_slow_upstream_504_bounded_in_flight_and_other_models_unaffected(
    rel_triton, gateways
) -> None:  # type: ignore[no-untyped-def]
    gateway = gateways(
        rel_triton.http_url,
        upstream_timeout_s=UPSTREAM_TIMEOUT_S,
        max_in_flight_per_model=IN_FLIGHT,
        log_level="warning",
    )
    headers, _ = create_key(gateway)
    json_body = {"Content-Type": "application/json"}
    tiny = HttpTarget(
        url=gateway.url + "/v2/models/tiny_linear/infer",
        requests=((TINY, json_body),),
        headers=headers,
        timeout_s=15,
    )
    slow = HttpTarget(
        url=gateway.url + "/v2/models/slow_echo/infer",
        requests=((SLOW, json_body),),
        headers=headers,
        timeout_s=15,
    )

    async def scenario() -> tuple[Samples, Samples, Samples, list[float]]:
        baseline = await closed_loop(tiny, concurrency=2, warmup_s=0.5, duration_s=PHASE_S)
        stop = asyncio.Event()
        gauge: list[float] = []
        sampler = asyncio.create_task(_sample_gauge(gateway.url + "/metrics", stop, gauge))
        slowed, during = await asyncio.gather(
            closed_loop(
                slow, concurrency=SLOW_CLIENTS, duration_s=PHASE_S, honour_retry_after=True
            ),
            closed_loop(tiny, concurrency=2, duration_s=PHASE_S),
        )
        stop.set()
        await sampler
        return baseline, slowed, during, gauge

    started = time.monotonic()
    baseline, slowed, during, gauge = asyncio.run(scenario())
    timed_out = (slowed.latency_s[slowed.status == 504] * 1000).tolist()
    shed = (slowed.latency_s[slowed.status == 429] * 1000).tolist()
    base_p99 = quantile(baseline.latency_s * 1000, 0.99)
    during_p99 = quantile(during.latency_s * 1000, 0.99)
    print(f"\n[slow] run {time.monotonic() - started:.1f} s; slow_echo {slowed.describe()}")
    print(
        f"[slow] 504s={len(timed_out)} latency min={min(timed_out, default=float('nan')):.0f} "
        f"max={max(timed_out, default=float('nan')):.0f} ms (timeout {UPSTREAM_TIMEOUT_S * 1000:.0f} ms); "
        f"429s={len(shed)} p99={quantile(shed, 0.99) if shed else float('nan'):.1f} ms; "
        f"in-flight gauge max={max(gauge, default=0):.0f} "
        f"(bound {IN_FLIGHT}, {len(gauge)} samples)"
    )
    print(f"[slow] tiny_linear baseline {baseline.describe()}")
    print(f"[slow] tiny_linear during   {during.describe()}; P99 x{during_p99 / base_p99:.2f}")

    assert gateway.process.running()
    assert set(slowed.statuses()) <= {429, 504}, f"slow_echo answered {slowed.describe()}"
    assert timed_out and shed, "expected both timeouts (504) and in-flight refusals (429)"
    assert min(timed_out) >= UPSTREAM_TIMEOUT_S * 1000 * 0.95, "a 504 came before the timeout"
    assert max(timed_out) <= UPSTREAM_TIMEOUT_S * 1000 + 2000, (
        "a timed-out call hung well past the timeout"
    )
    assert max(gauge) <= IN_FLIGHT, f"in-flight bound broken: {max(gauge)} > {IN_FLIGHT}"
    assert set(baseline.statuses()) | set(during.statuses()) == {200}, (
        "the fast model failed while the slow one stalled"
    )
