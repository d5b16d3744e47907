"""Admission against the real gateway, Triton and Redis: bounded state per client, reserved paths,
admin input.

- A flood of made-up model names is refused (404) and leaves no rate-limit bucket (counted in
  Redis, where every bucket is a key) and no metric label behind.
- A key's limit across all models holds while each per-model bucket still has room.
- Triton's own routes under ``/v2/models/`` (``stats``) are not reachable as model names.
- Traffic weights are finite and bounded, and only READY versions can be pinned.
"""

from __future__ import annotations

import re

import httpx
import pytest
import redis

from serving.launcher import TritonServer
from tests.support.gateway_procs import (
    ADMIN_TOKEN,
    METRICS_HEADERS,
    GatewayProcess,
    create_key,
    tiny_request,
)
from tests.support.tiny_repo import SLOW_MODEL, TINY_MODEL

pytestmark = pytest.mark.integration

_ADMIN = {"X-Admin-Token": ADMIN_TOKEN}
# every API answers in its own error shape; the tests ask for the one that names the field
_PROBLEM = {"Accept": "application/problem+json"}
_TIERS = {
    "wide": {"per_minute": 6_000_000, "burst": 100_000},
    # room for 5 requests per model, but only 6 across all of them
    "capped": {"per_minute": 1, "burst": 5, "key_per_minute": 1, "key_burst": 6},
}


@pytest.fixture(scope="module")
def redis_gateway(  # type: ignore[no-untyped-def]
    gateway_factory, tiny_triton: TritonServer, redis_url: str
) -> GatewayProcess:
    return gateway_factory(tiny_triton.http_url, redis_url=redis_url, tier_limits=_TIERS)


def _key(gateway: GatewayProcess, tier: str) -> dict[str, str]:
    response = httpx.post(
        gateway.url + "/admin/keys", json={"name": tier, "tier": tier}, headers=_ADMIN
    )
    assert response.status_code == 201, response.text
    return {"Authorization": f"Bearer {response.json()['api_key']}", **_PROBLEM}


def _model_labels(metrics: str) -> set[str]:
    return set(re.findall(r'model="([^"]*)"', metrics))


def test_unknown_name_flood_leaves_no_buckets_or_labels(  # type: ignore[no-untyped-def]
    redis_gateway, redis_url
) -> None:
    auth = _key(redis_gateway, "wide")
    store = redis.Redis.from_url(redis_url)
    with redis_gateway.client(headers=auth) as client:
        assert client.post(f"/v2/models/{TINY_MODEL}/infer", json=tiny_request()).status_code == 200
        labels = _model_labels(client.get("/metrics", headers=METRICS_HEADERS).text)
        statuses = set()
        for i in range(150):
            name = f"made_up_{i}"
            statuses.add(client.post(f"/v2/models/{name}/infer", json=tiny_request()).status_code)
            statuses.add(client.get(f"/v2/models/{name}").status_code)
            statuses.add(client.get(f"/v2/models/{name}/ready").status_code)
            statuses.add(
                client.post("/v1/embeddings", json={"model": name, "input": "x"}).status_code
            )
        metrics = client.get("/metrics", headers=METRICS_HEADERS).text
        # The admin's view: every model and client the gateway keeps figures for.
        stats = client.get("/v1/stats", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).text
        # A bucket lives in Redis until it is full again (about a second here): one request just
        # made shows the scan sees live buckets, and the flood made none.
        assert client.post(f"/v2/models/{TINY_MODEL}/infer", json=tiny_request()).status_code == 200
        buckets = {key.decode() for key in store.scan_iter("gw:rl:*")}
    assert statuses == {404}
    assert any(key.endswith(f":{TINY_MODEL}") for key in buckets) and not any(
        "made_up" in k for k in buckets
    )
    assert (
        TINY_MODEL in labels and _model_labels(metrics) == labels
    )  # a real scrape, not a 401 body
    assert "made_up" not in metrics and "made_up" not in stats


