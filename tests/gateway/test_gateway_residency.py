"""Model residency against a real Triton (explicit mode, nothing loaded) and a real gateway with a
memory budget that holds two of the test variants (each holds a 96 MiB ballast).

Each test starts from nothing loaded and nothing pinned (:func:`fresh`); the gateway and Triton are
shared by the module (a Python-backend model takes seconds to load on two cores).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.launcher import TritonPorts, TritonServer
from tests.support.api_errors import api_error
from tests.support.gateway_procs import ADMIN_TOKEN, METRICS_HEADERS, GatewayProcess, create_key
from tests.support.multimodel_repo import (
    BROKEN,
    ENSEMBLES,
    SHARED_STEP,
    build_multimodel_repository,
    initializations,
    release,
    variant_name,
)

MIB = 1024 * 1024
BALLAST_MB = 96
BUDGET = 300 * MIB  # two variants (about 96 MiB ballast + the stub's own ~40 MiB each), not three
HUGE = variant_name(4)  # its remembered footprint is larger than the budget
ADMIN = {"X-Admin-Token": ADMIN_TOKEN}
PROBLEM = {"Accept": "application/problem+json"}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_multimodel_repository(
        tmp_path_factory.mktemp("multimodel"), variants=5, ballast_mb=BALLAST_MB
    )


@pytest.fixture(scope="module")
def triton(repo: Path) -> Iterator[TritonServer]:
    server = TritonServer(repo, models=[], ports=TritonPorts.free())
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateway(
    gateway_factory, triton: TritonServer, tmp_path_factory: pytest.TempPathFactory
) -> GatewayProcess:  # type: ignore[no-untyped-def]
    workdir = tmp_path_factory.mktemp("residency-gateway")
    footprints = workdir / "footprints.json"
    footprints.write_text(json.dumps({HUGE: 16 * 1024 * MIB}))  # remembered from "an earlier run"
    assert triton.pid is not None
    return gateway_factory(
        triton.http_url,
        workdir=workdir,
        residency_budget_bytes=BUDGET,
        residency_triton_pid=triton.pid,
        residency_default_estimate_bytes=140 * MIB,
        residency_footprints_path=footprints,
        residency_failure_backoff_s=120,
        model_index_ttl_s=0.5,
    )


@pytest.fixture(scope="module")
def headers(gateway: GatewayProcess) -> dict[str, str]:
    return create_key(gateway)[0]


def table(gateway: GatewayProcess) -> dict[str, Any]:
    response = httpx.get(f"{gateway.url}/admin/models", headers=ADMIN, timeout=10)
    assert response.status_code == 200, response.text
    return dict(response.json())


def states(gateway: GatewayProcess) -> dict[str, str]:
    return {m["model"]: m["state"] for m in table(gateway)["models"]}


def fresh(gateway: GatewayProcess) -> None:
    """Nothing pinned, nothing loaded (ensembles first: their steps go with them)."""
    models = table(gateway)["models"]
    for model in models:
        if model["pinned"]:
            httpx.post(
                f"{gateway.url}/admin/models/{model['model']}/unpin", headers=ADMIN, timeout=10
            )
    for model in sorted(models, key=lambda m: m["model"] not in ENSEMBLES):
        if states(gateway)[model["model"]] == "loaded":
            response = httpx.post(
                f"{gateway.url}/admin/models/{model['model']}/evict", headers=ADMIN, timeout=60
            )
            assert response.status_code == 200, response.text
    assert "loaded" not in states(gateway).values()


def infer(
    gateway: GatewayProcess,
    headers: dict[str, str],
    model: str,
    x: int = 5,
    extra: dict[str, str] | None = None,
) -> httpx.Response:
    body = {"inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [x]}]}
    return httpx.post(
        f"{gateway.url}/v2/models/{model}/infer",
        json=body,
        headers={**headers, **(extra or {})},
        timeout=60,
    )


def answer(response: httpx.Response) -> int:
    assert response.status_code == 200, response.text
    return int(response.json()["outputs"][0]["data"][0])


def metric(gateway: GatewayProcess, name: str, **labels: str) -> float:
    text = httpx.get(f"{gateway.url}/metrics", headers=METRICS_HEADERS, timeout=10).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def wait_until(check: Any, timeout_s: float = 60.0) -> None:
    """Poll an observable condition (bounded): the gateway's own state, not a guess at timing."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_first_requests_load_the_model_once(
    gateway: GatewayProcess, headers: dict[str, str], repo: Path
) -> None:
    fresh(gateway)
    model = variant_name(0)
    before = initializations(repo, model)
    assert states(gateway)[model] == "available"

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=60) as client:
            body = {"inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [7]}]}
            return list(
                await asyncio.gather(
                    *(client.post(f"/v2/models/{model}/infer", json=body) for _ in range(6))
                )
            )

    assert [answer(r) for r in asyncio.run(burst())] == [7] * 6
    assert initializations(repo, model) == before + 1  # one load for six waiting requests
    assert metric(gateway, "gateway_model_loads_total", model=model, outcome="loaded") == 1
    listed = {
        m["id"]: m
        for m in httpx.get(f"{gateway.url}/v1/models", headers=headers, timeout=10).json()["data"]
    }
    assert listed[model]["state"] == "loaded"
    assert listed[model]["footprint_bytes"] >= BALLAST_MB * MIB  # measured: the ballast is in it
    assert listed[variant_name(1)]["state"] == "available"

    # Unloading gives the memory back (the stub exits): Triton's process tree shrinks by the ballast.
    loaded_bytes = table(gateway)["measured_bytes"]
    response = httpx.post(f"{gateway.url}/admin/models/{model}/evict", headers=ADMIN, timeout=60)
    assert response.json()["state"] == "available"
    assert loaded_bytes - table(gateway)["measured_bytes"] >= BALLAST_MB * MIB


def test_loading_evicts_the_least_recently_used(
    gateway: GatewayProcess, headers: dict[str, str]
) -> None:
    fresh(gateway)
    first, second, third = (variant_name(i) for i in range(3))
    assert answer(infer(gateway, headers, first)) == 5
    assert answer(infer(gateway, headers, second)) == 6
    assert answer(infer(gateway, headers, first)) == 5  # `second` is now the least recently used
    evicted = metric(gateway, "gateway_model_evictions_total", model=second)
    assert answer(infer(gateway, headers, third)) == 7
    now = states(gateway)
    assert (now[first], now[second], now[third]) == ("loaded", "available", "loaded")
    assert metric(gateway, "gateway_model_evictions_total", model=second) == evicted + 1
    assert table(gateway)["charged_bytes"] <= BUDGET


def test_pinned_models_are_never_evicted(gateway: GatewayProcess, headers: dict[str, str]) -> None:
    fresh(gateway)
    pinned = variant_name(0)
    assert httpx.post(f"{gateway.url}/admin/models/{pinned}/pin", headers=ADMIN, timeout=10).json()[
        "pinned"
    ]
    assert answer(infer(gateway, headers, pinned)) == 5
    for index in (1, 2, 3, 1):
        assert answer(infer(gateway, headers, variant_name(index))) == 5 + index
        assert states(gateway)[pinned] == "loaded"
    refused = httpx.post(f"{gateway.url}/admin/models/{pinned}/evict", headers=ADMIN, timeout=10)
    assert "pinned" in api_error(refused, 503).message


def test_a_model_with_requests_in_flight_is_not_evicted(
    gateway: GatewayProcess, headers: dict[str, str], repo: Path
) -> None:
    fresh(gateway)
    busy, other, cold, colder = (variant_name(i) for i in range(4))
    held: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: held.append(infer(gateway, headers, busy, x=-1001)))
    thread.start()
    try:
        wait_until(
            lambda: any(
                m["model"] == busy and m["in_flight"] == 1 for m in table(gateway)["models"]
            )
        )
        assert answer(infer(gateway, headers, other)) == 6
        # `busy` is the least recently used, but its request is still running: `other` goes instead.
        assert answer(infer(gateway, headers, cold)) == 7
        now = states(gateway)
        assert (now[busy], now[other], now[cold]) == ("loaded", "available", "loaded")
        # With the only evictable model gone, no room can be made: refused, and nothing evicted.
        second: list[httpx.Response] = []
        thread2 = threading.Thread(
            target=lambda: second.append(infer(gateway, headers, cold, x=-1002))
        )
        thread2.start()
        wait_until(
            lambda: any(
                m["model"] == cold and m["in_flight"] == 1 for m in table(gateway)["models"]
            )
        )
        problem = api_error(infer(gateway, headers, colder, extra=PROBLEM), 503)
        assert "no room" in problem.message
        assert states(gateway)[busy] == states(gateway)[cold] == "loaded"
        release(repo, cold, 1002)
        thread2.join(60)
        assert answer(second[0]) == -1002 + 2
    finally:
        release(repo, busy, 1001)
        thread.join(60)
    assert answer(held[0]) == -1001  # the held request was never dropped


