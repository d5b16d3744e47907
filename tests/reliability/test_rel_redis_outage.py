"""Fault 3 - Redis hangs (SIGSTOP), comes back, then is stopped and restarted, all under load.

Two gateways share one real redis-server: one fails open, one fails closed. Each takes a closed
loop of clients with a key on the ``limited`` tier (10/s, burst 5), so while Redis works most
requests are 429 and about 10/s are admitted. Phases (seconds): normal, Redis frozen, thawed, Redis
stopped, Redis started again on the same port from its append-only file (as deployed: API keys live
in Redis, so a Redis that forgot them would turn every request into a 401). While Redis is gone the
fail-open gateway admits everything (200s, no 429) and the fail-closed one refuses everything with
503 + Retry-After; neither crashes, neither answers any other status; once Redis is back both limit
again (429s).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import Counter

import httpx
import pytest

from loadtest.loadgen import HttpTarget, Sample, closed_loop
from tests.support.gateway_procs import RedisProcess, create_key

pytestmark = pytest.mark.integration

BODY = json.dumps(
    {
        "inputs": [
            {"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}
        ]
    }
).encode()
PHASE_S = 2.5
#: answers sent this long after a transition still belong to the previous phase (in-flight calls,
#: the limiter's 1 s back-off after a failure, the client reconnecting)
SETTLE_S = 1.5
NO_HANG_S = 2.0  # generous: the limiter bounds a Redis call at 2 x redis_timeout_s = 0.5 s


@pytest.fixture
def redis_server(tmp_path) -> RedisProcess:  # type: ignore[no-untyped-def]
    server = RedisProcess(tmp_path, persistent=True).start()
    yield server
    server.stop()


def _window(samples: list[Sample], start: float, end: float) -> list[Sample]:
    """Answers that lie wholly inside one phase (a call sent just before a transition is neither)."""
    return [s for s in samples if start + SETTLE_S <= s.t0 and s.t1 < end]


def test_redis_outage_policies_hold_and_limits_resume(  # type: ignore[no-untyped-def]
    rel_triton, gateways, redis_server
) -> None:
    common = {"redis_url": redis_server.url, "log_level": "warning"}
    fail_open = gateways(rel_triton.http_url, redis_failure_policy="open", **common)
    fail_closed = gateways(rel_triton.http_url, redis_failure_policy="closed", **common)
    auth_open, _ = create_key(fail_open, tier="limited")
    auth_closed, _ = create_key(fail_closed, tier="limited")
    # Each gateway looks its key up once while Redis works: a fail-open gateway keeps serving a key it
    # has seen when Redis hangs, but one it never looked up cannot be authenticated (503). On a busy
    # machine the load's first answers can come after Redis is frozen, so the lookup is made here.
    for gateway, auth in ((fail_open, auth_open), (fail_closed, auth_closed)):
        answer = httpx.post(
            gateway.url + "/v2/models/tiny_linear/infer",
            content=BODY,
            timeout=60,
            headers={**auth, "Content-Type": "application/json"},
        )
        assert answer.status_code == 200, answer.text

    async def scenario() -> tuple[list[Sample], list[Sample], dict[str, float]]:
        stop = asyncio.Event()
        url = "/v2/models/tiny_linear/infer"
        targets = [
            HttpTarget(
                url=gw.url + url,
                requests=((BODY, {"Content-Type": "application/json"}),),
                headers=auth,
                timeout_s=15,
            )
            for gw, auth in ((fail_open, auth_open), (fail_closed, auth_closed))
        ]
        loads = [
            asyncio.create_task(closed_loop(t, concurrency=2, duration_s=60, stop=stop))
            for t in targets
        ]
        marks = {"start": time.monotonic()}
        await asyncio.sleep(PHASE_S)
        assert redis_server.process is not None
        marks["frozen"] = time.monotonic()
        os.kill(redis_server.process.pid, signal.SIGSTOP)  # hangs: every call runs into the timeout
        await asyncio.sleep(PHASE_S)
        os.kill(redis_server.process.pid, signal.SIGCONT)
        marks["thawed"] = time.monotonic()
        await asyncio.sleep(PHASE_S)
        marks["stopped"] = time.monotonic()  # a fault's mark goes before it, a recovery's after it
        await asyncio.to_thread(redis_server.stop)  # gone: connections refused
        await asyncio.sleep(PHASE_S)
        await asyncio.to_thread(redis_server.start)  # same port, same data (append-only file)
        marks["restarted"] = time.monotonic()
        await asyncio.sleep(PHASE_S + 1)
        marks["end"] = time.monotonic()
        stop.set()
        opened, closed = await asyncio.gather(*loads)
        return list(opened), list(closed), marks

    opened, closed, marks = asyncio.run(scenario())
    phases = [
        ("normal", "start", "frozen", False),
        ("frozen", "frozen", "thawed", True),
        ("thawed", "thawed", "stopped", False),
        ("stopped", "stopped", "restarted", True),
        ("restarted", "restarted", "end", False),
    ]
    print()
    for label, samples in (("open", opened), ("closed", closed)):
        print(
            f"[redis] fail-{label}: sent={len(samples)} "
            f"statuses={dict(sorted(Counter(s.status for s in samples).items()))} "
            f"max latency overall={max(s.latency_s for s in samples) * 1000:.0f} ms"
        )
        for phase, begin, end, _ in phases:
            window = _window(samples, marks[begin], marks[end])
            span = marks[end] - marks[begin] - SETTLE_S
            counts = Counter(s.status for s in window)
            worst = max((s.latency_s for s in window), default=float("nan")) * 1000
            print(
                f"[redis]   {phase:<9} {dict(sorted(counts.items()))} admitted/s={counts[200] / span:.1f} "
                f"max latency={worst:.0f} ms"
            )
        for event, until in (("thawed", "stopped"), ("restarted", "end")):
            after = [s for s in samples if marks[event] < s.t0 < marks[until]]
            first_429 = min((s.t1 for s in after if s.status == 429), default=None)
            last_503 = max((s.t1 for s in after if s.status == 503), default=None)
            resumed = first_429 - marks[event] if first_429 else float("nan")
            print(
                f"[redis]   limits resumed {resumed:.2f} s after "
                f"{event}; last 503 {last_503 - marks[event] if last_503 else 0.0:.2f} s after it"
            )

    for gateway in (fail_open, fail_closed):
        assert gateway.process.running(), "a gateway died when Redis went away"
    assert {s.status for s in opened} <= {200, 429}, (
        "fail-open answered something else than 200/429"
    )
    assert {s.status for s in closed} <= {200, 429, 503}, (
        "fail-closed answered something else than 200/429/503"
    )
    assert all(s.retry_after for s in closed if s.status in (429, 503)), (
        "a refusal without Retry-After"
    )
    assert max(s.latency_s for s in opened + closed) <= NO_HANG_S, (
        "a request hung on the frozen Redis"
    )
    for phase, begin, end, outage in phases:
        got_open = Counter(s.status for s in _window(opened, marks[begin], marks[end]))
        got_closed = Counter(s.status for s in _window(closed, marks[begin], marks[end]))
        if outage:
            assert set(got_open) == {200}, (
                f"{phase}: fail-open did not admit everything: {got_open}"
            )
            assert set(got_closed) == {503}, (
                f"{phase}: fail-closed did not refuse everything: {got_closed}"
            )
        else:
            assert got_open[429] and got_closed[429], (
                f"{phase}: limits not enforced: {got_open} {got_closed}"
            )
            assert not got_closed[503], (
                f"{phase}: fail-closed still refusing with Redis up: {got_closed}"
            )
