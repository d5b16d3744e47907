"""Fault 2 - Triton killed (SIGKILL) mid-load, restarted by the launcher's supervisor.

A Triton of this module's own runs under :class:`serving.supervisor.TritonSupervisor`; a gateway in
front of it takes a steady closed-loop load on ``tiny_linear``. Triton's process gets ``kill -9``.
Asserted: the gateway survives, answers 503 with Retry-After while Triton is down (failing fast,
long before its upstream deadline), nothing else but 200 and 503 comes back, every 200 carries the
right numbers, ``/readyz`` says 503 while Triton is down, and the gateway serves again once the
supervisor has brought Triton back. Printed, not asserted (timings depend on the machine): the
latency of the 503s, how long until ``/readyz`` says 503, how long the supervisor takes, and how long
from Triton being ready again to the gateway's first 200 and ``/readyz`` 200.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import aiohttp
import numpy as np
import pytest

from loadtest.loadgen import HttpTarget, Sample, Samples, closed_loop
from serving.quantiles import summarize
from serving.supervisor import TritonSupervisor
from tests.support.gateway_procs import create_key
from tests.support.tiny_repo import TINY_BIAS, TINY_WEIGHT

pytestmark = pytest.mark.integration

X = [1.0, 2.0, 3.0, 4.0]
BODY = json.dumps(
    {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": X}]}
).encode()
EXPECTED = (np.array(X, dtype=np.float32) @ TINY_WEIGHT + TINY_BIAS).tolist()
CONCURRENCY = 4
BEFORE_KILL_S = 2.0
AFTER_RECOVERY_S = 2.0
TRITON_BACK_TIMEOUT_S = 40.0
UPSTREAM_TIMEOUT_S = (
    10.0  # a 503 must come well before this: the gateway fails fast, it does not wait
)
RECOVERY_WINDOW_S = 30.0  # how long the test watches for the gateway to serve again
JSON = {"Content-Type": "application/json"}


def _check(status: int, payload: bytes) -> bool | None:
    if status != 200:
        return None
    outputs = json.loads(payload)["outputs"]
    return bool(np.allclose(outputs[0]["data"], EXPECTED, atol=1e-5))


async def _poll(
    url: str, log: list[tuple[float, int]], stop: asyncio.Event, every_s: float = 0.05
) -> None:
    """GET ``url`` until ``stop``; log ``(time sent, status)`` (0: no answer).

    The time a poll was sent, not answered: a 200 sent before the kill can be read after it (it waited
    in the socket while the test killed Triton), and must not pass for Triton being back.
    """
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as session:
        while not stop.is_set():
            sent = time.monotonic()
            try:
                async with session.get(url) as resp:
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError):
                status = 0
            log.append((sent, status))
            await asyncio.sleep(every_s)


def _first(log: list[tuple[float, int]], after: float, want: int) -> float | None:
    return next((t for t, status in log if t > after and status == want), None)


def test_triton_killed_mid_load_fast_503_then_recovery(  # type: ignore[no-untyped-def]
    rel_triton, gateways
) -> None:
    gateway = gateways(
        rel_triton.http_url, log_level="warning", upstream_timeout_s=UPSTREAM_TIMEOUT_S
    )
    headers, _ = create_key(gateway)
    url = gateway.url + "/v2/models/tiny_linear/infer"

    async def scenario() -> tuple[
        list[Sample], list[tuple[float, int]], list[tuple[float, int]], float, float
    ]:
        stop = asyncio.Event()
        ready_log: list[tuple[float, int]] = []
        triton_log: list[tuple[float, int]] = []
        target = HttpTarget(
            url=url, requests=((BODY, JSON),), headers=headers, check=_check, timeout_s=15
        )
        load = asyncio.create_task(
            closed_loop(target, concurrency=CONCURRENCY, duration_s=120, stop=stop)
        )
        pollers = [
            asyncio.create_task(_poll(gateway.url + "/readyz", ready_log, stop)),
            asyncio.create_task(
                _poll(f"http://{rel_triton.http_url}/v2/health/ready", triton_log, stop)
            ),
        ]
        await asyncio.sleep(BEFORE_KILL_S)
        pid = rel_triton.pid
        t_kill = time.monotonic()
        os.kill(pid, signal.SIGKILL)  # a crash: only tritonserver itself, no clean shutdown
        while (t_back := _first(triton_log, t_kill, 200)) is None:
            assert time.monotonic() - t_kill < TRITON_BACK_TIMEOUT_S, (
                "the supervisor never brought Triton back"
            )
            await asyncio.sleep(0.02)
        # Wait for the state asserted on (readiness back), not a fixed time; then a little traffic.
        while (
            _first(ready_log, t_back, 200) is None and time.monotonic() - t_back < RECOVERY_WINDOW_S
        ):
            await asyncio.sleep(0.05)
        await asyncio.sleep(AFTER_RECOVERY_S)
        stop.set()
        samples = list(await load)
        await asyncio.gather(*pollers)
        return samples, ready_log, triton_log, t_kill, t_back

    with TritonSupervisor(rel_triton, poll_s=0.1) as supervisor:
        samples, ready_log, triton_log, t_kill, t_back = asyncio.run(scenario())
        restarts = supervisor.restarts

    during = [s for s in samples if s.t1 > t_kill]
    unavailable = [s for s in during if s.status == 503]
    others = [s for s in samples if s.status not in (200, 503)]
    wrong = [s for s in samples if s.correct is False]
    first_ok = min((s.t1 for s in samples if s.status == 200 and s.t0 > t_kill), default=None)
    t_not_ready = _first(ready_log, t_kill, 503)
    t_ready_again = _first(ready_log, t_back, 200)
    lat_503 = summarize([s.latency_s * 1000 for s in unavailable])
    # A request already in flight when Triton died counts from the kill: its time before that was
    # ordinary inference, not the gateway noticing the crash.
    after_kill_503 = [(s.t1 - max(s.t0, t_kill)) * 1000 for s in unavailable]
    recovery = None if first_ok is None else first_ok - t_back
    print(f"\n[triton-kill] {Samples.of(samples).describe()}; supervisor restarts={restarts}")
    print(
        f"[triton-kill] 503s={len(unavailable)} latency "
        + (
            f"p50={lat_503.p50:.1f} p99={lat_503.p99:.1f} max={lat_503.max:.1f} ms "
            if lat_503
            else "- "
        )
        + f"(max counted from the kill {max(after_kill_503, default=float('nan')):.1f} ms, "
        f"upstream timeout {UPSTREAM_TIMEOUT_S * 1000:.0f} ms); "
        f"other statuses={len(others)} wrong answers={len(wrong)}"
    )
    print(
        "[triton-kill] /readyz 503 after kill: "
        f"{(t_not_ready - t_kill) * 1000 if t_not_ready else float('nan'):.0f} ms; "
        f"Triton ready again after kill: {t_back - t_kill:.2f} s; "
        f"first gateway 200 after Triton ready: {recovery if recovery is not None else float('nan'):.3f} s; "
        f"/readyz 200 after Triton ready: {t_ready_again - t_back if t_ready_again else float('nan'):.3f} s"
    )

    assert gateway.process.running(), "the gateway died with Triton"
    assert restarts >= 1, "the supervisor did not restart Triton"
    assert unavailable, "no 503 while Triton was down"
    assert all(s.retry_after for s in unavailable), "a 503 without Retry-After"
    assert not others, f"answers other than 200/503: {Samples.of(others).describe()}"
    assert not wrong, f"{len(wrong)} wrong answers"
    assert max(after_kill_503) < UPSTREAM_TIMEOUT_S * 1000 / 2, (
        f"a 503 took {max(after_kill_503):.1f} ms: the gateway waited on a dead Triton instead of "
        "failing fast"
    )
    assert t_not_ready is not None, "/readyz never said 503 while Triton was down"
    assert recovery is not None, "the gateway never served again after Triton came back"
    assert t_ready_again is not None, "/readyz never said 200 again after Triton came back"
