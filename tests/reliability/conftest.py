"""Fixtures for the fault tests: real Triton, real gateway subprocesses, real redis-server.

Everything binds 127.0.0.1 on free ports and is stopped at the end of its scope. The processes are
started with the same helpers as the gateway's own tests (``tests/_gateway_procs.py``) and the same
tiny repository (``tests/gateway/_tiny_repo.py``: ``tiny_linear`` answers in about a millisecond,
``slow_echo`` sleeps ``DELAY_MS`` first).

- ``rel_triton``: a Triton of our own serving the tiny repository (module scope, so a test that
  kills it or leaves ``slow_echo`` sleeping cannot disturb the next module).
- ``gateways``: ``factory(triton_http_url, **settings) -> GatewayProcess``; all stopped at the end.
- ``make_key``: ``make_key(gateway, tier="unlimited", scopes=None) -> (headers, created)``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from _gateway_procs import ADMIN_TOKEN, GatewayProcess, start_gateway

from serving.launcher import TritonPorts, TritonServer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))
from _tiny_repo import build_tiny_repository  # noqa: E402  (the gateway tests' repository, shared)

#: tiers the fault tests use, on top of the shared test tiers
RELIABILITY_TIERS = {
    "free": {"per_minute": 10, "burst": 5},
    "unlimited": {"per_minute": 60_000_000, "burst": 1_000_000},
    # 10/s sustained: a closed loop of a few workers is mostly refused, so "limits hold" is visible
    "limited": {"per_minute": 600, "burst": 5},
}

GatewayFactory = Callable[..., GatewayProcess]


@pytest.fixture(scope="module")
def rel_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_repository(tmp_path_factory.mktemp("rel-repository"))


@pytest.fixture(scope="module")
def rel_triton(rel_repository: Path) -> Iterator[TritonServer]:
    """A Triton of this module's own (tiny_linear + slow_echo)."""
    server = TritonServer(rel_repository, ports=TritonPorts.free())
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayFactory]:
    started: list[GatewayProcess] = []

    def factory(triton_http_url: str, **settings: object) -> GatewayProcess:
        settings.setdefault("tier_limits", RELIABILITY_TIERS)
        gateway = start_gateway(tmp_path_factory.mktemp("rel-gateway"), triton_http_url, **settings)
        started.append(gateway)
        return gateway

    yield factory
    for gateway in started:
        gateway.stop()


def create_key(
    gateway: GatewayProcess, tier: str = "unlimited", scopes: list[str] | None = None, name: str = "rel"
) -> tuple[dict[str, str], dict[str, object]]:
    """Create an API key through the admin API; returns ``(auth headers, created key document)``."""
    response = httpx.post(
        f"{gateway.url}/admin/keys",
        json={"name": name, "scopes": scopes or ["*"], "tier": tier},
        headers={"X-Admin-Token": ADMIN_TOKEN},
        timeout=10,
    )
    assert response.status_code == 201, response.text
    created = response.json()
    return {"Authorization": f"Bearer {created['api_key']}"}, created


@pytest.fixture
def make_key() -> Callable[..., tuple[dict[str, str], dict[str, object]]]:
    return create_key
