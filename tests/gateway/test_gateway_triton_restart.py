"""Triton dies and comes back: the gateway answers 503 meanwhile, never hangs, and recovers."""

from __future__ import annotations

import time

import httpx
import pytest

from serving.launcher import TritonPorts, TritonServer
from tests.support.gateway_procs import ADMIN_TOKEN, tiny_request
from tests.support.tiny_repo import build_tiny_repository

pytestmark = pytest.mark.integration


def test_gateway_survives_a_triton_restart(gateway_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = TritonServer(build_tiny_repository(tmp_path / "repo"), ports=TritonPorts.free())
    server.start()
    try:
        gateway = gateway_factory(server.http_url)
        key = httpx.post(
            gateway.url + "/admin/keys",
            json={"name": "r", "tier": "unlimited"},
            headers={"X-Admin-Token": ADMIN_TOKEN},
        ).json()
        auth = {"Authorization": f"Bearer {key['api_key']}"}
        url = gateway.url + "/v2/models/tiny_linear/infer"
        with httpx.Client(headers=auth, timeout=10) as client:
            assert (
                client.post(url, json=tiny_request()).status_code == 200
            )  # a pooled connection now exists
            server.kill()
            down = client.post(url, json=tiny_request())
            assert down.status_code == 503 and int(down.headers["Retry-After"]) >= 1, down.text
            assert client.get(gateway.url + "/readyz").status_code == 503
            server.start()  # same ports
            deadline = time.monotonic() + 30
            while client.post(url, json=tiny_request()).status_code != 200:
                assert time.monotonic() < deadline, (
                    "the gateway never served again after Triton came back"
                )
                time.sleep(0.1)
            assert client.get(gateway.url + "/readyz").status_code == 200
    finally:
        server.stop()
