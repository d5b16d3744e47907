"""Authentication and authorisation against the real gateway and Triton."""

from __future__ import annotations

import time

import httpx
import jwt
import pytest

from tests.support.api_errors import ApiError, api_error
from tests.support.gateway_procs import ADMIN_TOKEN, tiny_request

pytestmark = pytest.mark.integration

INFER = "/v2/models/tiny_linear/infer"


def _assert_problem(response: httpx.Response, status: int, field: str | None = None) -> ApiError:
    """The error in its path's shape; ``field`` is checked where the shape carries one (not KServe's)."""
    error = api_error(response, status)
    if field is not None and error.shape != "kserve":
        assert error.field == field, error
    return error


def test_valid_key_is_served_with_ratelimit_headers(gateway, admin) -> None:
    key = admin.create_key()
    response = httpx.post(gateway.url + INFER, json=tiny_request(2), headers=admin.headers(key))
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [5.0, 4.0, 5.0, 4.0]
    for header in (
        "RateLimit-Limit",
        "RateLimit-Remaining",
        "RateLimit-Reset",
        "RateLimit-Policy",
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
    ):
        assert header in response.headers
    assert (
        response.headers["x-ratelimit-remaining-requests"]
        == response.headers["RateLimit-Remaining"]
    )
    # X-API-Key works as well as the bearer form.
    response = httpx.post(
        gateway.url + INFER, json=tiny_request(), headers={"X-API-Key": str(key["api_key"])}
    )
    assert response.status_code == 200


def test_missing_key_is_refused(gateway) -> None:
    response = httpx.post(gateway.url + INFER, json=tiny_request())
    assert "missing credential" in _assert_problem(response, 401).message
    assert "WWW-Authenticate" in response.headers
    # The same refusal as a problem document, for a client that asks for one.
    asked = httpx.post(
        gateway.url + INFER, json=tiny_request(), headers={"Accept": "application/problem+json"}
    )
    assert _assert_problem(asked, 401, "authorization").shape == "problem"


def test_wrong_key_is_refused(gateway, admin) -> None:
    key = admin.create_key()
    tampered = str(key["api_key"])[:-4] + "AAAA"
    _assert_problem(
        httpx.post(
            gateway.url + INFER,
            json=tiny_request(),
            headers={"Authorization": f"Bearer {tampered}"},
        ),
        401,
    )
    unknown = "gk_000000000000_" + "x" * 43
    _assert_problem(
        httpx.post(
            gateway.url + INFER, json=tiny_request(), headers={"Authorization": f"Bearer {unknown}"}
        ),
        401,
    )
    _assert_problem(
        httpx.post(
            gateway.url + INFER, json=tiny_request(), headers={"Authorization": "Bearer not-a-key"}
        ),
        401,
    )


def test_revoked_key_is_refused(gateway, admin) -> None:
    key = admin.create_key()
    headers = admin.headers(key)
    assert httpx.post(gateway.url + INFER, json=tiny_request(), headers=headers).status_code == 200
    revoked = httpx.delete(
        f"{gateway.url}/admin/keys/{key['key_id']}", headers={"X-Admin-Token": ADMIN_TOKEN}
    )
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    body = _assert_problem(
        httpx.post(gateway.url + INFER, json=tiny_request(), headers=headers), 401
    )
    assert "revoked" in body.message


def test_out_of_scope_key_is_refused(gateway, admin) -> None:
    key = admin.create_key(scopes=["slow_echo"])
    body = _assert_problem(
        httpx.post(gateway.url + INFER, json=tiny_request(), headers=admin.headers(key)),
        403,
        "model",
    )
    assert "tiny_linear" in body.message
    models = httpx.get(gateway.url + "/v1/models", headers=admin.headers(key)).json()["data"]
    assert [m["id"] for m in models] == ["slow_echo"]


def test_rotation_replaces_the_secret(gateway, admin) -> None:
    key = admin.create_key()
    rotated = httpx.post(
        f"{gateway.url}/admin/keys/{key['key_id']}/rotate", headers={"X-Admin-Token": ADMIN_TOKEN}
    )
    assert rotated.status_code == 200, rotated.text
    new = rotated.json()
    assert new["key_id"] == key["key_id"] and new["api_key"] != key["api_key"]
    _assert_problem(
        httpx.post(gateway.url + INFER, json=tiny_request(), headers=admin.headers(key)), 401
    )
    assert (
        httpx.post(gateway.url + INFER, json=tiny_request(), headers=admin.headers(new)).status_code
        == 200
    )