def test_a_key_limit_spans_models(redis_gateway) -> None:  # type: ignore[no-untyped-def]
    auth = _key(redis_gateway, "capped")
    slow = {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "INT32", "data": [1]}]}
    statuses = []
    with redis_gateway.client(headers=auth) as client:
        for i in range(8):  # alternate: 4 per model at most, under each model's burst of 5
            model, body = (TINY_MODEL, tiny_request()) if i % 2 == 0 else (SLOW_MODEL, slow)
            response = client.post(f"/v2/models/{model}/infer", json=body)
            statuses.append(response.status_code)
        refused = response
    assert statuses == [200] * 6 + [429] * 2
    problem = refused.json()
    assert "across all models" in problem["detail"] and int(refused.headers["Retry-After"]) >= 1


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v2/models/stats/ready"),
        ("POST", "/v2/models/stats/infer"),
        ("GET", "/v2/models/ready"),
        ("POST", "/v1/embeddings"),
    ],
)
def test_reserved_triton_paths_are_not_model_names(  # type: ignore[no-untyped-def]
    gateway, admin, method: str, path: str
) -> None:
    auth = {**admin.headers(admin.create_key()), **_PROBLEM}
    body = {"model": "stats", "input": "x"} if path == "/v1/embeddings" else tiny_request()
    response = httpx.request(
        method, gateway.url + path, headers=auth, json=body if method == "POST" else None
    )
    assert response.status_code == 400, response.text
    problem = response.json()
    assert problem["field"] == "model" and "reserved" in problem["detail"]
    assert "model_stats" not in response.text  # Triton's statistics never leak through


def test_traffic_weights_and_versions_are_validated(gateway) -> None:  # type: ignore[no-untyped-def]
    url = gateway.url + f"/admin/traffic/{TINY_MODEL}"

    def put(body: object, target: str = url) -> httpx.Response:
        content = body if isinstance(body, str) else None
        return httpx.put(
            target,
            json=None if content else body,
            content=content,
            headers={**_ADMIN, "Content-Type": "application/json"},
        )

    for weights, field in (
        ({"1": 1e308}, "versions.1"),
        ({"1": -1}, "versions.1"),
        ('{"versions": {"1": NaN}}', "versions.1"),
        ('{"versions": {"1": Infinity}}', "versions.1"),
    ):
        response = put(weights if isinstance(weights, str) else {"versions": weights})
        assert response.status_code == 422 and response.json()["field"] == field, response.text
    for weights, field in (
        ({"1": 0}, "versions"),
        ({"latest": 1}, "versions"),
        ({"\u0661": 1}, "versions"),
    ):
        response = put({"versions": weights})
        assert response.status_code == 400 and response.json()["field"] == field, response.text
    missing = put({"versions": {"1": 0.5, "7": 0.5}})
    assert missing.status_code == 409 and missing.json()["field"] == "versions.7", missing.text
    assert (
        put({"versions": {"1": 1}}, gateway.url + "/admin/traffic/no_such_model").status_code == 404
    )
    assert put({"versions": {"1": 1}}, gateway.url + "/admin/traffic/stats").status_code == 400
    assert (
        httpx.get(gateway.url + "/admin/traffic", headers=_ADMIN).json()["models"] == {}
    )  # nothing half-applied
    pinned = put({"versions": {"1": 3}})
    assert pinned.status_code == 200 and pinned.json()["models"] == {TINY_MODEL: {"1": 1.0}}
    # A share sent to another model (a canary pipeline) needs that model READY too, and a valid name.
    absent = put({"versions": {"1": 1, "model:no_such_model": 1}})
    assert absent.status_code == 409 and absent.json()["field"] == "versions.model:no_such_model", (
        absent.text
    )
    assert put({"versions": {"1": 1, "model:stats": 1}}).status_code == 400
    # What the weights routed, per target (the promoter's canary watch reads this).
    tiny = tiny_request()
    assert (
        httpx.post(
            gateway.url + f"/v2/models/{TINY_MODEL}/infer",
            json=tiny,
            headers=create_key(gateway)[0],
        ).status_code
        == 200
    )
    routed = httpx.get(url, headers=_ADMIN).json()
    assert routed["weights"] == {"1": 1.0} and routed["outcomes"] == {
        "1": {"answered": 1, "failed": 0}
    }
    assert httpx.delete(url, headers=_ADMIN).status_code == 204
    assert httpx.get(url, headers=_ADMIN).json() == {
        "model": TINY_MODEL,
        "weights": {},
        "outcomes": {},
    }


@pytest.mark.parametrize("refused", ["malformed", "unknown_model"])
def test_refused_requests_cost_a_token(gateway, refused: str) -> None:  # type: ignore[no-untyped-def]
    # "tiny": a burst of 4, then one a minute, and no limit across models. A malformed body for a
    # known model takes the model's token (admission comes before the parse); an unknown name takes
    # one from the key's bucket for refused requests. Either way the fifth request is refused 429
    # before any work, and so is a good one after it.
    auth, _ = create_key(gateway, tier="tiny")
    path, body = (
        (f"/v2/models/{TINY_MODEL}/infer", b'{"inputs": [')
        if refused == "malformed"
        else ("/v2/models/made_up_model/infer", b'{"inputs": []}')
    )
    expected = 400 if refused == "malformed" else 404
    with gateway.client(headers={**auth, **_PROBLEM, "Content-Type": "application/json"}) as client:
        statuses = [client.post(path, content=body).status_code for _ in range(4)]
        blocked = client.post(path, content=body)
        good = client.post(f"/v2/models/{TINY_MODEL}/infer", json=tiny_request())
    assert statuses == [expected] * 4
    for response in (blocked, good):
        assert response.status_code == 429, response.text
        assert int(response.headers["Retry-After"]) >= 1
        assert "rate limit" in response.json()["detail"]
    # Another key of the same tier is not affected.
    other, _ = create_key(gateway, tier="tiny")
    response = httpx.post(
        gateway.url + f"/v2/models/{TINY_MODEL}/infer", json=tiny_request(), headers=other
    )
    assert response.status_code == 200, response.text


