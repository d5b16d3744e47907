"""Error contract against the real gateway and Triton: each API's error shape, statuses, Retry-After."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from serving.ports import reserve_port
from tests.support.api_errors import api_error
from tests.support.gateway_procs import ADMIN_TOKEN, METRICS_HEADERS, tiny_request

pytestmark = pytest.mark.integration

INFER = "/v2/models/tiny_linear/infer"


@pytest.fixture(scope="module")
def headers(admin) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return admin.headers(admin.create_key())


def _problem(response: httpx.Response, status: int) -> dict[str, object]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    return response.json()  # type: ignore[no-any-return]


PROBLEM = {"Accept": "application/problem+json"}


def test_unknown_model_is_404_naming_it(gateway, headers) -> None:
    error = api_error(
        httpx.post(
            gateway.url + "/v2/models/no_such_model/infer", json=tiny_request(), headers=headers
        ),
        404,
    )
    assert "no_such_model" in error.message
    assert api_error(
        httpx.get(gateway.url + "/v2/models/no_such_model/ready", headers=headers), 404
    )
    asked = httpx.post(
        gateway.url + "/v2/models/no_such_model/infer",
        json=tiny_request(),
        headers={**headers, **PROBLEM},
    )
    assert _problem(asked, 404)["field"] == "model"


def test_not_yet_built_models_are_404_naming_them(gateway, headers) -> None:
    emb = api_error(
        httpx.post(
            gateway.url + "/v1/embeddings",
            json={"model": "text_embedding", "input": ["hi"]},
            headers=headers,
        ),
        404,
    )
    assert (
        "text_embedding" in emb.message and emb.field == "model" and emb.code == "model_not_found"
    )
    img = api_error(
        httpx.post(
            gateway.url + "/v1/images/generations",
            json={"prompt": "a fox", "size": "64x64"},
            headers=headers,
        ),
        404,
    )
    assert "stable_diffusion" in img.message and img.code == "model_not_found"


def test_bad_input_names_the_field(gateway, headers) -> None:
    wrong_shape = {
        "inputs": [{"name": "input", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]
    }
    body = _problem(
        httpx.post(gateway.url + INFER, json=wrong_shape, headers={**headers, **PROBLEM}), 400
    )
    assert body["field"] == "inputs.input"
    assert (
        "input"
        in api_error(
            httpx.post(gateway.url + INFER, json=wrong_shape, headers=headers), 400
        ).message
    )
    # OpenAI answers invalid parameters with 400 (the SDKs raise BadRequestError) and names them in `param`.
    missing = api_error(
        httpx.post(
            gateway.url + "/v1/embeddings", json={"model": "text_embedding"}, headers=headers
        ),
        400,
    )
    assert missing.field == "input" and missing.code == "validation_error"
    size = api_error(
        httpx.post(
            gateway.url + "/v1/images/generations",
            json={"prompt": "x", "size": "big"},
            headers=headers,
        ),
        400,
    )
    assert size.field == "size"
    bad_json = httpx.post(
        gateway.url + "/v1/embeddings",
        content=b"{not json",
        headers={**headers, "content-type": "application/json"},
    )
    assert api_error(bad_json, 400).field == "body"


def test_metadata_and_readiness_passthrough(gateway, headers) -> None:
    meta = httpx.get(gateway.url + "/v2/models/tiny_linear", headers=headers)
    assert meta.status_code == 200 and meta.json()["inputs"][0]["name"] == "input"
    assert (
        httpx.get(gateway.url + "/v2/models/tiny_linear/ready", headers=headers).status_code == 200
    )
    assert httpx.get(gateway.url + "/readyz").status_code == 200
    assert httpx.get(gateway.url + "/v2/health/ready").status_code == 200


def test_oversized_bodies_are_413_declared_or_streamed(gateway, headers) -> None:
    big = b"x" * (64 * 1024 + 1)
    assert (
        "larger than the limit"
        in api_error(httpx.post(gateway.url + INFER, content=big, headers=headers), 413).message
    )
    body = _problem(
        httpx.post(gateway.url + INFER, content=big, headers={**headers, **PROBLEM}), 413
    )
    assert body["field"] == "body"

    def chunks():  # no Content-Length: chunked transfer, counted as it streams
        for _ in range(100):
            yield b"y" * 4096

    api_error(httpx.post(gateway.url + INFER, content=chunks(), headers=headers), 413)
    # The limit is checked before authentication costs anything, and the gateway still serves after.
    assert httpx.post(gateway.url + INFER, json=tiny_request(), headers=headers).status_code == 200


def test_unknown_route_is_problem_json(gateway, headers) -> None:
    assert (
        _problem(httpx.get(gateway.url + "/v1/nothing-here", headers=headers), 404)["status"] == 404
    )


def test_triton_down_is_fast_503_and_not_ready(  # type: ignore[no-untyped-def]
    gateway_factory, admin
) -> None:
    dead = gateway_factory(f"127.0.0.1:{reserve_port()}")  # nothing listens there
    key = httpx.post(
        dead.url + "/admin/keys",
        json={"name": "d", "tier": "unlimited"},
        headers={"X-Admin-Token": ADMIN_TOKEN},
    ).json()
    auth = {"Authorization": f"Bearer {key['api_key']}"}
    response = httpx.post(dead.url + INFER, json=tiny_request(), headers=auth)
    assert (
        int(response.headers["Retry-After"]) >= 1
        and "unreachable" in api_error(response, 503).message
    )
    ready = httpx.get(dead.url + "/readyz")
    assert ready.status_code == 503 and "Retry-After" in ready.headers
    assert httpx.get(dead.url + "/healthz").status_code == 200


@pytest.fixture(scope="module")
def tight_gateway(gateway_factory, tiny_triton):  # type: ignore[no-untyped-def]
    return gateway_factory(tiny_triton.http_url, upstream_timeout_s=1.5, max_in_flight_per_model=1)


def _slow(delay_ms: int) -> dict[str, object]:
    return {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "INT32", "data": [delay_ms]}]}


def _tight_key(tight_gateway) -> dict[str, str]:  # type: ignore[no-untyped-def]
    key = httpx.post(
        tight_gateway.url + "/admin/keys",
        json={"name": "t", "tier": "unlimited"},
        headers={"X-Admin-Token": ADMIN_TOKEN},
    ).json()
    return {"Authorization": f"Bearer {key['api_key']}"}


def test_slow_upstream_is_504(tight_gateway) -> None:
    auth = _tight_key(tight_gateway)
    assert (
        httpx.post(
            tight_gateway.url + "/v2/models/slow_echo/infer", json=_slow(1), headers=auth
        ).status_code
        == 200
    )
    error = api_error(
        httpx.post(
            tight_gateway.url + "/v2/models/slow_echo/infer",
            json=_slow(4000),
            headers=auth,
            timeout=20,
        ),
        504,
    )
    assert "slow_echo" in error.message


def test_in_flight_bound_rejects_fast_with_retry_after(tight_gateway) -> None:
    auth = _tight_key(tight_gateway)
    url = tight_gateway.url + "/v2/models/slow_echo/infer"
    with ThreadPoolExecutor(1) as pool:
        holder = pool.submit(httpx.post, url, json=_slow(700), headers=auth, timeout=20)
        # Wait until the first request holds the only slot (the gauge says so), then knock.
        deadline = time.monotonic() + 10
        while (
            'gateway_in_flight_requests{model="slow_echo"} 1.0'
            not in httpx.get(tight_gateway.url + "/metrics", headers=METRICS_HEADERS).text
        ):
            assert time.monotonic() < deadline, "the first request never became in-flight"
            time.sleep(0.01)
        refused = httpx.post(url, json=_slow(1), headers=auth)
        assert holder.result().status_code == 200
    assert (
        int(refused.headers["Retry-After"]) >= 1 and "in flight" in api_error(refused, 429).message
    )