def test_admin_api_needs_its_own_credential(gateway, admin) -> None:
    key = admin.create_key()
    _assert_problem(httpx.get(gateway.url + "/admin/keys"), 401)
    _assert_problem(httpx.get(gateway.url + "/admin/keys", headers=admin.headers(key)), 401)
    listing = httpx.get(gateway.url + "/admin/keys", headers={"X-Admin-Token": ADMIN_TOKEN})
    assert listing.status_code == 200
    entries = {k["key_id"]: k for k in listing.json()}
    assert key["key_id"] in entries and "api_key" not in entries[key["key_id"]]
    bad_tier = httpx.post(
        gateway.url + "/admin/keys",
        json={"name": "x", "tier": "gold"},
        headers={"X-Admin-Token": ADMIN_TOKEN},
    )
    _assert_problem(bad_tier, 400, "tier")
    _assert_problem(
        httpx.delete(
            gateway.url + "/admin/keys/ffffffffffff", headers={"X-Admin-Token": ADMIN_TOKEN}
        ),
        404,
        "key_id",
    )


@pytest.fixture(scope="module")
def jwt_gateway(gateway_factory, tiny_triton):  # type: ignore[no-untyped-def]
    return gateway_factory(
        tiny_triton.http_url,
        jwt_secret="jwt-test-secret-0123456789abcdef0123456789",
        jwt_issuer="https://issuer.test",
        jwt_audience="inference-gateway",
        tier_limits={"free": {"per_minute": 600000, "burst": 100000}},
    )


def _token(**overrides: object) -> str:
    claims: dict[str, object] = {
        "sub": "user-42",
        "iss": "https://issuer.test",
        "aud": "inference-gateway",
        "exp": int(time.time()) + 300,
        "scope": "tiny_linear",
    }
    claims.update(overrides)
    return jwt.encode(
        {k: v for k, v in claims.items() if v is not None},
        "jwt-test-secret-0123456789abcdef0123456789",
        algorithm="HS256",
    )


def test_jwt_bearer_tokens(jwt_gateway) -> None:
    url = jwt_gateway.url + INFER

    def call(token: str) -> httpx.Response:
        return httpx.post(url, json=tiny_request(), headers={"Authorization": f"Bearer {token}"})

    assert call(_token()).status_code == 200
    assert "expired" in str(_assert_problem(call(_token(exp=int(time.time()) - 60)), 401).message)
    assert "audience" in str(_assert_problem(call(_token(aud="someone-else")), 401).message).lower()
    assert (
        "issuer" in str(_assert_problem(call(_token(iss="https://evil.test")), 401).message).lower()
    )
    _assert_problem(call(_token(exp=None)), 401)
    forged = jwt.encode(
        {
            "sub": "x",
            "iss": "https://issuer.test",
            "aud": "inference-gateway",
            "exp": int(time.time()) + 60,
        },
        "wrong-secret-wrong-secret-wrong-secret!!",
        algorithm="HS256",
    )
    _assert_problem(call(forged), 401)
    _assert_problem(call(_token(scope="slow_echo")), 403, "model")


def test_secrets_never_reach_the_log(gateway, admin) -> None:
    key = admin.create_key()
    httpx.post(gateway.url + INFER, json=tiny_request(), headers=admin.headers(key))
    httpx.post(
        gateway.url + INFER,
        json=tiny_request(),
        headers={"Authorization": f"Bearer {key['api_key']}x"},
    )
    log = gateway.log()
    assert str(key["key_id"]) in log  # the public id is logged, so the log is not simply empty
    assert str(key["api_key"]) not in log
    assert ADMIN_TOKEN not in log


def test_the_key_store_and_tenant_databases_are_private(  # type: ignore[no-untyped-def]
    gateway, admin
) -> None:
    import os
    import stat
    from pathlib import Path

    admin.create_key()  # a write (its WAL and shared-memory files, while they exist, are checked too)
    keys = Path(gateway.env["GATEWAY_KEYS_DB"])
    files = [
        p
        for p in keys.parent.iterdir()
        if p.name.startswith((keys.name, "gateway_jobs", "gateway_usage"))
    ]
    assert keys in files, files
    for path in files:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, (
            f"{path.name} is {oct(os.stat(path).st_mode)}"
        )
