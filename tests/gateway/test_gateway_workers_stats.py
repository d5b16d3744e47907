"""One gateway, two worker processes, one Redis: /metrics, /v1/stats and /v1/usage answer for both
workers whichever of them takes the request (real processes, real Triton, real Redis)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest

from tests.support.gateway_procs import (
    ADMIN_TOKEN,
    METRICS_HEADERS,
    create_key,
    tiny_request,
    worker_pids,
)

pytestmark = pytest.mark.integration

INFER = "/v2/models/tiny_linear/infer"
_REQUESTS = 60


def _metrics_dir(worker: int) -> Path:
    environ = Path(f"/proc/{worker}/environ").read_bytes().split(b"\0")
    (value,) = [e.split(b"=", 1)[1] for e in environ if e.startswith(b"PROMETHEUS_MULTIPROC_DIR=")]
    return Path(value.decode())


def test_two_workers_answer_for_both(
    gateway_factory, tiny_triton, redis_url, tmp_path_factory
) -> None:  # type: ignore[no-untyped-def]
    gateway = gateway_factory(
        tiny_triton.http_url,
        workdir=tmp_path_factory.mktemp("workers-stats"),
        redis_url=redis_url,
        workers=2,
        stats_publish_interval_s=0.2,
        usage_flush_interval_s=0.2,
    )
    workers = worker_pids(gateway.process.pid)
    assert len(workers) == 2
    headers, key = create_key(gateway, name="workers-stats")
    client_id = f"key:{key['key_id']}"
    for _ in range(_REQUESTS):  # a new connection each: the kernel spreads them over the workers
        assert (
            httpx.post(
                gateway.url + INFER, json=tiny_request(), headers=headers, timeout=10
            ).status_code
            == 200
        )

    # Both workers recorded some of them (each writes its own values file)...
    directory = _metrics_dir(workers[0])
    assert {p.name for p in directory.glob("histogram_*.db")} == {
        f"histogram_{w}.db" for w in workers
    }
    # ...and every scrape, whichever worker answers it, counts all of them.
    pattern = re.compile(
        rf'^gateway_client_request_duration_seconds_count\{{client="{client_id}"\}} (\S+)$', re.M
    )
    for _ in range(10):
        metrics = httpx.get(gateway.url + "/metrics", headers=METRICS_HEADERS, timeout=10).text
        assert [float(v) for v in pattern.findall(metrics)] == [float(_REQUESTS)]

    # The workers' collector pauses are counted too (gateway.observe.gc_pauses; drained each second).
    deadline = time.monotonic() + 20
    while 'gateway_gc_pause_seconds_count{generation="0"}' not in metrics:
        assert time.monotonic() < deadline, "no collector pause was ever counted"
        time.sleep(0.2)
        metrics = httpx.get(gateway.url + "/metrics", headers=METRICS_HEADERS, timeout=10).text

    # /v1/stats and /v1/usage: every answer (whichever worker) counts every request once published.
    deadline = time.monotonic() + 20
    streak = 0
    while streak < 10:
        stats = httpx.get(gateway.url + "/v1/stats", headers=headers, timeout=10).json()
        usage = httpx.get(gateway.url + "/v1/usage", headers=headers, timeout=10).json()
        counted = (stats["clients"].get(client_id) or {}).get("count", 0)
        used = sum(r["requests"] for r in usage["data"])
        assert counted <= _REQUESTS and used <= _REQUESTS, (counted, used)
        streak = streak + 1 if (counted, used) == (_REQUESTS, _REQUESTS) else 0
        assert time.monotonic() < deadline, f"workers never agreed: stats {counted}, usage {used}"
    admin = httpx.get(
        gateway.url + "/v1/stats", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10
    )
    assert admin.json()["models"]["tiny_linear"]["gateway"]["count"] >= _REQUESTS
    assert (
        worker_pids(gateway.process.pid) == workers
    )  # no worker died (and was replaced) on the way
