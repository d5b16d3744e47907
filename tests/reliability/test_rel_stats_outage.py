"""Fault - the shared store hangs (Redis SIGSTOP) while a key is used: requests are still served,
/v1/stats answers with this process's own figures (complete: false), /v1/usage says 503 + Retry-After
rather than a wrong number, and once Redis is back every request is in the usage and the stats:
nothing metered during the outage is lost."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from tests.support.gateway_procs import RedisProcess, create_key, tiny_request

pytestmark = pytest.mark.integration

INFER = "/v2/models/tiny_linear/infer"


@pytest.fixture
def redis_server(tmp_path) -> RedisProcess:  # type: ignore[no-untyped-def]
    server = RedisProcess(tmp_path).start()
    yield server
    if server.process is not None:
        os.kill(server.process.pid, signal.SIGCONT)  # never leave it stopped
    server.stop()


def _wait(condition, what: str, timeout_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_usage_and_stats_survive_a_store_outage(  # type: ignore[no-untyped-def]
    rel_triton, gateways, redis_server
) -> None:
    gateway = gateways(
        rel_triton.http_url,
        redis_url=redis_server.url,
        workers=1,
        redis_failure_policy="open",
        stats_publish_interval_s=0.2,
        usage_flush_interval_s=0.2,
        log_level="warning",
    )
    headers, key = create_key(gateway)
    client_id = f"key:{key['key_id']}"
    with httpx.Client(base_url=gateway.url, headers=headers, timeout=10) as client:
        for _ in range(3):
            assert client.post(INFER, json=tiny_request()).status_code == 200
        assert client.get("/v1/stats").json()["complete"] is True

        assert redis_server.process is not None
        os.kill(redis_server.process.pid, signal.SIGSTOP)
        try:
            for _ in range(4):  # the key is cached; the open policy admits
                assert client.post(INFER, json=tiny_request()).status_code == 200
            stats = client.get("/v1/stats").json()
            assert stats["complete"] is False and stats["clients"][client_id]["count"] == 7
            usage = client.get("/v1/usage")
            assert usage.status_code == 503 and "retry-after" in usage.headers
        finally:
            os.kill(redis_server.process.pid, signal.SIGCONT)

        def counted() -> bool:
            response = client.get("/v1/usage")
            return (
                response.status_code == 200
                and sum(r["requests"] for r in response.json()["data"]) == 7
            )

        _wait(counted, "the usage of the outage never reached Redis")
        _wait(
            lambda: client.get("/v1/stats").json()["complete"] is True,
            "stats never read Redis again",
        )
    assert "Traceback" not in gateway.log()


async def test_a_flush_redis_applied_but_never_answered_is_not_counted_twice(  # type: ignore[no-untyped-def]
    redis_server,
) -> None:
    """A hung Redis buffers the flush it was sent and applies it when it resumes, after the meter saw
    a timeout; the meter's retry must then not add the same counts again."""
    from gateway.tenancy.usage import RequestUsage, UsageMeter, UsageStoreError
    from gateway.tenancy.usage_store import RedisUsageStore

    store = RedisUsageStore(redis_server.url, timeout_s=0.25)
    meter = UsageMeter(store)
    try:
        meter.record("key:x", "m", 200, RequestUsage(inputs=1), 0.0)
        await meter.flush()  # the connection is open now
        assert redis_server.process is not None
        os.kill(redis_server.process.pid, signal.SIGSTOP)
        try:
            for _ in range(3):
                meter.record("key:x", "m", 200, RequestUsage(inputs=1), 0.0)
            for _ in range(2):
                with pytest.raises(UsageStoreError):
                    await meter.flush()  # the first one is written into the socket and waits there
        finally:
            os.kill(redis_server.process.pid, signal.SIGCONT)
        meter.record("key:x", "m", 200, RequestUsage(inputs=1), 0.0)
        await meter.flush()
        today = time.strftime("%Y-%m-%d", time.gmtime())
        (row,) = await meter.read(today, today, "key:x")
        assert (row.requests, row.inputs) == (5, 5)
    finally:
        await store.close()
