"""Rate limits against real gateways and a real Redis: one shared limit, outage policies."""

from __future__ import annotations

import httpx
import pytest

from tests.support.api_errors import api_error
from tests.support.gateway_procs import ADMIN_TOKEN, RedisProcess, tiny_request

pytestmark = pytest.mark.integration

INFER = "/v2/models/tiny_linear/infer"


@pytest.fixture(scope="module")
def redis_pair(gateway_factory, tiny_triton, redis_url, tmp_path_factory):  # type: ignore[no-untyped-def]
    """Two gateway processes sharing one key database and one Redis."""
    workdir = tmp_path_factory.mktemp("shared")
    first = gateway_factory(tiny_triton.http_url, workdir=workdir, redis_url=redis_url)
    second = gateway_factory(tiny_triton.http_url, workdir=workdir, redis_url=redis_url)
    return first, second


def _key(gateway, tier: str) -> str:  # type: ignore[no-untyped-def]
    response = httpx.post(
        gateway.url + "/admin/keys",
        json={"name": "rl", "tier": tier},
        headers={"X-Admin-Token": ADMIN_TOKEN},
    )
    assert response.status_code == 201, response.text
    return str(response.json()["api_key"])


def test_two_gateways_share_one_limit(redis_pair) -> None:
    first, second = redis_pair
    key = _key(first, "tiny")  # burst 4, then one request a minute: the test never sees a refill
    auth = {"Authorization": f"Bearer {key}"}
    statuses = []
    refused: list[httpx.Response] = []
    for i in range(10):
        response = httpx.post(
            (first if i % 2 == 0 else second).url + INFER, json=tiny_request(), headers=auth
        )
        statuses.append(response.status_code)
        if response.status_code == 429:
            refused.append(response)
    assert statuses.count(200) == 4, statuses  # one combined bucket, not 4 per replica
    assert statuses.count(429) == 6, statuses
    for response in refused:
        assert "rate limit" in api_error(response, 429).message
        assert int(response.headers["Retry-After"]) >= 1
        assert response.headers["RateLimit-Remaining"] == "0"
        assert response.headers["RateLimit-Limit"] == "4"
        assert "RateLimit-Policy" in response.headers
    # The bucket is per model: the same key still has its full burst for another model.
    other = httpx.post(
        second.url + "/v2/models/slow_echo/infer",
        json={"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "INT32", "data": [1]}]},
        headers=auth,
    )
    assert other.status_code == 200 and other.headers["RateLimit-Remaining"] == "3"


def test_in_process_limit_without_redis(gateway, admin) -> None:
    key = admin.create_key(tier="tiny")
    statuses = [
        httpx.post(gateway.url + INFER, json=tiny_request(), headers=admin.headers(key)).status_code
        for _ in range(6)
    ]
    assert statuses == [200, 200, 200, 200, 429, 429]


@pytest.mark.parametrize(("policy", "expected"), [("open", 200), ("closed", 503)])
def test_redis_outage_follows_the_policy(
    gateway_factory, tiny_triton, tmp_path, policy: str, expected: int
) -> None:  # type: ignore[no-untyped-def]
    redis_server = RedisProcess(tmp_path).start()  # this test's own: it is stopped mid-test
    try:
        # A short key cache TTL, so the outage meets expired entries: "open" keeps honouring keys it
        # has looked up before (stale if error), "closed" refuses them.
        gateway = gateway_factory(
            tiny_triton.http_url,
            redis_url=redis_server.url,
            redis_failure_policy=policy,
            key_cache_ttl_s=0.05,
        )
        auth = {"Authorization": f"Bearer {_key(gateway, 'tiny')}"}
        unseen = {"Authorization": f"Bearer {_key(gateway, 'tiny')}"}
        assert httpx.post(gateway.url + INFER, json=tiny_request(), headers=auth).status_code == 200
    finally:
        redis_server.stop()
    for _ in range(3):  # first call hits the outage, the next ones the back-off: same answer
        response = httpx.post(gateway.url + INFER, json=tiny_request(), headers=auth)
        assert response.status_code == expected, response.text
    if expected == 503:
        assert int(response.headers["Retry-After"]) >= 1
        assert "Redis" in api_error(response, 503).message
    # A key this gateway never looked up cannot be verified under either policy.
    response = httpx.post(gateway.url + INFER, json=tiny_request(), headers=unseen)
    assert "Redis" in api_error(response, 503).message
    assert gateway.process.running()  # the outage never takes the gateway down
    assert httpx.get(gateway.url + "/healthz").status_code == 200


@pytest.mark.parametrize("store", ["redis", "in-process"])
async def test_hit_all_stops_at_the_first_refusal(store: str, redis_url: str) -> None:
    """Both of a request's buckets in one call: the refusal is the last decision, and a bucket after
    it keeps its tokens; the same in Redis (one script) and in process."""
    import uuid

    from gateway.tenancy.ratelimit import InProcessRateLimiter, RedisRateLimiter
    from gateway.tenancy.tiers import RateLimit

    limiter = (
        RedisRateLimiter(redis_url, prefix=f"t{uuid.uuid4().hex}:")
        if store == "redis"
        else InProcessRateLimiter()
    )
    one, two = RateLimit(per_minute=1, burst=1), RateLimit(per_minute=1, burst=2)
    try:
        first = await limiter.hit_all([("key", two), ("key:m", one)])
        assert [d.allowed for d in first] == [True, True] and [d.remaining for d in first] == [1, 0]
        # The model's bucket refuses: the key's token is taken all the same (as two calls would).
        second = await limiter.hit_all([("key", two), ("key:m", one)])
        assert [d.allowed for d in second] == [True, False] and second[1].retry_after_s > 0
        # The key's bucket refuses: the other model's bucket is not touched.
        third = await limiter.hit_all([("key", two), ("key:other", one)])
        assert [d.allowed for d in third] == [False]
        assert (await limiter.hit("key:other", one)).allowed
        assert not any(d.degraded for d in (*first, *second, *third))
    finally:
        await limiter.close()
