"""Replicas and workers share one truth through a real Redis: keys, canary weights, rate limits.

Two gateway processes with separate working directories (so no SQLite file is shared: whatever they
agree on came through Redis), one real redis-server, the tiny Triton. Propagation waits for the
state asserted on (never a fixed sleep); how long it takes is measured by
``python -m loadtest.propagation``, not asserted here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import tritonclient.grpc as grpc

from gateway.tenancy.keys_sqlite import SqliteKeyStore
from serving.ports import reserve_port
from tests.support.api_errors import api_error
from tests.support.gateway_procs import (
    ADMIN_TOKEN,
    ROOT,
    GatewayProcess,
    tiny_request,
    worker_pids,
)

pytestmark = pytest.mark.integration

INFER = "/v2/models/tiny_linear/infer"
ADMIN = {"X-Admin-Token": ADMIN_TOKEN}
_DEADLINE_S = 15.0  # far above the sync interval: only a broken mechanism runs into it


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + _DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {_DEADLINE_S:.0f} s: {what}")
        time.sleep(0.02)


def _infer(gateway: GatewayProcess, key: str) -> httpx.Response:
    return httpx.post(
        gateway.url + INFER,
        json=tiny_request(),
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )


def _create(gateway: GatewayProcess, tier: str = "unlimited") -> dict[str, str]:
    response = httpx.post(
        gateway.url + "/admin/keys", json={"name": "shared", "tier": tier}, headers=ADMIN
    )
    assert response.status_code == 201, response.text
    return response.json()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def replicas(gateway_factory, tiny_triton, redis_url, tmp_path_factory):  # type: ignore[no-untyped-def]
    """Two gateways on one Redis, each with its own working directory."""
    return tuple(
        gateway_factory(
            tiny_triton.http_url,
            workdir=tmp_path_factory.mktemp(f"replica{i}"),
            redis_url=redis_url,
        )
        for i in range(2)
    )


def test_a_key_created_on_one_replica_works_on_the_other(replicas) -> None:  # type: ignore[no-untyped-def]
    first, second = replicas
    key = _create(first)["api_key"]
    assert _infer(second, key).status_code == 200  # no cache to wait for: B never saw this id
    listed = httpx.get(second.url + "/admin/keys", headers=ADMIN).json()
    assert key.split("_")[1] in {k["key_id"] for k in listed}


def test_revocation_through_one_replica_applies_on_the_other(  # type: ignore[no-untyped-def]
    replicas,
) -> None:
    first, second = replicas
    created = _create(first)
    for _ in range(3):  # B has it cached now
        assert _infer(second, created["api_key"]).status_code == 200
    assert (
        httpx.delete(f"{first.url}/admin/keys/{created['key_id']}", headers=ADMIN).status_code
        == 200
    )
    _wait_for(
        lambda: _infer(second, created["api_key"]).status_code == 401, "revoked key refused by B"
    )
    assert "revoked" in api_error(_infer(second, created["api_key"]), 401).message


def test_rotation_through_one_replica_applies_on_the_other(replicas) -> None:  # type: ignore[no-untyped-def]
    first, second = replicas
    created = _create(first)
    assert _infer(second, created["api_key"]).status_code == 200
    rotated = httpx.post(
        f"{second.url}/admin/keys/{created['key_id']}/rotate", headers=ADMIN
    ).json()["api_key"]
    assert _infer(second, rotated).status_code == 200
    assert _infer(first, rotated).status_code == 200
    _wait_for(
        lambda: _infer(first, created["api_key"]).status_code == 401, "old secret refused by A"
    )


def test_canary_weights_set_through_one_replica_apply_on_the_other(  # type: ignore[no-untyped-def]
    replicas,
) -> None:
    first, second = replicas
    key = _create(first)["api_key"]
    try:
        put = httpx.put(
            first.url + "/admin/traffic/tiny_linear", json={"versions": {"1": 1}}, headers=ADMIN
        )
        assert put.status_code == 200, put.text
        _wait_for(
            lambda: (
                httpx.get(second.url + "/admin/traffic", headers=ADMIN).json()["models"]
                == {"tiny_linear": {"1": 1.0}}
            ),
            "B lists A's weights",
        )
        pinned = _infer(second, key)
        assert pinned.status_code == 200 and pinned.json()["model_version"] == "1"
        # A version Triton does not serve cannot be pinned through any replica (every request would
        # fail), and the refusal changes nothing anywhere.
        refused = httpx.put(
            second.url + "/admin/traffic/tiny_linear", json={"versions": {"2": 1}}, headers=ADMIN
        )
        assert refused.status_code == 409 and "version 2" in refused.text
        assert httpx.get(first.url + "/admin/traffic", headers=ADMIN).json()["models"] == {
            "tiny_linear": {"1": 1.0}
        }
        assert (
            httpx.delete(second.url + "/admin/traffic/tiny_linear", headers=ADMIN).status_code
            == 204
        )
        _wait_for(
            lambda: httpx.get(first.url + "/admin/traffic", headers=ADMIN).json()["models"] == {},
            "A sees B's unpinning",
        )
    finally:
        httpx.delete(first.url + "/admin/traffic/tiny_linear", headers=ADMIN)


def _sqlite_export(path: Path) -> tuple[dict[str, object], str, str]:
    """A store as an operator migrating away from SQLite has it: one live key, one revoked."""
    store = SqliteKeyStore(path)
    _, live = store.create("migrated", ["tiny_linear"], "unlimited")
    gone_id, gone = store.create("migrated-revoked", ["*"], "unlimited")
    store.revoke(gone_id)
    return {"keys": [r.as_export() for r in store.list()]}, live, gone


def test_keys_imported_through_the_admin_api_authenticate_everywhere(  # type: ignore[no-untyped-def]
    replicas, tmp_path
) -> None:
    first, second = replicas
    document, live, gone = _sqlite_export(tmp_path / "old.sqlite3")
    response = httpx.post(first.url + "/admin/keys/import", json=document, headers=ADMIN)
    assert response.status_code == 200, response.text
    assert len(response.json()["imported"]) == 2 and response.json()["skipped"] == []
    assert _infer(second, live).status_code == 200 and _infer(first, live).status_code == 200
    assert _infer(second, gone).status_code == 401
    again = httpx.post(second.url + "/admin/keys/import", json=document, headers=ADMIN)
    assert again.status_code == 200 and len(again.json()["skipped"]) == 2

    clash = json.loads(json.dumps(document))
    clash["keys"][0]["tier"] = "free"  # same id, other content: refused whole
    clash["keys"].append({**clash["keys"][1], "key_id": "ee" * 6})
    refused = httpx.post(first.url + "/admin/keys/import", json=clash, headers=ADMIN)
    assert refused.status_code == 409 and refused.json()["field"] == "keys", refused.text
    assert "ee" * 6 not in {
        k["key_id"] for k in httpx.get(first.url + "/admin/keys", headers=ADMIN).json()
    }

    bad_tier = {"keys": [{**document["keys"][0], "key_id": "dd" * 6, "tier": "gold"}]}  # type: ignore[index]
    response = httpx.post(first.url + "/admin/keys/import", json=bad_tier, headers=ADMIN)
    assert response.status_code == 400 and "gold" in response.json()["detail"]
    first_key = document["keys"][0]  # type: ignore[index]
    plaintext = {"keys": [{**first_key, "key_id": "cc" * 6, "key_hash": live}]}
    assert (
        httpx.post(first.url + "/admin/keys/import", json=plaintext, headers=ADMIN).status_code
        == 422
    )
    assert httpx.post(first.url + "/admin/keys/import", json=document).status_code == 401


def test_cli_migrates_a_sqlite_store_into_redis(  # type: ignore[no-untyped-def]
    replicas, redis_url, tmp_path
) -> None:
    _, second = replicas
    old = tmp_path / "old.sqlite3"
    _, live, _ = _sqlite_export(old)
    env = {**second.env, "GATEWAY_REDIS_URL": ""}  # the export reads the SQLite file, not Redis
    export = subprocess.run(
        [sys.executable, "-m", "gateway", "keys", "export", "--keys-db", str(old)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert live not in export.stdout and "key_hash" in export.stdout
    imported = subprocess.run(
        [sys.executable, "-m", "gateway", "keys", "import", "-", "--redis-url", redis_url],
        cwd=ROOT,
        env=env,
        input=export.stdout,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert imported.returncode == 0, imported.stderr
    assert len(json.loads(imported.stdout)["imported"]) == 2
    assert _infer(second, live).status_code == 200


def _streak(condition: Callable[[], bool], what: str, length: int = 20) -> None:
    """Wait until ``condition`` holds ``length`` times in a row: with several workers behind one port
    (each request on a new connection, so the kernel spreads them), a streak means all have caught up."""
    run = 0

    def hold() -> bool:
        nonlocal run
        run = run + 1 if condition() else 0
        return run >= length

    _wait_for(hold, what)


def test_two_workers_serve_and_share_state(
    gateway_factory, tiny_triton, redis_url, tmp_path_factory
) -> None:  # type: ignore[no-untyped-def]
    gateway = gateway_factory(
        tiny_triton.http_url,
        workdir=tmp_path_factory.mktemp("workers"),
        redis_url=redis_url,
        workers=2,
        grpc_port=reserve_port(),  # every worker serves the gRPC entry too (SO_REUSEPORT)
    )
    workers = worker_pids(gateway.process.pid)
    assert len(workers) == 2
    # One bucket for all workers: burst 4, then one a minute (per worker, 10 requests would pass 8).
    limited = _create(gateway, tier="tiny")["api_key"]
    statuses = [_infer(gateway, limited).status_code for _ in range(10)]
    assert statuses.count(200) == 4 and statuses.count(429) == 6, statuses

    created = _create(gateway)
    _streak(
        lambda: _infer(gateway, created["api_key"]).status_code == 200,
        "every worker accepts a new key",
    )
    assert (
        httpx.delete(f"{gateway.url}/admin/keys/{created['key_id']}", headers=ADMIN).status_code
        == 200
    )
    _streak(
        lambda: _infer(gateway, created["api_key"]).status_code == 401, "every worker refuses it"
    )

    key = _create(gateway)["api_key"]
    try:
        pinned = {"tiny_linear": {"1": 1.0}}
        put = httpx.put(
            gateway.url + "/admin/traffic/tiny_linear", json={"versions": {"1": 1}}, headers=ADMIN
        )
        assert put.status_code == 200, put.text
        _streak(
            lambda: (
                httpx.get(gateway.url + "/admin/traffic", headers=ADMIN).json()["models"] == pinned
            ),
            "every worker has the weights",
        )
        assert _infer(gateway, key).json()["model_version"] == "1"
    finally:
        httpx.delete(gateway.url + "/admin/traffic/tiny_linear", headers=ADMIN)
    _streak(
        lambda: httpx.get(gateway.url + "/admin/traffic", headers=ADMIN).json()["models"] == {},
        "every worker unpinned",
    )
    _streak(lambda: _infer(gateway, key).status_code == 200, "every worker serves")
    grpc_client = grpc.InferenceServerClient(gateway.grpc_url)
    try:
        for _ in range(4):
            assert grpc_client.is_model_ready(
                "tiny_linear", headers={"authorization": f"Bearer {key}"}
            )
    finally:
        grpc_client.close()
    # Workers run the same HTTP server limits as a single process (431 past the header count).
    crowded = {f"x-h{i}": "1" for i in range(150)}
    assert httpx.get(gateway.url + "/healthz", headers=crowded).status_code == 431
    assert (
        worker_pids(gateway.process.pid) == workers
    )  # no worker died (and was replaced) on the way


def test_several_workers_without_redis_are_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway",
            "--workers",
            "2",
            "--keys-db",
            str(tmp_path / "k.sqlite3"),
        ],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "GATEWAY_REDIS_URL" in result.stderr, result.stderr