def test_a_keys_concurrency_is_bounded(  # type: ignore[no-untyped-def]
    gateway_factory, tiny_triton: TritonServer
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from tests.support.tiny_repo import release_slow, slow_executions

    tiers = {
        "single": {"per_minute": 6000, "burst": 100, "max_concurrent": 1},
        "wide": {"per_minute": 6_000_000, "burst": 100_000},
    }
    gateway = gateway_factory(tiny_triton.http_url, tier_limits=tiers)
    single, other = _key(gateway, "single"), _key(gateway, "wide")
    hold = 1301  # held in the model until released: the key has one request in flight meanwhile
    slow = {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "INT32", "data": [-hold]}]}
    url = gateway.url + f"/v2/models/{SLOW_MODEL}/infer"
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(httpx.post, url, json=slow, headers=single, timeout=60)
        try:
            for _ in range(
                600
            ):  # bounded: until the model runs it, or the request ends (a failure)
                if -hold in slow_executions(tiny_triton.repository):
                    break
                try:
                    first.result(timeout=0.05)
                except TimeoutError:
                    continue
                break
            assert -hold in slow_executions(tiny_triton.repository), (
                "the first request never reached the model"
            )
            second = httpx.post(
                gateway.url + f"/v2/models/{TINY_MODEL}/infer", json=tiny_request(), headers=single
            )
            assert second.status_code == 429, second.text
            assert (
                "1 requests in flight" in second.json()["detail"]
                and int(second.headers["Retry-After"]) >= 1
            )
            # Another key is not held back by this one.
            assert (
                httpx.post(
                    gateway.url + f"/v2/models/{TINY_MODEL}/infer",
                    json=tiny_request(),
                    headers=other,
                ).status_code
                == 200
            )
        finally:
            release_slow(tiny_triton.repository, hold)
        assert first.result(timeout=60).status_code == 200
    assert (
        httpx.post(
            gateway.url + f"/v2/models/{TINY_MODEL}/infer", json=tiny_request(), headers=single
        ).status_code
        == 200
    )


def test_a_client_that_leaves_frees_its_slot(  # type: ignore[no-untyped-def]
    gateway_factory, tiny_triton: TritonServer
) -> None:
    # A key that may have one request in flight sends one the model holds, then disconnects: its
    # request is cancelled in the gateway (its slot freed), so the key's next request is served
    # while the first is still held in the model.
    import json
    import socket

    from tests.support.tiny_repo import release_slow, slow_executions

    tiers = {"single": {"per_minute": 6000, "burst": 1000, "max_concurrent": 1}}
    gateway = gateway_factory(tiny_triton.http_url, tier_limits=tiers)
    auth = _key(gateway, "single")
    hold = 1401
    body = json.dumps(
        {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "INT32", "data": [-hold]}]}
    ).encode()
    host, port = gateway.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=20)
    try:
        sock.sendall(
            f"POST /v2/models/{SLOW_MODEL}/infer HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: {auth['Authorization']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        url = gateway.url + f"/v2/models/{TINY_MODEL}/infer"
        for _ in range(600):  # bounded: until the model holds the first request
            if -hold in slow_executions(tiny_triton.repository):
                break
            httpx.get(gateway.url + "/healthz")  # paces the polling on a real round trip
        assert -hold in slow_executions(tiny_triton.repository)
        assert (
            httpx.post(url, json=tiny_request(), headers=auth).status_code == 429
        )  # the slot is taken
        sock.close()  # the client leaves
        statuses = []
        for _ in range(200):  # bounded: until the gateway has noticed
            statuses.append(httpx.post(url, json=tiny_request(), headers=auth).status_code)
            if statuses[-1] != 429:
                break
        assert statuses[-1] == 200, statuses
        assert "client disconnected; its request is cancelled" in gateway.log()
    finally:
        sock.close()
        release_slow(tiny_triton.repository, hold)
