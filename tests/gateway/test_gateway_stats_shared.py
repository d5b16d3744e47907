"""/v1/stats across processes: two real gateways sharing one Redis (or one SQLite file) report the
combined traffic within the stated relative error, and no tenant sees another's figures.

Ground truth is each gateway's access log: it prints, per request, the same elapsed time the
gateway recorded (to 0.01 ms), so the exact quantiles of the union can be computed here.
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from serving.quantiles import QUANTILES, RELATIVE_ACCURACY, rank
from tests.support.gateway_procs import ADMIN_TOKEN, GatewayProcess, create_key, tiny_request

pytestmark = pytest.mark.integration

INFER = "/v2/models/tiny_linear/infer"
_ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
_ACCESS = re.compile(r" POST /v2/models/tiny_linear/infer 200 (\d+\.\d+)ms client=(\S+) ")


@pytest.fixture(scope="module", params=["redis", "sqlite"])
def pair(  # type: ignore[no-untyped-def]
    request, gateway_factory, tiny_triton, tmp_path_factory
) -> list[GatewayProcess]:
    """Two gateway processes sharing a key store and a stats store."""
    workdir = tmp_path_factory.mktemp(f"shared-{request.param}")
    shared: dict[str, object] = {"stats_publish_interval_s": 0.2, "stats_bucket_s": 2.0}
    if request.param == "redis":
        shared["redis_url"] = request.getfixturevalue("redis_url")
    else:
        shared["stats_db"] = workdir / "stats.sqlite3"
    return [gateway_factory(tiny_triton.http_url, workdir=workdir, **shared) for _ in range(2)]


def _send(gateway: GatewayProcess, headers: dict[str, str], count: int) -> None:
    with httpx.Client(base_url=gateway.url, headers=headers, timeout=10) as client:
        for _ in range(count):
            assert client.post(INFER, json=tiny_request()).status_code == 200


def _logged_ms(gateways: list[GatewayProcess], client_id: str) -> list[float]:
    return [
        float(ms)
        for gateway in gateways
        for ms, who in _ACCESS.findall(gateway.log())
        if who == client_id
    ]


def _stats_once_counted(
    gateway: GatewayProcess, headers: dict[str, str], client_id: str, count: int
) -> dict:  # type: ignore[type-arg]
    """/v1/stats as soon as it counts ``count`` requests of ``client_id`` (publication is periodic)."""
    deadline = time.monotonic() + 20
    while True:
        stats = httpx.get(gateway.url + "/v1/stats", headers=headers, timeout=10).json()
        seen = (stats["clients"].get(client_id) or {}).get("count", 0)
        if seen == count:
            return stats  # type: ignore[no-any-return]
        assert seen < count, f"{seen} requests counted for {client_id}, only {count} were sent"
        assert time.monotonic() < deadline, (
            f"/v1/stats never counted {count} requests (last: {seen})"
        )
        time.sleep(0.1)


def _check_against_truth(summary: dict[str, float], truth_ms: list[float]) -> None:
    ordered = sorted(truth_ms)
    assert summary["count"] == len(ordered)
    for q, name in zip(QUANTILES, ("p50_ms", "p95_ms", "p99_ms"), strict=True):
        exact = ordered[rank(len(ordered), q)]
        # 1% from the sketch, 0.005 ms from the log's rounding, 0.0005 ms from the report's.
        assert abs(summary[name] - exact) <= RELATIVE_ACCURACY * exact + 0.0055, (
            name,
            summary,
            exact,
        )
    assert abs(summary["max_ms"] - ordered[-1]) <= 0.0055


def test_stats_merge_across_two_gateways(pair: list[GatewayProcess]) -> None:
    first, second = pair
    headers, key = create_key(first, name="merged")
    client_id = f"key:{key['key_id']}"
    # Both gateways at once, unevenly: 150 requests through one, 90 through the other.
    with ThreadPoolExecutor(2) as pool:
        for future in [
            pool.submit(_send, first, headers, 150),
            pool.submit(_send, second, headers, 90),
        ]:
            future.result()
    truth = _logged_ms(pair, client_id)
    assert len(truth) == 240
    for gateway in pair:  # each process answers for both
        stats = _stats_once_counted(gateway, headers, client_id, 240)
        assert stats["complete"] is True and stats["relative_error"] == RELATIVE_ACCURACY
        _check_against_truth(stats["clients"][client_id], truth)
        _check_against_truth(stats["models"]["tiny_linear"]["gateway"], truth)


def test_tenants_see_only_their_own_figures_and_the_admin_sees_both(
    pair: list[GatewayProcess],
) -> None:
    first, second = pair
    headers_a, key_a = create_key(first, name="tenant-a")
    headers_b, key_b = create_key(first, name="tenant-b")
    id_a, id_b = f"key:{key_a['key_id']}", f"key:{key_b['key_id']}"
    _send(first, headers_a, 20)
    _send(second, headers_b, 30)

    mine = _stats_once_counted(second, headers_a, id_a, 20)
    assert mine["scope"] == id_a and set(mine["clients"]) == {id_a}
    assert "model_clients" not in mine and key_b["key_id"] not in str(mine)
    assert mine["models"]["tiny_linear"]["gateway"]["count"] == 20  # its own traffic, not B's
    assert "requests" not in (mine["models"]["tiny_linear"]["triton"] or {})

    theirs = _stats_once_counted(first, headers_b, id_b, 30)
    assert set(theirs["clients"]) == {id_b} and key_a["key_id"] not in str(theirs)

    everything = _stats_once_counted(first, _ADMIN, id_b, 30)
    assert everything["scope"] == "all"
    assert everything["clients"][id_a]["count"] == 20
    assert everything["model_clients"]["tiny_linear"][id_b]["count"] == 30
    assert everything["models"]["tiny_linear"]["gateway"]["count"] >= 50


def test_stats_without_a_credential_are_refused(pair: list[GatewayProcess]) -> None:
    response = httpx.get(pair[0].url + "/v1/stats", timeout=10)
    assert response.status_code == 401