def test_a_model_larger_than_the_budget_is_refused(
    gateway: GatewayProcess, headers: dict[str, str], repo: Path
) -> None:
    problem = api_error(infer(gateway, headers, HUGE, extra=PROBLEM), 507)
    assert str(16 * 1024 * MIB) in problem.message and str(BUDGET) in problem.message
    assert initializations(repo, HUGE) == 0


def test_a_failing_model_fails_alone_with_backoff(
    gateway: GatewayProcess, headers: dict[str, str]
) -> None:
    fresh(gateway)
    assert answer(infer(gateway, headers, variant_name(0))) == 5
    assert answer(infer(gateway, headers, variant_name(1))) == 6
    first = infer(gateway, headers, BROKEN, extra=PROBLEM)
    assert "failed to load" in api_error(first, 503).message
    loaded = {m for m, s in states(gateway).items() if s == "loaded"}
    again = infer(gateway, headers, BROKEN, extra=PROBLEM)
    assert "next attempt" in api_error(again, 503).message and int(again.headers["Retry-After"]) > 1
    assert metric(gateway, "gateway_model_loads_total", model=BROKEN, outcome="failed") == 1
    assert {
        m for m, s in states(gateway).items() if s == "loaded"
    } == loaded  # the retry evicted nothing
    assert answer(infer(gateway, headers, next(iter(loaded)))) in (5, 6)


def test_ensembles_keep_a_step_another_ensemble_uses(
    gateway: GatewayProcess, headers: dict[str, str]
) -> None:
    fresh(gateway)
    pair_a, pair_b = ENSEMBLES
    assert answer(infer(gateway, headers, pair_a)) == 105
    assert states(gateway)[SHARED_STEP] == "loaded"
    assert answer(infer(gateway, headers, pair_b)) == 105
    httpx.post(
        f"{gateway.url}/admin/models/{pair_a}/evict", headers=ADMIN, timeout=60
    ).raise_for_status()
    now = states(gateway)
    assert (now[pair_a], now[pair_b], now[SHARED_STEP]) == ("available", "loaded", "loaded")
    assert answer(infer(gateway, headers, pair_b)) == 105
    httpx.post(
        f"{gateway.url}/admin/models/{pair_b}/evict", headers=ADMIN, timeout=60
    ).raise_for_status()
    assert (
        states(gateway)[SHARED_STEP] == "available"
    )  # carried in by the ensembles, gone with the last
