"""Deadlines and tier priorities reach Triton: the real gateway, the real Triton, ``slow_echo``.

``slow_echo`` logs every request it runs and can hold its two instances until the test lets go, so
these tests know Triton's state (both instances busy, N requests queued) instead of guessing it with
sleeps, and read from the model's own log which queued work ran, and in which order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import tritonclient.http as triton_http

from serving.launcher import TritonServer
from tests.support.gateway_procs import ADMIN_TOKEN, GatewayProcess
from tests.support.tiny_repo import SLOW_MODEL, release_slow, slow_executions

pytestmark = pytest.mark.integration

_DEADLINE_S = 1.0
_TIERS = {
    "low": {"per_minute": 6_000_000, "burst": 100_000, "priority": 3},
    "high": {"per_minute": 6_000_000, "burst": 100_000, "priority": 1},
}


@pytest.fixture(scope="module")
def deadline_gateway(  # type: ignore[no-untyped-def]
    gateway_factory, tiny_triton: TritonServer
) -> GatewayProcess:
    return gateway_factory(tiny_triton.http_url, upstream_timeout_s=_DEADLINE_S, tier_limits=_TIERS)


def _key(gateway: GatewayProcess, tier: str) -> dict[str, str]:
    response = httpx.post(
        gateway.url + "/admin/keys",
        json={"name": tier, "tier": tier},
        headers={"X-Admin-Token": ADMIN_TOKEN},
    )
    assert response.status_code == 201, response.text
    return {
        "Authorization": f"Bearer {response.json()['api_key']}",
        "Accept": "application/problem+json",
    }


def _slow(delay_ms: int) -> dict[str, object]:
    return {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "INT32", "data": [delay_ms]}]}


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _stats(triton: TritonServer) -> dict[str, int]:
    client = triton_http.InferenceServerClient(triton.http_url)
    try:
        model = client.get_inference_statistics(SLOW_MODEL)["model_stats"][0]
    finally:
        client.close()
    inference = model["inference_stats"]
    return {
        "executions": int(model["execution_count"]),
        "success": int(inference["success"]["count"]),
        "fail": int(inference["fail"]["count"]),
    }


def _pending(triton: TritonServer) -> int:
    for line in httpx.get(triton.metrics_url).text.splitlines():
        if (
            line.startswith("nv_inference_pending_request_count")
            and f'model="{SLOW_MODEL}"' in line
        ):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


@pytest.fixture
def hold_instances(tiny_triton: TritonServer) -> Iterator[Callable[[int, int], list[Future[None]]]]:
    """``hold(first, second)``: occupy both ``slow_echo`` instances (directly at Triton) until released."""
    pool = ThreadPoolExecutor(2)
    holds: list[int] = []

    def run(hold: int) -> None:
        client = triton_http.InferenceServerClient(tiny_triton.http_url, network_timeout=180)
        try:
            tensor = triton_http.InferInput("DELAY_MS", [1], "INT32")
            tensor.set_data_from_numpy(np.array([-hold], dtype=np.int32))
            client.infer(SLOW_MODEL, [tensor])
        finally:
            client.close()

    def hold(*ids: int) -> list[Future[None]]:
        holds.extend(ids)
        futures = [pool.submit(run, i) for i in ids]
        _wait_for(
            lambda: all(-i in slow_executions(tiny_triton.repository) for i in ids),
            "both instances held",
        )
        return futures

    yield hold
    for i in holds:  # a failed test must not leave the instances held
        release_slow(tiny_triton.repository, i)
    pool.shutdown(wait=True)


def test_work_the_gateway_gave_up_on_is_dropped_not_run(
    deadline_gateway, tiny_triton, hold_instances
) -> None:  # type: ignore[no-untyped-def]
    auth = _key(deadline_gateway, "low")
    marker, count = 7007, 3
    held = hold_instances(1101, 1102)
    before = _stats(tiny_triton)
    url = deadline_gateway.url + f"/v2/models/{SLOW_MODEL}/infer"
    with ThreadPoolExecutor(count) as pool:
        answers = list(
            pool.map(
                lambda _: httpx.post(url, json=_slow(marker), headers=auth, timeout=30),
                range(count),
            )
        )
    # The gateway gave up after its deadline; the requests it had queued in Triton carried that deadline.
    assert [a.status_code for a in answers] == [504] * count, [a.text for a in answers]
    assert all(a.headers["content-type"].startswith("application/problem+json") for a in answers)
    # Triton rejects them from its queue (its statistics count them as failed) while both instances
    # are still held: they never reached the model.
    _wait_for(
        lambda: _stats(tiny_triton)["fail"] >= before["fail"] + count,
        "Triton to reject the expired requests",
    )
    release_slow(tiny_triton.repository, 1101)
    release_slow(tiny_triton.repository, 1102)
    for future in held:
        future.result(timeout=60)
    after = _stats(tiny_triton)
    assert marker not in slow_executions(tiny_triton.repository)
    assert after["executions"] == before["executions"] + 2  # the two held requests, nothing else
    assert after["fail"] == before["fail"] + count
    # Nothing stale is left queued: a fresh request is served at once.
    assert httpx.post(url, json=_slow(5), headers=auth, timeout=30).status_code == 200
    assert slow_executions(tiny_triton.repository)[-1] == 5


def test_tiers_map_to_triton_priorities(  # type: ignore[no-untyped-def]
    gateway_factory, tiny_triton, hold_instances
) -> None:
    gateway = gateway_factory(tiny_triton.http_url, upstream_timeout_s=60, tier_limits=_TIERS)
    low, high = _key(gateway, "low"), _key(gateway, "high")
    url = gateway.url + f"/v2/models/{SLOW_MODEL}/infer"
    held = hold_instances(1201, 1202)
    base = _pending(tiny_triton)
    with ThreadPoolExecutor(2) as pool:
        # The low-tier request queues first, the high-tier one after it.
        first = pool.submit(httpx.post, url, json=_slow(3303), headers=low, timeout=60)
        _wait_for(lambda: _pending(tiny_triton) == base + 1, "the low-tier request to queue")
        second = pool.submit(httpx.post, url, json=_slow(1101), headers=high, timeout=60)
        _wait_for(lambda: _pending(tiny_triton) == base + 2, "the high-tier request to queue")
        # One instance frees up: Triton serves priority 1 first, although it queued second. The other
        # instance stays held until then, so the low-tier request can only start after it.
        release_slow(tiny_triton.repository, 1201)
        assert second.result().status_code == 200
        release_slow(tiny_triton.repository, 1202)
        assert first.result().status_code == 200
    for future in held:
        future.result(timeout=60)
    ran = [v for v in slow_executions(tiny_triton.repository) if v in (3303, 1101)]
    assert ran == [1101, 3303]
